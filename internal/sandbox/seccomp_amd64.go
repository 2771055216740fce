package sandbox

import "golang.org/x/sys/unix"

const (
	auditArch = unix.AUDIT_ARCH_X86_64
	// x32Bit marks x32 ABI calls, which share the x86_64 audit arch.
	x32Bit = 0x40000000
)

// modeCalls are the calls that take a file mode, and where.
var modeCalls = []modeArg{
	{unix.SYS_OPEN, offArg2}, {unix.SYS_CREAT, offArg1}, {unix.SYS_OPENAT, offArg3},
	{unix.SYS_CHMOD, offArg1}, {unix.SYS_FCHMOD, offArg1}, {unix.SYS_FCHMODAT, offArg2}, {unix.SYS_FCHMODAT2, offArg2},
	{unix.SYS_MKNOD, offArg1}, {unix.SYS_MKNODAT, offArg2},
}
