//go:build !amd64

package sandbox

import "golang.org/x/sys/unix"

// cloneExited starts a child with flags (CLONE_NEWUSER and the exit
// signal) that exits at once, and returns its pid, a zombie until reaped,
// or the errno of clone. Here a copy of the process (a fork): only amd64
// has the assembly that shares its memory instead (userns_amd64.s).
func cloneExited(flags uintptr) (uintptr, uintptr) {
	pid, _, errno := unix.RawSyscall6(unix.SYS_CLONE, flags, 0, 0, 0, 0, 0)
	if pid == 0 && errno == 0 {
		exitChild()
	}
	return pid, uintptr(errno)
}

// exitChild is all the forked child does.
//
//go:nosplit
func exitChild() {
	for {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
}
