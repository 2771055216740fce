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

	// A verdict names the commit its reviewer saw (issue 13).
	VerdictCommitMissing  Reason = "VERDICT_COMMIT_MISSING"
	VerdictCommitMismatch Reason = "VERDICT_COMMIT_MISMATCH"

	// The log and its checkpoint file (issue 13).
	LogCheckpointMismatch Reason = "LOG_CHECKPOINT_MISMATCH"
	LogCheckpointAppend   Reason = "LOG_CHECKPOINT_APPEND_FAILED"

	// What git 2.39 lets through but newer git, or a checkout, fears
	// (issue 13; the rules and their sources are in gitd/beyondgit.go).
	GitmodulesControlChar Reason = "GITMODULES_CONTROL_CHAR"
	DotfileSymlink        Reason = "DOTFILE_SYMLINK"
	SubmoduleNameNested   Reason = "SUBMODULE_NAME_NESTED"
	SubmodulePathEscapes  Reason = "SUBMODULE_PATH_ESCAPES"
	SubmodulePathTrailing Reason = "SUBMODULE_PATH_TRAILING"
	TreeEntryNameTooLong  Reason = "TREE_ENTRY_NAME_TOO_LONG"
	TreeEntryMode         Reason = "TREE_ENTRY_MODE"
	GitmodulesParse       Reason = "GITMODULES_PARSE"
	GitmodulesURL         Reason = "GITMODULES_URL"
	GitmodulesGitlink     Reason = "GITMODULES_GITLINK"
	PackTrailingBytes     Reason = "PACK_TRAILING_BYTES"
	BundleRefNotCommit    Reason = "BUNDLE_REF_NOT_COMMIT"

	// Limits.
	BundleTooLarge Reason = "BUNDLE_TOO_LARGE"
	DiskFull       Reason = "DISK_FULL"
	PushIdle       Reason = "PUSH_IDLE"
	TooManyConns   Reason = "TOO_MANY_CONNECTIONS"
	TooManyCalls   Reason = "TOO_MANY_CALLS"
)
