package gitd

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
)

// Sentinel errors a caller decides on. Errors from gitd wrap one of them
// with the cause in words ("non-fast-forward: ...").
var (
	// ErrInvalid is a malformed request: a bad name, object id or bundle.
	ErrInvalid = errors.New("invalid")
	// ErrNotFound is a project that was never added, or a task with no push.
	ErrNotFound = errors.New("not found")
	// ErrNonFastForward is a push whose commit does not descend from the
	// task's current refs/work/<task>, or a sync that would rewrite main.
	ErrNonFastForward = errors.New("non-fast-forward")
	// ErrUnrelated is a commit that shares no history with main.
	ErrUnrelated = errors.New("unrelated history")
	// ErrMissingPrerequisite is a bundle built against a commit the
	// repository does not have.
	ErrMissingPrerequisite = errors.New("missing prerequisite")
	// ErrTooLarge is a bundle past Options.MaxBundleBytes.
	ErrTooLarge = errors.New("bundle too large")
	// ErrIdle is a push stream that sent nothing for Options.IdleTimeout.
	ErrIdle = errors.New("push stream idle")
	// ErrChanged is a ref that moved under a request that read it.
	ErrChanged = errors.New("ref changed concurrently")
)

// toStatus is the one place that turns gitd's errors into gRPC status
// codes. Errors that already carry a status (the Authority's) pass through.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errdefs.As(err); ok {
		return errdefs.ToGRPC(err)
	}
	var fe *bundle.FormatError
	var fsck *bundle.FsckError
	var pe *bundle.PackError
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalid), errors.As(err, &fe), errors.As(err, &fsck), errors.As(err, &pe):
		code = codes.InvalidArgument
	case errors.Is(err, ErrTooLarge), errors.Is(err, bundle.ErrNoSpace):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrNonFastForward), errors.Is(err, ErrUnrelated), errors.Is(err, ErrMissingPrerequisite):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrChanged):
		code = codes.Aborted
	case errors.Is(err, ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrIdle), errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	default:
		if s, ok := status.FromError(err); ok {
			return s.Err()
		}
	}
	return status.Error(code, err.Error())
}
