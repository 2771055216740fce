// Package errdefs is bushost's one error vocabulary. A refusal or failure
// is an *Error carrying a gRPC code and a stable UPPER_SNAKE reason (the
// constants in reasons.go, each listed in docs/errors.md), plus metadata a
// client can act on (the limit, the size, the conflicting commit).
//
// The server builds its refusals here and turns them into a gRPC status in
// one place, ToGRPC, which attaches a google.rpc.ErrorInfo detail (domain
// bushost.dev). The client reads them back with FromGRPC and picks its exit
// status with ExitCode; it branches on the reason, never on the message.
// Nothing here decides a rule: it only names the outcome.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/bushost/bushost/internal/safepath"
)

// Domain is the ErrorInfo domain of every bushost reason.
const Domain = "bushost.dev"

// Reason is a stable, machine-readable cause. Clients and scripts branch on
// it; its words never change once released.
type Reason string

// Error is one refusal or failure: what the client sees as status code,
// reason, message and metadata.
type Error struct {
	Code   codes.Code
	Reason Reason
	// Message names the cause in words a user can act on.
	Message string
	// Metadata holds the facts behind the refusal (limit, size, commit...).
	Metadata map[string]string
	// RetryAfter, when set, tells a client when a retry may succeed; it is
	// sent as a google.rpc.RetryInfo detail and as metadata "retry_after".
	RetryAfter time.Duration
	cause      error
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the cause given to Wrap, so errors.Is still finds it.
func (e *Error) Unwrap() error { return e.cause }

// New returns an Error with code, reason and a formatted message.
func New(code codes.Code, reason Reason, format string, a ...any) *Error {
	return &Error{Code: code, Reason: reason, Message: fmt.Sprintf(format, a...)}
}

// With adds one metadata entry and returns e, for chaining.
func (e *Error) With(key string, value any) *Error {
	if e.Metadata == nil {
		e.Metadata = map[string]string{}
	}
	e.Metadata[key] = fmt.Sprint(value)
	return e
}

// Wrap records cause (for errors.Is/As on the server and for logs) and
// returns e; the message sent to the client stays e.Message.
func (e *Error) Wrap(cause error) *Error {
	e.cause = cause
	return e
}

// Retry sets RetryAfter and returns e.
func (e *Error) Retry(after time.Duration) *Error {
	e.RetryAfter = after
	return e
}

// Shorthands for the codes bushost uses.

func InvalidArgument(r Reason, format string, a ...any) *Error {
	return New(codes.InvalidArgument, r, format, a...)
}
func NotFound(r Reason, format string, a ...any) *Error { return New(codes.NotFound, r, format, a...) }
func FailedPrecondition(r Reason, format string, a ...any) *Error {
	return New(codes.FailedPrecondition, r, format, a...)
}
func PermissionDenied(r Reason, format string, a ...any) *Error {
	return New(codes.PermissionDenied, r, format, a...)
}
func Unauthenticated(r Reason, format string, a ...any) *Error {
	return New(codes.Unauthenticated, r, format, a...)
}
func ResourceExhausted(r Reason, format string, a ...any) *Error {
	return New(codes.ResourceExhausted, r, format, a...)
}
func AlreadyExists(r Reason, format string, a ...any) *Error {
	return New(codes.AlreadyExists, r, format, a...)
}
func Aborted(r Reason, format string, a ...any) *Error { return New(codes.Aborted, r, format, a...) }
func Unavailable(r Reason, format string, a ...any) *Error {
	return New(codes.Unavailable, r, format, a...)
}
func DeadlineExceeded(r Reason, format string, a ...any) *Error {
	return New(codes.DeadlineExceeded, r, format, a...)
}
func Internal(r Reason, format string, a ...any) *Error { return New(codes.Internal, r, format, a...) }

// As returns the *Error in err's chain, if any. A refusal of
// internal/safepath (which knows no transport) becomes FailedPrecondition
// with its reason and the path and owner as metadata.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	var p *safepath.Error
	if errors.As(err, &p) {
		return New(codes.FailedPrecondition, Reason(p.Reason), "%s", err.Error()).
			With("path", p.Path).With("owner", p.Owner).With("mode", p.Mode.String()).Wrap(err), true
	}
	return nil, false
}

// ReasonOf returns the reason of the *Error in err's chain, or "".
func ReasonOf(err error) Reason {
	if e, ok := As(err); ok {
		return e.Reason
	}
	return ""
}

// ToGRPC is the one place where a server error becomes a gRPC status. An
// *Error keeps its code, reason and metadata; a context error becomes
// Canceled or DeadlineExceeded; an error that already is a status passes
// through; anything else is Internal with reason INTERNAL.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	e, ok := As(err)
	if !ok {
		switch {
		case errors.Is(err, context.Canceled):
			e = New(codes.Canceled, Canceled, "%s", err.Error())
		case errors.Is(err, context.DeadlineExceeded):
			e = New(codes.DeadlineExceeded, DeadlineReached, "%s", err.Error())
		default:
			if s, isStatus := status.FromError(err); isStatus {
				return s.Err()
			}
			e = New(codes.Internal, InternalError, "%s", err.Error())
		}
	}
	st := status.New(e.Code, e.Message)
	md := maps.Clone(e.Metadata)
	if e.RetryAfter > 0 {
		if md == nil {
			md = map[string]string{}
		}
		md["retry_after"] = e.RetryAfter.String()
	}
	info := &errdetails.ErrorInfo{Domain: Domain, Reason: string(e.Reason), Metadata: md}
	var withDetails *status.Status
	var derr error
	if e.RetryAfter > 0 {
		withDetails, derr = st.WithDetails(info, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	} else {
		withDetails, derr = st.WithDetails(info)
	}
	if derr != nil {
		return st.Err()
	}
	return withDetails.Err()
}

// FromGRPC reads a status error back into an *Error: the code, the
// message, and the reason and metadata of a bushost ErrorInfo detail. An
// error that is no status (the connection failed before any call) comes
// back as Unavailable with reason UNREACHABLE.
func FromGRPC(err error) *Error {
	if err == nil {
		return nil
	}
	if e, ok := As(err); ok {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		return &Error{Code: codes.Unavailable, Reason: Unreachable, Message: err.Error(), cause: err}
	}
	e := &Error{Code: st.Code(), Message: st.Message(), cause: err}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == Domain {
				e.Reason = Reason(d.GetReason())
				e.Metadata = d.GetMetadata()
			}
		case *errdetails.RetryInfo:
			e.RetryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return e
}
