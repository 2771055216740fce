package errdefs

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bushost/bushost/internal/safepath"
)

func TestRoundTrip(t *testing.T) {
	cause := errors.New("disk on fire")
	err := fmt.Errorf("push t1: %w", ResourceExhausted(BundleTooLarge, "bundle is %d bytes, over the limit of %d", 10, 5).
		With("limit", 5).With("size", 10).Retry(2*time.Second).Wrap(cause))
	if !errors.Is(err, cause) || ReasonOf(err) != BundleTooLarge {
		t.Fatalf("chain lost: %v", err)
	}
	back := FromGRPC(ToGRPC(err))
	if back.Code != codes.ResourceExhausted || back.Reason != BundleTooLarge ||
		back.Metadata["limit"] != "5" || back.Metadata["size"] != "10" || back.RetryAfter != 2*time.Second ||
		back.Message != "bundle is 10 bytes, over the limit of 5" {
		t.Fatalf("round trip: %+v", back)
	}
	if got := ExitCode(ToGRPC(err)); got != ExitLimit {
		t.Fatalf("exit %d", got)
	}
}

func TestToGRPCFallbacks(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   codes.Code
		reason Reason
		exit   int
	}{
		{context.Canceled, codes.Canceled, Canceled, ExitUnreachable},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), codes.DeadlineExceeded, DeadlineReached, ExitUnreachable},
		{errors.New("boom"), codes.Internal, InternalError, ExitHostFailed},
		{status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied, "", ExitDenied},
		{FailedPrecondition(NonFastForward, "nff"), codes.FailedPrecondition, NonFastForward, ExitConflict},
		{FailedPrecondition(TaskClosed, "closed"), codes.FailedPrecondition, TaskClosed, ExitRefused},
	} {
		back := FromGRPC(ToGRPC(tc.err))
		if back.Code != tc.code || back.Reason != tc.reason || ExitCode(ToGRPC(tc.err)) != tc.exit {
			t.Errorf("%v: got %v %q exit %d", tc.err, back.Code, back.Reason, ExitCode(ToGRPC(tc.err)))
		}
	}
	if e := FromGRPC(errors.New("dial unix: no such file")); e.Code != codes.Unavailable || ExitCode(e) != ExitUnreachable {
		t.Fatalf("non-status error: %+v", e)
	}
	if ExitCode(nil) != 0 || ToGRPC(nil) != nil || FromGRPC(nil) != nil {
		t.Fatal("nil")
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
	if !ok || e.Reason != PathChanged || e.Metadata["path"] != "/x" || e.Metadata["owner"] != "7" || ExitCode(ToGRPC(err)) != ExitRefused {
		t.Errorf("As(%v) = %+v, %v", err, e, ok)
	}
}
