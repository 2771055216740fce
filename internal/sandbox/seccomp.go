package sandbox

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// seccomp_data offsets (linux/seccomp.h): nr, arch, instruction pointer,
// then six 64-bit arguments. Arguments are read by their low 32 bits,
// which is where they sit on the little-endian machines supported here.
const (
	offNR   = 0
	offArch = 4
	offArg0 = 16
	offArg1 = 24
	offArg2 = 32
	offArg3 = 40
)

// setIDBits are the mode bits no file the session makes or changes may
// carry. Through an idmapped mount a file the session writes is its
// owner's on disk, root's in a root-owned workspace: a set-user-ID bit
// there would make it a way into that owner for anyone on the host who can
// reach it, after the session as during it.
const setIDBits = unix.S_ISUID | unix.S_ISGID

// modeArg is a call taking a file mode, and which argument holds it.
type modeArg struct {
	nr  uintptr
	off uint32
}

// nsCloneFlags are the clone(2) flags that would make a new namespace.
const nsCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP

// deniedSyscalls are refused with EPERM, each for a reason a session has no
// use for the call and an escape has.
var deniedSyscalls = []struct {
	nr  uintptr
	why string
}{
	{unix.SYS_PTRACE, "reads and rewrites other processes"},
	{unix.SYS_PROCESS_VM_READV, "reads another process's memory"},
	{unix.SYS_PROCESS_VM_WRITEV, "writes another process's memory"},
	{unix.SYS_KEYCTL, "the kernel keyring is shared beyond the session"},
	{unix.SYS_ADD_KEY, "the kernel keyring is shared beyond the session"},
	{unix.SYS_REQUEST_KEY, "the kernel keyring is shared beyond the session"},
	{unix.SYS_MOUNT, "mounts could undo the bind table"},
	{unix.SYS_UMOUNT2, "unmounting could reveal what a bind covers"},
	{unix.SYS_PIVOT_ROOT, "changes the session's root"},
	{unix.SYS_OPEN_TREE, "new mount API"},
	{unix.SYS_MOVE_MOUNT, "new mount API"},
	{unix.SYS_FSOPEN, "new mount API"},
	{unix.SYS_FSCONFIG, "new mount API"},
	{unix.SYS_FSMOUNT, "new mount API"},
	{unix.SYS_FSPICK, "new mount API"},
	{unix.SYS_MOUNT_SETATTR, "new mount API: could clear a read-only flag"},
	{unix.SYS_OPEN_TREE_ATTR, "new mount API: clones a mount with new attributes"},
	{unix.SYS_LISTMOUNT, "lists the host's mounts, beyond the bind table"},
	{unix.SYS_STATMOUNT, "describes the host's mounts, beyond the bind table"},
	{unix.SYS_IO_URING_SETUP, "io_uring runs calls this filter never sees"},
	{unix.SYS_IO_URING_ENTER, "io_uring runs calls this filter never sees"},
	{unix.SYS_IO_URING_REGISTER, "io_uring runs calls this filter never sees"},
	{unix.SYS_UNSHARE, "new namespaces are where capabilities come back"},
	{unix.SYS_SETNS, "joining another namespace"},
	{unix.SYS_BPF, "kernel programs"},
	{unix.SYS_USERFAULTFD, "a tool for winning kernel races"},
	{unix.SYS_PERF_EVENT_OPEN, "observes the host and has a long exploit history"},
	{unix.SYS_OPEN_BY_HANDLE_AT, "opens files by handle, around the mount table"},
	{unix.SYS_INIT_MODULE, "kernel modules"},
	{unix.SYS_FINIT_MODULE, "kernel modules"},
	{unix.SYS_DELETE_MODULE, "kernel modules"},
	{unix.SYS_KEXEC_LOAD, "replaces the kernel"},
	{unix.SYS_KEXEC_FILE_LOAD, "replaces the kernel"},
	{unix.SYS_ACCT, "host process accounting"},
	{unix.SYS_SWAPON, "host swap"},
	{unix.SYS_SWAPOFF, "host swap"},
	{unix.SYS_REBOOT, "host power"},
}

// deniedIoctls are refused on any file descriptor: TIOCSTI and TIOCLINUX
// push input into a terminal, TIOCSETD changes the line discipline of the
// caller's terminal, which would outlive the session.
var deniedIoctls = []uint32{unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCSETD}

// allowedFamilies are the socket families socket(2) and socketpair(2) may
// make; every other (AF_VSOCK, AF_PACKET, AF_ALG, AF_KEY, bluetooth...)
// gets EAFNOSUPPORT. A network namespace covers the first three, not vsock
// or the kernel's crypto and key interfaces. AF_NETLINK is allowed with
// NETLINK_ROUTE alone (what getaddrinfo and ip(8) read), checked apart.
var allowedFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}

