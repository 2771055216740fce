package sandbox

import "golang.org/x/sys/unix"

// landlockScopeABI is the first Landlock ABI with scopes, among them
// LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (Linux 6.12), which pid 1 puts a
// --net=host session's command under (internal/sandbox/pid1).
const landlockScopeABI = 6

// landlockABI is the kernel's Landlock ABI version, 0 without Landlock. A
// variable so that a test can stand for an older kernel.
var landlockABI = func() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if e != 0 {
		return 0
	}
	return int(v)
}
