package errdefs

// Every reason the server (or the client, for its own refusals) can give.
// Each is listed in docs/errors.md with its code, exit status and what the
// user should do; a test keeps the two lists equal. Add a reason here and a
// row there together.
const (
	// Generic outcomes ToGRPC and FromGRPC fill in.
	InternalError   Reason = "INTERNAL"
	Canceled        Reason = "CANCELED"
	DeadlineReached Reason = "DEADLINE_EXCEEDED"
	Unreachable     Reason = "UNREACHABLE"
	ShuttingDown    Reason = "SHUTTING_DOWN"

	// Identity and capabilities.
	TokenMissing      Reason = "TOKEN_MISSING"
	TokenUnknown      Reason = "TOKEN_UNKNOWN"
	TokenExpired      Reason = "TOKEN_EXPIRED"
	GrantRevoked      Reason = "GRANT_REVOKED"
	CapabilityMissing Reason = "CAPABILITY_MISSING"
	HostOnly          Reason = "HOST_ONLY"
	OtherTask         Reason = "OTHER_TASK"

	// Input.
	NameInvalid     Reason = "NAME_INVALID"
	ObjectIDInvalid Reason = "OBJECT_ID_INVALID"
	ArgumentInvalid Reason = "ARGUMENT_INVALID"
	BundleInvalid   Reason = "BUNDLE_INVALID"
	PackInvalid     Reason = "PACK_INVALID"
	FsckFailed      Reason = "FSCK_FAILED"

	// Things that are not there.
	ProjectNotFound Reason = "PROJECT_NOT_FOUND"
	TaskNotFound    Reason = "TASK_NOT_FOUND"
	PushNotFound    Reason = "PUSH_NOT_FOUND"

	// Rules.
	NonFastForward      Reason = "NON_FAST_FORWARD"
	UnrelatedHistory    Reason = "UNRELATED_HISTORY"
	PrerequisiteMissing Reason = "PREREQUISITE_MISSING"
	TaskClosed          Reason = "TASK_CLOSED"
	ReviewStale         Reason = "REVIEW_STALE"
	GateNoApproval      Reason = "GATE_NO_APPROVAL"
	SelfReview          Reason = "SELF_REVIEW"
	ProjectOnOtherHost  Reason = "PROJECT_ON_OTHER_HOST"
	RefChanged          Reason = "REF_CHANGED"
	TaskNeedsRepair     Reason = "TASK_NEEDS_REPAIR"
	RepoNotTopLevel     Reason = "REPO_NOT_TOP_LEVEL"

	// The host's own files (internal/safepath).
	PathUnsafe Reason = "PATH_UNSAFE"

	// Outcomes the server could not learn.
	CommitUnknown Reason = "COMMIT_UNKNOWN"

	// Limits.
	BundleTooLarge Reason = "BUNDLE_TOO_LARGE"
	DiskFull       Reason = "DISK_FULL"
	PushIdle       Reason = "PUSH_IDLE"
	TooManyConns   Reason = "TOO_MANY_CONNECTIONS"
	TooManyCalls   Reason = "TOO_MANY_CALLS"
)