type asm struct{ prog []unix.SockFilter }

func (a *asm) stmt(code uint16, k uint32) {
	a.prog = append(a.prog, unix.SockFilter{Code: code, K: k})
}

func (a *asm) jump(code uint16, k uint32, jt, jf uint8) {
	a.prog = append(a.prog, unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf})
}

const (
	ldW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeqK = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jgeK = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	jsK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	retK = unix.BPF_RET | unix.BPF_K
)

var (
	retAllow = uint32(unix.SECCOMP_RET_ALLOW)
	retEPERM = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.EPERM)
	// clone3 passes its flags in memory a filter cannot read: ENOSYS makes
	// glibc and Go fall back to clone, whose flags it can.
	retENOSYS = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.ENOSYS)
	retKill   = uint32(unix.SECCOMP_RET_KILL_PROCESS)
	// A family the session may not use reads as one this kernel lacks,
	// which programs already handle.
	retEAFNOSUPPORT = uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.EAFNOSUPPORT)
)

// Filter returns the seccomp program as bwrap's --seccomp reads it: the
// raw array of struct sock_filter.
func Filter() ([]byte, error) {
	prog, err := filterProgram()
	if err != nil {
		return nil, err
	}
	return binary.Append(nil, binary.NativeEndian, prog)
}

func filterProgram() ([]unix.SockFilter, error) {
	if auditArch == 0 {
		return nil, fmt.Errorf("no seccomp filter for this architecture")
	}
	var a asm
	// Another ABI (i386 via int 0x80, x32) numbers its calls differently,
	// so every check below would test the wrong call: kill instead.
	a.stmt(ldW, offArch)
	a.jump(jeqK, auditArch, 1, 0)
	a.stmt(retK, retKill)
	a.stmt(ldW, offNR)
	if x32Bit != 0 {
		a.jump(jgeK, x32Bit, 0, 1)
		a.stmt(retK, retKill)
	}
	for _, s := range deniedSyscalls {
		a.jump(jeqK, uint32(s.nr), 0, 1)
		a.stmt(retK, retEPERM)
	}
	a.jump(jeqK, unix.SYS_CLONE3, 0, 1)
	a.stmt(retK, retENOSYS)
	// openat2 passes its mode in memory too: ENOSYS makes callers fall
	// back to openat, whose mode it can read.
	a.jump(jeqK, unix.SYS_OPENAT2, 0, 1)
	a.stmt(retK, retENOSYS)
	// chmod, open with O_CREAT, mknod and the like: EPERM for a mode with
	// a set-user-ID or set-group-ID bit (a mode_t: its low 32 bits are all
	// the kernel reads).
	for _, m := range modeCalls {
		a.jump(jeqK, uint32(m.nr), 0, 4)
		a.stmt(ldW, m.off)
		a.jump(jsK, setIDBits, 0, 1)
		a.stmt(retK, retEPERM)
		a.stmt(retK, retAllow)
	}

	// clone with a namespace flag. The accumulator holds nr after this.
	a.jump(jeqK, unix.SYS_CLONE, 0, 4)
	a.stmt(ldW, offArg0)
	a.jump(jsK, nsCloneFlags, 0, 1)
	a.stmt(retK, retEPERM)
	a.stmt(retK, retAllow)

	// socket and socketpair: the family (arg 0) and, for netlink, the
	// protocol (arg 2) are ints, so their low 32 bits are all the kernel
	// reads. The accumulator still holds nr on the way past.
	n := len(allowedFamilies)
	a.jump(jeqK, unix.SYS_SOCKET, 1, 0)
	a.jump(jeqK, unix.SYS_SOCKETPAIR, 0, uint8(n+6))
	a.stmt(ldW, offArg0)
	for i, f := range allowedFamilies {
		a.jump(jeqK, f, uint8(n-i+3), 0)
	}
	a.jump(jeqK, unix.AF_NETLINK, 0, 2)
	a.stmt(ldW, offArg2)
	a.jump(jeqK, unix.NETLINK_ROUTE, 1, 0)
	a.stmt(retK, retEAFNOSUPPORT)
	a.stmt(retK, retAllow)

	// ioctl: the request is an unsigned int, so its low 32 bits are all
	// the kernel looks at; comparing those leaves no high-bit bypass.
	a.jump(jeqK, unix.SYS_IOCTL, 0, uint8(2*len(deniedIoctls)+2))
	a.stmt(ldW, offArg1)
	for _, req := range deniedIoctls {
		a.jump(jeqK, req, 0, 1)
		a.stmt(retK, retEPERM)
	}
	a.stmt(retK, retAllow)
	a.stmt(retK, retAllow)
	return a.prog, nil
}
