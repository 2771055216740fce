package sandbox

import "golang.org/x/sys/unix"

const (
	auditArch = unix.AUDIT_ARCH_AARCH64
	x32Bit    = 0
)

// modeCalls are the calls that take a file mode, and where.
var modeCalls = []modeArg{
	{unix.SYS_OPENAT, offArg3},
	{unix.SYS_FCHMOD, offArg1}, {unix.SYS_FCHMODAT, offArg2}, {unix.SYS_FCHMODAT2, offArg2},
	{unix.SYS_MKNODAT, offArg2},
}
