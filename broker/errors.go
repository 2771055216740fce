package broker

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bushost/bushost/internal/errdefs"
)

// Kinds of refusal. Callers decide on them with errors.Is; the message of
// the error itself names the cause in words a user can act on.
var (
	ErrUnauthenticated = errors.New("unauthenticated")
	ErrPermission      = errors.New("permission denied")
	ErrInvalid         = errors.New("invalid argument")
	ErrTooLarge        = errors.New("too large")
	ErrNotFound        = errors.New("not found")
	ErrClosed          = errors.New("task closed")
	ErrStale           = errors.New("stale review")
	ErrGate            = errors.New("close gate refused")
	ErrPrecondition    = errors.New("failed precondition")
	ErrConflict        = errors.New("already exists")
)

// ruleError is a refusal: its message is the whole story, its kind decides
// the status code.
type ruleError struct {
	kind error
	msg  string
}

func (e *ruleError) Error() string { return e.msg }
func (e *ruleError) Unwrap() error { return e.kind }

func refuse(kind error, format string, a ...any) error {
	return &ruleError{kind: kind, msg: fmt.Sprintf(format, a...)}
}

// toStatus is the one place where broker errors become gRPC status codes,
// for BrokerService and for authz.Authority alike.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if _, ok := errdefs.As(err); ok {
		return errdefs.ToGRPC(err)
	}
	code := codes.Internal
	switch {
	case errors.Is(err, ErrUnauthenticated):
		code = codes.Unauthenticated
	case errors.Is(err, ErrPermission):
		code = codes.PermissionDenied
	case errors.Is(err, ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, ErrTooLarge):
		code = codes.ResourceExhausted
	case errors.Is(err, ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, ErrClosed), errors.Is(err, ErrStale), errors.Is(err, ErrGate), errors.Is(err, ErrPrecondition):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrConflict):
		code = codes.AlreadyExists
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, errClosedBroker):
		code = codes.Unavailable
	}
	return status.Error(code, err.Error())
}
