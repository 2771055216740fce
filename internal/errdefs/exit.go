package errdefs

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

// exitByKind is the one table from a kind to an exit status.
var exitByKind = map[Kind]int{
	KindOK:                 ExitOK,
	KindFailedPrecondition: ExitRefused,
	KindCanceled:           ExitUnreachable,
	KindUnavailable:        ExitUnreachable,
	KindDeadlineExceeded:   ExitUnreachable,
	KindUnauthenticated:    ExitDenied,
	KindPermissionDenied:   ExitDenied,
	KindAborted:            ExitConflict,
	KindAlreadyExists:      ExitConflict,
	KindInvalidArgument:    ExitInvalid,
	KindNotFound:           ExitInvalid,
	KindOutOfRange:         ExitInvalid,
	KindResourceExhausted:  ExitLimit,
	KindInternal:           ExitHostFailed,
	KindUnknown:            ExitHostFailed,
	KindDataLoss:           ExitHostFailed,
	KindUnimplemented:      ExitHostFailed,
}

// exitByReason overrides the kind's class for the reasons that say a
// conflict or a stale view although their kind is FailedPrecondition, and
// for the client's own outcomes (a malformed command line; a local step
// that failed), which no server's kind describes.
var exitByReason = map[Reason]int{
	NonFastForward:     ExitConflict,
	ReviewStale:        ExitConflict,
	ProjectOnOtherHost: ExitConflict,
	ExportStale:        ExitConflict,
	Usage:              ExitUsage,
	LocalFailed:        ExitRefused,
}

// ExitCode returns the exit status for err: 0 for nil, else by reason where
// the table says so, else by kind; an error that is no *Error counts as
// what Of makes of it.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	e := Of(err)
	if x, ok := exitByReason[e.Reason]; ok {
		return x
	}
	if x, ok := exitByKind[e.Kind]; ok {
		return x
	}
	return ExitHostFailed
}

// ExitStatus is e's exit status by ExitCode's table; packages that may not
// import this one (internal/cmdline) find it through this method.
func (e *Error) ExitStatus() int { return ExitCode(e) }
