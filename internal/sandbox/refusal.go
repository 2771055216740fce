package sandbox

import "fmt"

// Refusal is one of the sandbox's own refusals, with its reason from the
// project's one vocabulary (internal/errdefs/reasons.go and
// docs/errors.md; a test keeps the strings equal) and the exit status the
// command line gives it there. The package does not import errdefs: that
// would link gRPC and protobuf into this binary, whose package inits then
// run in every session's pid 1 and nearly double its start.
type Refusal struct {
	Reason  string
	Message string
	Exit    int
}

func (r *Refusal) Error() string { return r.Message }

// The reasons the sandbox gives, each equal to its errdefs constant.
const (
	ReasonArgumentInvalid       = "ARGUMENT_INVALID"
	ReasonRunDirNotEmpty        = "RUN_DIR_NOT_EMPTY"
	ReasonLimitUnavailable      = "LIMIT_UNAVAILABLE"
	ReasonAbstractScopeMissing  = "ABSTRACT_SCOPE_MISSING"
	ReasonSessionUIDsExhausted  = "SESSION_UIDS_EXHAUSTED"
	ReasonEgressDenied          = "EGRESS_DENIED"
	ReasonEgressConnections     = "EGRESS_CONNECTIONS_EXHAUSTED"
	ReasonEgressUnrecorded      = "EGRESS_UNRECORDED"
	ReasonLaunchingSessionEnded = "LAUNCHING_SESSION_ENDED"
)

// Exit statuses of the classes docs/errors.md lists.
const (
	exitRefused  = 1
	exitConflict = 5
	exitInvalid  = 6
	exitLimit    = 7
)

func refuse(reason string, exit int, format string, a ...any) *Refusal {
	return &Refusal{Reason: reason, Message: fmt.Sprintf(format, a...), Exit: exit}
}
