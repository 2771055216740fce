package testhook

// Skips are the checks and features of bushostd that a test's build may
// turn off: a benchmark measures what a check costs against a daemon
// without it, a test plays a daemon from before a feature. No flag or
// option of a production build reaches them: there Skipped is always the
// zero value.
type Skips struct {
	// BeyondGit skips gitd's beyond-git walk of pushed trees.
	BeyondGit bool
	// ObjectChecks skips the streaming object size checks of a pushed
	// pack.
	ObjectChecks bool
	// FDPassing serves git.sock as a daemon from before descriptor
	// passing: it takes no descriptor and ignores a push's offer of one.
	FDPassing bool
}
