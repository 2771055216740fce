// Package errdefs is bushost's one error vocabulary. A refusal or failure
// is an *Error carrying a Kind (the class of outcome: not found, refused
// by a rule, a limit hit...) and a stable UPPER_SNAKE reason (the
// constants in reasons.go, each listed in docs/errors.md), plus metadata a
// client can act on (the limit, the size, the conflicting commit) and, for
// a retryable outcome, when to retry.
//
// The package knows no transport: internal/grpcerr carries an *Error over
// gRPC (its server interceptors send what a handler returns, its client
// interceptors give the caller an *Error back), and ExitCode turns one into
// the exit status of the command-line tools. A client branches on the
// reason, never on the message. Nothing here decides a rule: it only names
// the outcome.
package errdefs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/bushost/bushost/internal/safepath"
)

// Domain is the domain of every bushost reason (gRPC's ErrorInfo carries
// it beside the reason).
const Domain = "bushost.dev"

// Reason is a stable, machine-readable cause. Clients and scripts branch on
// it; its words never change once released.
type Reason string

// Kind is the class of an outcome. The kinds and their names are gRPC's
// status codes (internal/grpcerr maps one to the other, a test keeps them
// equal), so a Kind prints as the code a gRPC client sees.
type Kind int

// The kinds, in gRPC's order: KindOK to KindUnauthenticated.
const (
	KindOK Kind = iota
	KindCanceled
	KindUnknown
	KindInvalidArgument
	KindDeadlineExceeded
	KindNotFound
	KindAlreadyExists
	KindPermissionDenied
	KindResourceExhausted
	KindFailedPrecondition
	KindAborted
	KindOutOfRange
	KindUnimplemented
	KindInternal
	KindUnavailable
	KindDataLoss
	KindUnauthenticated
)

var kindNames = [...]string{
	KindOK:                 "OK",
	KindCanceled:           "Canceled",
	KindUnknown:            "Unknown",
	KindInvalidArgument:    "InvalidArgument",
	KindDeadlineExceeded:   "DeadlineExceeded",
	KindNotFound:           "NotFound",
	KindAlreadyExists:      "AlreadyExists",
	KindPermissionDenied:   "PermissionDenied",
	KindResourceExhausted:  "ResourceExhausted",
	KindFailedPrecondition: "FailedPrecondition",
	KindAborted:            "Aborted",
	KindOutOfRange:         "OutOfRange",
	KindUnimplemented:      "Unimplemented",
	KindInternal:           "Internal",
	KindUnavailable:        "Unavailable",
	KindDataLoss:           "DataLoss",
	KindUnauthenticated:    "Unauthenticated",
}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is one refusal or failure: what the client sees as kind, reason,
// message and metadata.
type Error struct {
	Kind   Kind
	Reason Reason
	// Message names the cause in words a user can act on.
	Message string
	// Metadata holds the facts behind the refusal (limit, size, commit...).
	Metadata map[string]string
	// RetryAfter, when set, tells a client when a retry may succeed; over
	// gRPC it is sent as a google.rpc.RetryInfo detail and as metadata
	// "retry_after".
	RetryAfter time.Duration
	cause      error
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the cause given to Wrap, so errors.Is still finds it.
func (e *Error) Unwrap() error { return e.cause }

// New returns an Error with kind, reason and a formatted message.
func New(kind Kind, reason Reason, format string, a ...any) *Error {
	return &Error{Kind: kind, Reason: reason, Message: fmt.Sprintf(format, a...)}
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

// WireMetadata is e's metadata as a client is sent it: a copy, with the
// retry hint as "retry_after" when e has one.
func (e *Error) WireMetadata() map[string]string {
	md := maps.Clone(e.Metadata)
	if md == nil {
		md = map[string]string{}
	}
	if e.RetryAfter > 0 {
		md["retry_after"] = e.RetryAfter.String()
	}
	return md
}

// Retry sets RetryAfter and returns e.
func (e *Error) Retry(after time.Duration) *Error {
	e.RetryAfter = after
	return e
}

// Shorthands for the kinds bushost uses.

func InvalidArgument(r Reason, format string, a ...any) *Error {
	return New(KindInvalidArgument, r, format, a...)
}
func NotFound(r Reason, format string, a ...any) *Error { return New(KindNotFound, r, format, a...) }
func FailedPrecondition(r Reason, format string, a ...any) *Error {
	return New(KindFailedPrecondition, r, format, a...)
}
func PermissionDenied(r Reason, format string, a ...any) *Error {
	return New(KindPermissionDenied, r, format, a...)
}
func Unauthenticated(r Reason, format string, a ...any) *Error {
	return New(KindUnauthenticated, r, format, a...)
}
func ResourceExhausted(r Reason, format string, a ...any) *Error {
	return New(KindResourceExhausted, r, format, a...)
}
func AlreadyExists(r Reason, format string, a ...any) *Error {
	return New(KindAlreadyExists, r, format, a...)
}
func Aborted(r Reason, format string, a ...any) *Error { return New(KindAborted, r, format, a...) }
func Unavailable(r Reason, format string, a ...any) *Error {
	return New(KindUnavailable, r, format, a...)
}
func DeadlineExceeded(r Reason, format string, a ...any) *Error {
	return New(KindDeadlineExceeded, r, format, a...)
}
func Internal(r Reason, format string, a ...any) *Error { return New(KindInternal, r, format, a...) }

// Classifier is a typed error of a package that keeps its own error types
// (so that callers can still errors.As them) and knows their kind and
// reason: As gives it the *Error that Classify returns.
type Classifier interface {
	error
	Classify() *Error
}

// As returns the *Error in err's chain, if any. A Classifier in the chain
// becomes the *Error it names, with the whole chain's text as its message.
// A refusal of internal/safepath (which may not import this package)
// becomes FailedPrecondition with its reason and the path and owner as
// metadata.
func As(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	var c Classifier
	if errors.As(err, &c) {
		e := c.Classify()
		e.Message = err.Error()
		return e.Wrap(err), true
	}
	var p *safepath.Error
	if errors.As(err, &p) {
		return New(KindFailedPrecondition, Reason(p.Reason), "%s", err.Error()).
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

// Of returns err as an *Error, as a client would be told it: the *Error in
// its chain (As); a context error as Canceled or DeadlineExceeded; a
// fault of the broker's store (storeFault: a database stopped, restarting
// or unreachable, a session it cut) as Unavailable with reason
// STORE_UNAVAILABLE and a retry hint, whichever call met it; anything else
// as Internal with reason INTERNAL. Of(nil) is nil.
func Of(err error) *Error {
	if err == nil {
		return nil
	}
	if e, ok := As(err); ok {
		return e
	}
	switch {
	case errors.Is(err, context.Canceled):
		return New(KindCanceled, Canceled, "%s", err.Error()).Wrap(err)
	case errors.Is(err, context.DeadlineExceeded):
		return New(KindDeadlineExceeded, DeadlineReached, "%s", err.Error()).Wrap(err)
	}
	if e := storeFault(err); e != nil {
		return e
	}
	return New(KindInternal, InternalError, "%s", err.Error()).Wrap(err)
}
