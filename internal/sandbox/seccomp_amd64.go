package sandbox

import "golang.org/x/sys/unix"

const (
	auditArch = unix.AUDIT_ARCH_X86_64
	// x32Bit marks x32 ABI calls, which share the x86_64 audit arch.
	x32Bit = 0x40000000
)
