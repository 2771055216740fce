package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/safepath"
)

func TestChain(t *testing.T) {
	cause := errors.New("disk on fire")
	err := fmt.Errorf("push t1: %w", ResourceExhausted(BundleTooLarge, "bundle is %d bytes, over the limit of %d", 10, 5).
		With("limit", 5).With("size", 10).Retry(2*time.Second).Wrap(cause))
	if !errors.Is(err, cause) || ReasonOf(err) != BundleTooLarge {
		t.Fatalf("chain lost: %v", err)
	}
	e := Of(err)
	if e.Kind != KindResourceExhausted || e.Metadata["limit"] != "5" || e.Metadata["size"] != "10" || e.RetryAfter != 2*time.Second ||
		e.Message != "bundle is 10 bytes, over the limit of 5" {
		t.Fatalf("Of: %+v", e)
	}
	if got := ExitCode(err); got != ExitLimit {
		t.Fatalf("exit %d", got)
	}
}

func TestOfFallbacks(t *testing.T) {
	for _, tc := range []struct {
		err    error
		kind   Kind
		reason Reason
		exit   int
	}{
		{context.Canceled, KindCanceled, Canceled, ExitUnreachable},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), KindDeadlineExceeded, DeadlineReached, ExitUnreachable},
		{errors.New("boom"), KindInternal, InternalError, ExitHostFailed},
		{FailedPrecondition(NonFastForward, "nff"), KindFailedPrecondition, NonFastForward, ExitConflict},
		{FailedPrecondition(TaskClosed, "closed"), KindFailedPrecondition, TaskClosed, ExitRefused},
		{New(KindUnknown, LocalFailed, "local"), KindUnknown, LocalFailed, ExitRefused},
	} {
		e := Of(tc.err)
		if e.Kind != tc.kind || e.Reason != tc.reason || e.Message != tc.err.Error() || ExitCode(tc.err) != tc.exit {
			t.Errorf("%v: got %v %q %q exit %d", tc.err, e.Kind, e.Reason, e.Message, ExitCode(tc.err))
		}
	}
	if ExitCode(nil) != 0 || Of(nil) != nil {
		t.Fatal("nil")
	}
}

// classified is a typed error of another package that names its kind and
// reason, as gitd/bundle's do.
type classified struct{}

func (classified) Error() string    { return "bad pack: truncated" }
func (classified) Classify() *Error { return InvalidArgument(PackInvalid, "bad pack").With("entry", 3) }

func TestClassifier(t *testing.T) {
	err := fmt.Errorf("push t1: %w", classified{})
	e, ok := As(err)
	if !ok || e.Kind != KindInvalidArgument || e.Reason != PackInvalid || e.Metadata["entry"] != "3" ||
		e.Message != "push t1: bad pack: truncated" || !errors.Is(e, classified{}) {
		t.Fatalf("As(%v) = %+v, %v", err, e, ok)
	}
	// An *Error in the chain wins over a Classifier below it.
	outer := FailedPrecondition(TaskClosed, "closed").Wrap(classified{})
	if ReasonOf(outer) != TaskClosed {
		t.Fatalf("ReasonOf(outer) = %s", ReasonOf(outer))
	}
}

// TestSafepathReasons keeps internal/safepath's transport-free reasons
// equal to the constants here, and its refusals mapped to
// FailedPrecondition (exit 1).
func TestSafepathReasons(t *testing.T) {
	for got, want := range map[string]Reason{safepath.ReasonUnsafe: PathUnsafe, safepath.ReasonChanged: PathChanged} {
		if got != string(want) {
			t.Errorf("safepath reason %s, errdefs %s", got, want)
		}
	}
	err := fmt.Errorf("home: %w", &safepath.Error{Reason: safepath.ReasonChanged, Path: "/x", Owner: 7, Msg: "/x changed"})
	e, ok := As(err)
	if !ok || e.Reason != PathChanged || e.Metadata["path"] != "/x" || e.Metadata["owner"] != "7" || ExitCode(err) != ExitRefused {
		t.Errorf("As(%v) = %+v, %v", err, e, ok)
	}
}

func TestKindNames(t *testing.T) {
	seen := map[string]bool{}
	for k := KindOK; k <= KindUnauthenticated; k++ {
		n := k.String()
		if n == "" || seen[n] {
			t.Errorf("kind %d: name %q empty or repeated", int(k), n)
		}
		seen[n] = true
	}
	if Kind(99).String() != "Kind(99)" {
		t.Errorf("unknown kind prints %q", Kind(99).String())
	}
}
