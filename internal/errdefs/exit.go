package errdefs

import "google.golang.org/grpc/codes"

// Exit statuses of the command-line tools, by class (docs/errors.md).
const (
	ExitOK          = 0
	ExitRefused     = 1 // refused by a rule
	ExitUsage       = 2 // the client's own flag and argument errors
	ExitUnreachable = 3 // no bus host serving, or it did not answer in time
	ExitDenied      = 4 // not authenticated or not permitted
	ExitConflict    = 5 // conflict or stale
	ExitInvalid     = 6 // invalid input
	ExitLimit       = 7 // a limit was hit
	ExitHostFailed  = 8 // the bus host failed
)

// exitByCode is the one table from a gRPC code to an exit status.
var exitByCode = map[codes.Code]int{
	codes.OK:                 ExitOK,
	codes.FailedPrecondition: ExitRefused,
	codes.Canceled:           ExitUnreachable,
	codes.Unavailable:        ExitUnreachable,
	codes.DeadlineExceeded:   ExitUnreachable,
	codes.Unauthenticated:    ExitDenied,
	codes.PermissionDenied:   ExitDenied,
	codes.Aborted:            ExitConflict,
	codes.AlreadyExists:      ExitConflict,
	codes.InvalidArgument:    ExitInvalid,
	codes.NotFound:           ExitInvalid,
	codes.OutOfRange:         ExitInvalid,
	codes.ResourceExhausted:  ExitLimit,
	codes.Internal:           ExitHostFailed,
	codes.Unknown:            ExitHostFailed,
	codes.DataLoss:           ExitHostFailed,
	codes.Unimplemented:      ExitHostFailed,
}

// exitByReason overrides the code's class for the reasons that say a
// conflict or a stale view although their code is FailedPrecondition, and
// for the client's own outcomes (a malformed command line; a local step
// that failed), which no server code describes.
var exitByReason = map[Reason]int{
	NonFastForward:     ExitConflict,
	ReviewStale:        ExitConflict,
	ProjectOnOtherHost: ExitConflict,
	ExportStale:        ExitConflict,
	Usage:              ExitUsage,
	LocalFailed:        ExitRefused,
}

// ExitCode returns the exit status for err: 0 for nil, else by reason where
// the table says so, else by code (an error that is no status counts as an
// unreachable bus host).
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	e := FromGRPC(err)
	if x, ok := exitByReason[e.Reason]; ok {
		return x
	}
	if x, ok := exitByCode[e.Code]; ok {
		return x
	}
	return ExitHostFailed
}

// ExitStatus is e's exit status by ExitCode's table; packages that may not
// import this one (internal/cmdline) find it through this method.
func (e *Error) ExitStatus() int { return ExitCode(e) }
