package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// escapeSource is a small static program the escape suite runs inside the
// sandbox to make the system calls an agent's tools would: each command
// prints ESCAPED (exit 0) if the attempt worked, REFUSED and the error (exit
// 3) if the kernel said no, and anything else (exit 2) if it could not try.
const escapeSource = `package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("usage: escape CMD ARGS")
		os.Exit(2)
	}
	arg := func(i int) string {
		if len(os.Args) <= i {
			fmt.Println("missing argument")
			os.Exit(2)
		}
		return os.Args[i]
	}
	var err error
	switch os.Args[1] {
	case "ptrace":
		child := exec.Command("/bin/sleep", "5")
		if err := child.Start(); err != nil {
			fmt.Println("start child:", err)
			os.Exit(2)
		}
		defer child.Process.Kill()
		err = unix.PtraceAttach(child.Process.Pid)
		if err == nil {
			fmt.Println("ESCAPED: attached to", child.Process.Pid)
			os.Exit(0)
		}
		if err2 := unix.PtraceSeize(1); err2 == nil {
			fmt.Println("ESCAPED: seized pid 1")
			os.Exit(0)
		}
		_, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
		if e == 0 {
			fmt.Println("ESCAPED: PTRACE_TRACEME")
			os.Exit(0)
		}
	case "keyctl":
		_, err = unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 1, 0, 0)
		if err == nil {
			_, err = unix.AddKey("user", "escape", []byte("x"), unix.KEY_SPEC_SESSION_KEYRING)
		}
	case "mount":
		dir := arg(2)
		err = unix.Mount("none", dir, "tmpfs", 0, "")
		if err == nil {
			break
		}
		refused("mount", err)
		if fd, e := unix.Fsopen("tmpfs", 0); e == nil {
			unix.Close(fd)
			err = nil
			break
		} else {
			refused("fsopen", e)
		}
		if fd, e := unix.OpenTree(unix.AT_FDCWD, "/usr", unix.OPEN_TREE_CLONE); e == nil {
			unix.Close(fd)
			err = nil
			break
		} else {
			refused("open_tree", e)
		}
		err = unix.MountSetattr(unix.AT_FDCWD, "/usr", 0, &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY})
	case "userns":
		err = unix.Unshare(unix.CLONE_NEWUSER)
		if err == nil {
			break
		}
		refused("unshare", err)
		c := exec.Command("/bin/true")
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
		err = c.Run()
		if err == nil {
			break
		}
		refused("clone(CLONE_NEWUSER)", err)
		c = exec.Command("/bin/true")
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
		err = c.Run()
	case "tiocsti":
		for _, ch := range []byte("echo PWNED\n") {
			b := ch
			_, _, e := unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCSTI, uintptr(unsafe.Pointer(&b)))
			if e != 0 {
				err = e
				break
			}
		}
	case "connect":
		var c net.Conn
		c, err = net.DialTimeout("unix", arg(2), 2*time.Second)
		if err == nil {
			c.Close()
		}
	case "tcp":
		var c net.Conn
		c, err = net.DialTimeout("tcp", arg(2), 2*time.Second)
		if err == nil {
			c.Close()
		}
	case "syscalls":
		// Each must be refused; one that is not is an escape.
		calls := []struct {
			name string
			nr   uintptr
			a    [3]uintptr
		}{
			{"io_uring_setup", unix.SYS_IO_URING_SETUP, [3]uintptr{1, 0, 0}},
			{"bpf", unix.SYS_BPF, [3]uintptr{0, 0, 0}},
			{"userfaultfd", unix.SYS_USERFAULTFD, [3]uintptr{0, 0, 0}},
			{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, [3]uintptr{0, 0, 0}},
			{"setns", unix.SYS_SETNS, [3]uintptr{0, 0, 0}},
			{"keyctl", unix.SYS_KEYCTL, [3]uintptr{0, 0, 0}},
		}
		for _, c := range calls {
			_, _, e := unix.Syscall(c.nr, c.a[0], c.a[1], c.a[2])
			if e != unix.EPERM {
				fmt.Printf("ESCAPED: %s returned %v, not EPERM\n", c.name, e)
				os.Exit(0)
			}
			refused(c.name, e)
		}
		fmt.Println("REFUSED: every call")
		os.Exit(3)
	case "families":
		// Each must be refused as a family this kernel lacks; one that is
		// not is an escape (a network namespace covers none of them).
		for _, c := range []struct {
			name             string
			family, typ, pro int
		}{
			{"AF_VSOCK", unix.AF_VSOCK, unix.SOCK_STREAM, 0},
			{"AF_PACKET", unix.AF_PACKET, unix.SOCK_RAW, 0x0300},
			{"AF_ALG", unix.AF_ALG, unix.SOCK_SEQPACKET, 0},
			{"AF_KEY", unix.AF_KEY, unix.SOCK_RAW, 2},
			{"AF_NETLINK audit", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT},
		} {
			fd, e := unix.Socket(c.family, c.typ, c.pro)
			if e == nil {
				unix.Close(fd)
				fmt.Println("ESCAPED: socket", c.name)
				os.Exit(0)
			}
			if e != unix.EAFNOSUPPORT {
				fmt.Printf("ESCAPED: socket %s returned %v, not EAFNOSUPPORT\n", c.name, e)
				os.Exit(0)
			}
			refused("socket "+c.name, e)
			if _, e = unix.Socketpair(c.family, c.typ, c.pro); e != unix.EAFNOSUPPORT {
				fmt.Printf("ESCAPED: socketpair %s returned %v, not EAFNOSUPPORT\n", c.name, e)
				os.Exit(0)
			}
			refused("socketpair "+c.name, e)
		}
		fmt.Println("REFUSED: every family")
		os.Exit(3)
	case "abstract":
		// A connection to an abstract name the host listens on.
		var c net.Conn
		c, err = net.DialTimeout("unix", "@"+arg(2), 2*time.Second)
		if err == nil {
			c.Write([]byte("from the session\n"))
			c.Close()
		}
	case "tiocsetd":
		ldisc := 27 // N_NULL: the terminal would read and write nothing
		if e := unix.IoctlSetPointerInt(0, unix.TIOCSETD, ldisc); e != nil {
			err = e
		}
	case "tiocexcl":
		// Puts the terminal on descriptor N in exclusive mode: past the
		// session, only root could open it again.
		fd, e := strconv.Atoi(arg(2))
		if e != nil {
			fmt.Println("tiocexcl: bad descriptor")
			os.Exit(2)
		}
		if e := unix.IoctlSetInt(fd, unix.TIOCEXCL, 0); e != nil {
			err = e
		}
	case "alloc":
		// Allocates and touches N MiB, then says so.
		n, e := strconv.Atoi(arg(2))
		if e != nil {
			fmt.Println("alloc: bad size")
			os.Exit(2)
		}
		mem := make([][]byte, n)
		for i := range mem {
			mem[i] = make([]byte, 1<<20)
			for j := 0; j < len(mem[i]); j += 4096 {
				mem[i][j] = 1
			}
		}
		fmt.Println("ALLOCATED", n, "MiB")
		os.Exit(0)
	case "forks":
		// Starts up to N processes that wait, as a fork bomb would, and
		// reports how many it got; they all end with it.
		n, e := strconv.Atoi(arg(2))
		if e != nil {
			fmt.Println("forks: bad count")
			os.Exit(2)
		}
		var kids []*exec.Cmd
		for i := 0; i < n; i++ {
			k := exec.Command("/bin/sleep", "60")
			if e := k.Start(); e != nil {
				fmt.Printf("REFUSED: forks: process %d: %v\n", i+1, e)
				for _, k := range kids {
					k.Process.Kill()
					k.Wait()
				}
				os.Exit(3)
			}
			kids = append(kids, k)
		}
		fmt.Println("ESCAPED: started", n, "processes")
		for _, k := range kids {
			k.Process.Kill()
			k.Wait()
		}
		os.Exit(0)
	case "mmapwrite":
		// Writes MARK at the start of an existing file through a shared
		// writable mapping (no write(2), which would strip a set-id bit):
		// ESCAPED if the file still has a set-user-ID or set-group-ID bit
		// afterwards.
		f, e := os.OpenFile(arg(2), os.O_RDWR, 0)
		if e != nil {
			err = e
			break
		}
		m, e := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if e != nil {
			err = e
			break
		}
		copy(m, "MARK")
		unix.Msync(m, unix.MS_SYNC)
		unix.Munmap(m)
		var st unix.Stat_t
		if e := unix.Fstat(int(f.Fd()), &st); e != nil {
			fmt.Println("fstat:", e)
			os.Exit(2)
		}
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) == 0 {
			fmt.Printf("REFUSED: mmapwrite %s: written, its set-id bits gone (mode %o)\n", arg(2), st.Mode&0o7777)
			os.Exit(3)
		}
		fmt.Printf("ESCAPED: mmapwrite %s: written, mode %o\n", arg(2), st.Mode&0o7777)
		os.Exit(0)
	case "fork":
		out, e := exec.Command("/bin/sh", "-c", "echo forked").Output()
		if e != nil {
			fmt.Println("fork/exec failed:", e)
			os.Exit(2)
		}
		fmt.Print(string(out))
		os.Exit(0)
	default:
		fmt.Println("unknown command", os.Args[1])
		os.Exit(2)
	}
	if err == nil {
		fmt.Println("ESCAPED:", os.Args[1])
		os.Exit(0)
	}
	var errno syscall.Errno
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &errno) || errors.As(err, &ne) || errors.As(err, &oe) || errors.Is(err, os.ErrNotExist) {
		fmt.Println("REFUSED:", os.Args[1], err)
		os.Exit(3)
	}
	fmt.Println("could not try:", err)
	os.Exit(2)
}

func refused(what string, err error) {
	fmt.Printf("refused %s: %v\n", what, err)
}
`

