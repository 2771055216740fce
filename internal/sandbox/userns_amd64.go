package sandbox

// cloneExited starts a child with flags (CLONE_NEWUSER and the exit
// signal) that exits at once, sharing this process's memory (CLONE_VM,
// CLONE_VFORK: nothing is copied, and this thread waits the few
// instructions until it is gone). It returns the child's pid, a zombie
// until reaped, or the errno of clone.
//
//go:noescape
func cloneExited(flags uintptr) (pid uintptr, errno uintptr)
