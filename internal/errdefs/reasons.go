package errdefs

// Every reason the server (or the client, for its own refusals) can give.
// Each is listed in docs/errors.md with its code, exit status and what the
// user should do; a test keeps the two lists equal. Add a reason here and a
// row there together.
const (
	// Generic outcomes Of and internal/grpcerr fill in.
	InternalError   Reason = "INTERNAL"
	Canceled        Reason = "CANCELED"
	DeadlineReached Reason = "DEADLINE_EXCEEDED"
	Unreachable     Reason = "UNREACHABLE"
	ShuttingDown    Reason = "SHUTTING_DOWN"
	// The broker's database is stopped, restarting, unreachable, or cut
	// the call's session (Of, fault.go).
	StoreUnavailable Reason = "STORE_UNAVAILABLE"

	// The client's own outcomes, decided before or without a call.
	Usage         Reason = "USAGE"
	LocalFailed   Reason = "LOCAL_FAILED"
	NothingToPush Reason = "NOTHING_TO_PUSH"
	NoBase        Reason = "NO_BASE"

	// The daemon's start.
	HomeInUse Reason = "HOME_IN_USE"

	// Identity and capabilities.
	TokenMissing      Reason = "TOKEN_MISSING"
	TokenUnknown      Reason = "TOKEN_UNKNOWN"
	TokenExpired      Reason = "TOKEN_EXPIRED"
	GrantRevoked      Reason = "GRANT_REVOKED"
	CapabilityMissing Reason = "CAPABILITY_MISSING"
	HostOnly          Reason = "HOST_ONLY"
	HostNotAGrant     Reason = "HOST_NOT_A_GRANT"
	OtherTask         Reason = "OTHER_TASK"
	EventTypeReserved Reason = "EVENT_TYPE_RESERVED"

	// Input.
	NameInvalid           Reason = "NAME_INVALID"
	ObjectIDInvalid       Reason = "OBJECT_ID_INVALID"
	ArgumentInvalid       Reason = "ARGUMENT_INVALID"
	CapabilityInvalid     Reason = "CAPABILITY_INVALID"
	RootInvalid           Reason = "ROOT_INVALID"
	BundleInvalid         Reason = "BUNDLE_INVALID"
	PackInvalid           Reason = "PACK_INVALID"
	FsckFailed            Reason = "FSCK_FAILED"
	PushProtocol          Reason = "PUSH_PROTOCOL"
	PushFDRefused         Reason = "PUSH_FD_REFUSED"
	EventTypeInvalid      Reason = "EVENT_TYPE_INVALID"
	EventDataInvalid      Reason = "EVENT_DATA_INVALID"
	IdempotencyKeyInvalid Reason = "IDEMPOTENCY_KEY_INVALID"

	// Things that are not there.
	ProjectNotFound Reason = "PROJECT_NOT_FOUND"
	TaskNotFound    Reason = "TASK_NOT_FOUND"
	PushNotFound    Reason = "PUSH_NOT_FOUND"
	MainNotFound    Reason = "MAIN_NOT_FOUND"
	GrantNotFound   Reason = "GRANT_NOT_FOUND"
	ReviewNotFound  Reason = "REVIEW_NOT_FOUND"

	// Rules.
	NonFastForward       Reason = "NON_FAST_FORWARD"
	PushConflict         Reason = "PUSH_CONFLICT"
	UnrelatedHistory     Reason = "UNRELATED_HISTORY"
	PrerequisiteMissing  Reason = "PREREQUISITE_MISSING"
	TaskClosed           Reason = "TASK_CLOSED"
	NoPushToReview       Reason = "NO_PUSH_TO_REVIEW"
	VerdictGiven         Reason = "VERDICT_GIVEN"
	ReviewStale          Reason = "REVIEW_STALE"
	GateNoApproval       Reason = "GATE_NO_APPROVAL"
	SelfReview           Reason = "SELF_REVIEW"
	ProjectOnOtherHost   Reason = "PROJECT_ON_OTHER_HOST"
	RefChanged           Reason = "REF_CHANGED"
	ObjectsUndone        Reason = "OBJECTS_UNDONE"
	IdempotencyKeyReused Reason = "IDEMPOTENCY_KEY_REUSED"
	PushFDDeclined       Reason = "PUSH_FD_DECLINED"

	// A verdict names the commit its reviewer saw (issue 13).
	VerdictCommitMissing  Reason = "VERDICT_COMMIT_MISSING"
	VerdictCommitMismatch Reason = "VERDICT_COMMIT_MISMATCH"

	// The log and its checkpoint file (issue 13).
	LogCheckpointMismatch Reason = "LOG_CHECKPOINT_MISMATCH"
	LogCheckpointAppend   Reason = "LOG_CHECKPOINT_APPEND_FAILED"

	// Who wrote an event (issue 31): the gate reads an event no trusted
	// host signed; a broker will not anchor a head it cannot prove.
	LogEventUnproven Reason = "LOG_EVENT_UNPROVEN"
	LogHeadUnproven  Reason = "LOG_HEAD_UNPROVEN"
	// The approve's actor could not give it, as the log shows.
	GateVerdictInvalid Reason = "GATE_VERDICT_INVALID"
	// A verdict's token is not the one its grant's grant.created records.
	GrantTokenMismatch Reason = "GRANT_TOKEN_MISMATCH"

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
	DeltaChainTooDeep     Reason = "DELTA_CHAIN_TOO_DEEP"
	BundleRefNotCommit    Reason = "BUNDLE_REF_NOT_COMMIT"

	// Limits.
	BundleTooLarge     Reason = "BUNDLE_TOO_LARGE"
	DiskFull           Reason = "DISK_FULL"
	PushIdle           Reason = "PUSH_IDLE"
	TooManyConns       Reason = "TOO_MANY_CONNECTIONS"
	TooManyCalls       Reason = "TOO_MANY_CALLS"
	CommentTooLarge    Reason = "COMMENT_TOO_LARGE"
	EventDataTooLarge  Reason = "EVENT_DATA_TOO_LARGE"
	EventBatchTooLarge Reason = "EVENT_BATCH_TOO_LARGE"
	// A git process printed more than its caller's cap (internal/gitcmd).
	GitOutputTooLarge Reason = "GIT_OUTPUT_TOO_LARGE"

	GitDirUnsafe        Reason = "GIT_DIR_UNSAFE"
	AgentProcessRunning Reason = "AGENT_PROCESS_RUNNING"
	WorkspaceUnsafe     Reason = "WORKSPACE_UNSAFE"

	RunDirNotEmpty       Reason = "RUN_DIR_NOT_EMPTY"
	LimitUnavailable     Reason = "LIMIT_UNAVAILABLE"
	AbstractScopeMissing Reason = "ABSTRACT_SCOPE_MISSING"
	SessionUIDsExhausted Reason = "SESSION_UIDS_EXHAUSTED"
	EgressDenied         Reason = "EGRESS_DENIED"
	EgressConnections    Reason = "EGRESS_CONNECTIONS_EXHAUSTED"
	EgressUnrecorded     Reason = "EGRESS_UNRECORDED"

	ObjectTooLarge     Reason = "OBJECT_TOO_LARGE"
	PackTooManyObjects Reason = "PACK_TOO_MANY_OBJECTS"
	// A push's objects together, and what its trees expand to.
	PushInflatedTooLarge Reason = "PUSH_INFLATED_TOO_LARGE"
	TreeTooLarge         Reason = "TREE_TOO_LARGE"
	PackUnreachable      Reason = "PACK_UNREACHABLE_OBJECTS"
	EventRateExceeded    Reason = "EVENT_RATE_EXCEEDED"
	EventBytesRate       Reason = "EVENT_BYTES_RATE_EXCEEDED"
	TaskQuota            Reason = "TASK_QUOTA_EXCEEDED"
	ProjectQuota         Reason = "PROJECT_QUOTA_EXCEEDED"

	TooManyConnsPerUID   Reason = "TOO_MANY_CONNECTIONS_PER_UID"
	TooManyCallsPerUID   Reason = "TOO_MANY_CALLS_PER_UID"
	TooManyCallsPerGrant Reason = "TOO_MANY_CALLS_PER_GRANT"
	TooManyFollows       Reason = "TOO_MANY_FOLLOW_STREAMS"
	RequestTooSlow       Reason = "REQUEST_TOO_SLOW"
	SendStalled          Reason = "SEND_STALLED"
	ListTooLong          Reason = "LIST_TOO_LONG"
	PushTooLong          Reason = "PUSH_TOO_LONG"
	PushTooSlow          Reason = "PUSH_TOO_SLOW"
	NoAnswer             Reason = "NO_ANSWER"
	TransferStalled      Reason = "TRANSFER_STALLED"

	TaskNeedsRepair   Reason = "TASK_NEEDS_REPAIR"
	TaskNeedsNoRepair Reason = "TASK_NEEDS_NO_REPAIR"
	RepairStale       Reason = "REPAIR_STALE"
	RepoNotTopLevel   Reason = "REPO_NOT_TOP_LEVEL"
	PathUnsafe        Reason = "PATH_UNSAFE"
	PathChanged       Reason = "PATH_CHANGED"
	// bushost mcp: a repo argument's git directory is elsewhere.
	GitDirOutsideRepo Reason = "GIT_DIR_OUTSIDE_REPO"
	CommitUnknown     Reason = "COMMIT_UNKNOWN"
	TaskLanded        Reason = "TASK_LANDED"
	MainMoved         Reason = "MAIN_MOVED"
	MergeConflict     Reason = "MERGE_CONFLICT"
	// A landing's merge ran past bushostd --merge-timeout.
	MergeTimeout Reason = "MERGE_TIMEOUT"
	// The task's latest push was refused a landing before (its merge
	// conflicted or timed out): a new push, or --force.
	LandRefused       Reason = "LAND_REFUSED"
	NothingToLand     Reason = "NOTHING_TO_LAND"
	MainHasLandedWork Reason = "MAIN_HAS_LANDED_WORK"
	BranchCheckedOut  Reason = "BRANCH_CHECKED_OUT"
	BranchInvalid     Reason = "BRANCH_INVALID"
	TaskNotClosed     Reason = "TASK_NOT_CLOSED"
	// repo optimize: a repository's housekeeping failed.
	HousekeepingFailed Reason = "HOUSEKEEPING_FAILED"
	TaskListTooLong    Reason = "TASK_LIST_TOO_LONG"
	// project list and grant list matched more than their bound.
	ProjectListTooLong Reason = "PROJECT_LIST_TOO_LONG"
	GrantListTooLong   Reason = "GRANT_LIST_TOO_LONG"

	LaunchNotAllowed Reason = "LAUNCH_NOT_ALLOWED"
	LaunchSetInvalid Reason = "LAUNCH_SET_INVALID"
	SessionLimit     Reason = "SESSION_LIMIT"
	SessionNotFound  Reason = "SESSION_NOT_FOUND"
	SessionRunning   Reason = "SESSION_RUNNING"
	WorkspaceInvalid Reason = "WORKSPACE_INVALID"
	// sandbox run --end-with: the session that launched this one has ended.
	LaunchingSessionEnded Reason = "LAUNCHING_SESSION_ENDED"

	// Moving a project between bus hosts through an export file (issue 19).
	ProjectMoving        Reason = "PROJECT_MOVING"
	ExportStale          Reason = "EXPORT_STALE"
	ExportAltered        Reason = "EXPORT_ALTERED"
	RepoDisagreesWithLog Reason = "REPO_DISAGREES_WITH_LOG"
)