var (
	escapeOnce sync.Once
	escapePath string
	escapeErr  error
)

// escapeHelper builds the helper once per run, static so it needs nothing
// from the session's /usr. It builds as its own module in the binaries
// directory, requiring the x/sys this module pins, from the module cache.
func escapeHelper(t testing.TB) string {
	t.Helper()
	escapeOnce.Do(func() { escapeErr = buildEscapeHelper() })
	if escapeErr != nil {
		t.Fatalf("build the escape helper: %v", escapeErr)
	}
	return escapePath
}

func buildEscapeHelper() error {
	src := filepath.Join(binDir, "escape-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		return err
	}
	var sysVersion string
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "golang.org/x/sys" {
			sysVersion = f[1]
		}
	}
	if sysVersion == "" {
		return fmt.Errorf("go.mod does not require golang.org/x/sys")
	}
	gosum, err := os.ReadFile(filepath.Join(repoRoot, "go.sum"))
	if err != nil {
		return err
	}
	var sum strings.Builder
	for _, line := range strings.Split(string(gosum), "\n") {
		if strings.HasPrefix(line, "golang.org/x/sys "+sysVersion) {
			sum.WriteString(line + "\n")
		}
	}
	files := map[string]string{
		"main.go": escapeSource,
		"go.mod":  "module escape\n\ngo 1.21\n\nrequire golang.org/x/sys " + sysVersion + "\n",
		"go.sum":  sum.String(),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o644); err != nil {
			return err
		}
	}
	escapePath = filepath.Join(binDir, "escape")
	cmd := exec.Command("go", "build", "-o", escapePath, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return &buildError{name: "escape", out: string(out), err: err}
	}
	return nil
}
