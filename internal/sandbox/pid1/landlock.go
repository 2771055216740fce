package pid1

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// rulesetAttr is struct landlock_ruleset_attr up to the scopes (ABI 6);
// the kernel takes a shorter struct than its own and zeroes the rest.
type rulesetAttr struct {
	handledAccessFS  uint64
	handledAccessNet uint64
	scoped           uint64
}

// scopeAbstractUnix puts the calling thread, and every process it starts
// from now on, in a Landlock domain that cannot connect to an abstract
// Unix socket made outside it. Abstract names live in the network
// namespace, which a session started with --net shares with the host, and
// seccomp cannot read a socket's address: this is what keeps such a
// session off the host's containerd-shim, X11 and D-Bus listeners. Files
// and the network are not restricted (nothing is handled).
func scopeAbstractUnix() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return err
	}
	attr := rulesetAttr{scoped: unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET}
	fd, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if e != 0 {
		return e
	}
	defer unix.Close(int(fd))
	if _, _, e := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); e != 0 {
		return e
	}
	return nil
}
