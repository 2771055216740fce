package sandbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

func TestParseFlags(t *testing.T) {
	base := []string{"--run-dir", "/r", "--workspace", "/w", "--role", "coder", "--broker-socket", "/b.sock"}
	for _, tc := range []struct {
		name    string
		verb    string
		args    []string
		wantErr string
		check   func(*testing.T, *Config)
	}{
		{"run needs a command", "run", base, "needs a command", nil},
		{"explain takes none", "explain", append(slices.Clone(base), "extra"), "takes no arguments", nil},
		{"missing workspace", "explain", []string{"--run-dir", "/r", "--role", "x", "--broker-socket", "/b"}, "--workspace is required", nil},
		{"bad role", "explain", append(slices.Clone(base), "--role", "../x"), "role", nil},
		{"unknown cap", "explain", append(slices.Clone(base), "--caps", "git.push.working,root"), `unknown capability "root"`, nil},
		{"bad env", "explain", append(slices.Clone(base), "--env", "=x"), "--env", nil},
		{"full", "run", append(slices.Clone(base), "--caps", "git.push.working, review.verdict,git.push.working", "--net",
			"--ro", "/a", "--ro", "/b", "--env", "A=1", "--", "sh", "-c", "true"), "", func(t *testing.T, c *Config) {
			if !slices.Equal(c.Caps, []string{CapPushWorking, CapReviewVerdict}) {
				t.Errorf("caps %q", c.Caps)
			}
			if c.Net != NetHost || !slices.Equal(c.RO, []string{"/a", "/b"}) || !slices.Equal(c.Command, []string{"sh", "-c", "true"}) {
				t.Errorf("config %+v", c)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseFlags(tc.verb, tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrUsage) {
					t.Fatalf("err %v, want usage error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// layout makes a run directory, workspace and sockets outside /tmp.
func layout(t *testing.T) (base string, flags []string) {
	t.Helper()
	base, err := os.MkdirTemp("/var/tmp", "sandbox-unit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	for _, d := range []string{"ws", "run", "bus"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "run", "session.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"broker.sock", "git.sock"} {
		l, err := net.Listen("unix", filepath.Join(base, "bus", s))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	return base, []string{"--run-dir", filepath.Join(base, "run"), "--workspace", filepath.Join(base, "ws"), "--role", "coder",
		"--broker-socket", filepath.Join(base, "bus", "broker.sock"), "--git-socket", filepath.Join(base, "bus", "git.sock"),
		"--bushost", "/usr/bin/true"}
}

func plan(t *testing.T, args ...string) (*Plan, error) {
	t.Helper()
	c, err := ParseFlags("explain", args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// The test binary sits in a build directory the session user may not
	// traverse; any executable stands for the session's pid 1 here.
	c.Init = "/usr/bin/true"
	return BuildPlan(c)
}

func TestPlanBindTable(t *testing.T) {
	base, flags := layout(t)
	p, err := plan(t, append(flags, "--caps", "review.verdict", "--ro", filepath.Join(base, "ws"))...)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for i, b := range p.Binds {
		if b.Why == "" {
			t.Errorf("bind %+v has no why", b)
		}
		seen[b.Target] = i
	}
	ws, run := filepath.Join(base, "ws"), filepath.Join(base, "run")
	for _, want := range []string{"/usr", "/etc", "/proc", "/dev", "/tmp", ws, run, filepath.Join(base, "bus", "git.sock"), sessionBinDir + "/bushost", initPath, "/"} {
		if _, ok := seen[want]; !ok {
			t.Errorf("no bind for %s", want)
		}
	}
	// Parents before children, and / made read-only last.
	if !(seen[run] < seen[filepath.Join(run, "session.json")] && seen[run] < seen[filepath.Join(run, "bundle")]) {
		t.Errorf("run directory mounted after its read-only children: %v", seen)
	}
	if last := p.Binds[len(p.Binds)-1]; last.Kind != KindRemountRO || last.Target != "/" {
		t.Errorf("last bind %+v, want remount-ro /", last)
	}
	args := strings.Join(p.bwrapArgs(), " ")
	for _, want := range []string{"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net", "--disable-userns",
		"--new-session", "--cap-drop ALL", "--seccomp 3", "--json-status-fd 4", "--as-pid-1"} {
		if !strings.Contains(args, want) {
			t.Errorf("bwrap args lack %s: %s", want, args)
		}
	}
	if strings.Contains(args, "--die-with-parent") {
		t.Errorf("bwrap args use --die-with-parent: a session must outlive a host that died hard")
	}
	if b := p.Binds[seen[initPath]]; b.Kind != KindROBind || b.Source != "/usr/bin/true" {
		t.Errorf("pid 1 bound as %+v, want a read-only bind of Config.Init", b)
	}
	exe, _, err := initExecutable("")
	if self, _ := os.Executable(); err != nil || exe != self {
		t.Errorf("pid 1 by default, with no sandbox-init beside, is %q (%v), want this executable %q", exe, err, self)
	}
}

// TestInitBeside: sandbox-init beside the sandbox binary is pid 1 only
// when it is as trusted as that binary (a regular file of its owner that
// no one else may write, in a directory no one else may write); else the
// sandbox binary itself is.
func TestInitBeside(t *testing.T) {
	for _, tc := range []struct {
		name     string
		setup    func(dir, init string)
		useSmall bool
	}{
		{"beside", func(dir, init string) {}, true},
		{"missing", func(dir, init string) { os.Remove(init) }, false},
		{"group-writable", func(dir, init string) { os.Chmod(init, 0o775) }, false},
		{"not executable", func(dir, init string) { os.Chmod(init, 0o644) }, false},
		{"a symlink", func(dir, init string) {
			os.Remove(init)
			os.Symlink("/usr/bin/true", init)
		}, false},
		{"a directory", func(dir, init string) {
			os.Remove(init)
			os.Mkdir(init, 0o755)
		}, false},
		{"in a directory others may write", func(dir, init string) { os.Chmod(dir, 0o777) }, false},
		{"another owner's", func(dir, init string) { os.Chown(init, 65534, 65534) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "another owner's" {
				testenv.NeedRoot(t, "chown the sandbox-init of another owner")
			}
			dir := t.TempDir()
			os.Chmod(dir, 0o755)
			self, init := filepath.Join(dir, "sandbox"), filepath.Join(dir, InitName)
			for _, f := range []string{self, init} {
				if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			tc.setup(dir, init)
			got, which := initBeside(self)
			want := self
			if tc.useSmall {
				want = init
			}
			if got != want || !strings.Contains(which, InitName) {
				t.Errorf("pid 1 is %q (%s), want %q", got, which, want)
			}
		})
	}
}

func TestPlanGitSocketOnlyForGitCaps(t *testing.T) {
	base, flags := layout(t)
	gitSock := filepath.Join(base, "bus", "git.sock")
	for caps, want := range map[string]bool{
		"git.push.working": true, "review.verdict": true, "review.request,task.close,event.record": false, "": false,
	} {
		p, err := plan(t, append(flags, "--caps", caps)...)
		if err != nil {
			t.Fatal(err)
		}
		got := slices.ContainsFunc(p.Binds, func(b Bind) bool { return b.Target == gitSock })
		if got != want {
			t.Errorf("caps %q: git socket bound %v, want %v", caps, got, want)
		}
		if !want && !slices.ContainsFunc(p.Notes, func(n string) bool { return strings.Contains(n, "git socket") }) {
			t.Errorf("caps %q: no note on the missing git socket: %q", caps, p.Notes)
		}
	}
}

func TestPlanRefusals(t *testing.T) {
	base, flags := layout(t)
	set := func(name, value string) []string {
		f := slices.Clone(flags)
		f[slices.Index(f, name)+1] = value
		return f
	}
	if err := os.MkdirAll(filepath.Join(base, "ws", "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "ws", "run", "session.json"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"workspace under /tmp", set("--workspace", t.TempDir()), "under /tmp"},
		{"ro under /tmp", append(slices.Clone(flags), "--ro", t.TempDir()), "under /tmp"},
		{"workspace under /usr", set("--workspace", "/usr/share"), "under /usr"},
		{"workspace is root", set("--workspace", "/"), "host's root"},
		{"run inside workspace", set("--run-dir", filepath.Join(base, "ws", "run")), "must not contain one another"},
		{"no session.json", set("--run-dir", filepath.Join(base, "bus")), "session.json"},
		{"broker not a socket", set("--broker-socket", filepath.Join(base, "run", "session.json")), "not a socket"},
		{"missing workspace", set("--workspace", filepath.Join(base, "nope")), "no such file"},
		{"missing bushost", set("--bushost", filepath.Join(base, "nope")), "--bushost " + filepath.Join(base, "nope") + ": lstat"},
		{"bushost a directory", set("--bushost", filepath.Join(base, "ws")), "is not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := plan(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// TestPlanBushostNote: with no --bushost, a client neither next to the
// executable nor on PATH leaves the session without one, and explain says so.
func TestPlanBushostNote(t *testing.T) {
	base, flags := layout(t)
	i := slices.Index(flags, "--bushost")
	flags = slices.Delete(slices.Clone(flags), i, i+2)
	t.Setenv("PATH", base)
	p, err := plan(t, flags...)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range p.Binds {
		if b.Target == sessionBinDir+"/bushost" {
			t.Fatalf("bound a bushost from %s", b.Source)
		}
	}
	if !slices.ContainsFunc(p.Notes, func(n string) bool { return strings.HasPrefix(n, "bushost not bound") }) {
		t.Errorf("notes: %q", p.Notes)
	}
}

func TestPlanAccessProblems(t *testing.T) {
	testenv.NeedRoot(t, "needs root to plan a session for nobody")
	base, flags := layout(t)
	// Owned by root, 0755: nobody cannot write the workspace or connect.
	// (A session of its own uid is handed its workspace instead.)
	p, err := plan(t, append(flags, "--caps", "git.push.working", "--user", "nobody")...)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(p.Problems, "\n")
	for _, want := range []string{filepath.Join(base, "ws"), "git.sock", "broker.sock"} {
		if !strings.Contains(all, want) {
			t.Errorf("problems do not name %s:\n%s", want, all)
		}
	}
	if _, err := Run(p, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "refusing") {
		t.Errorf("Run with problems: %v, want a refusal", err)
	}
}

// TestSeccompFilter loads the filter into a child of the test binary and
// has it make the calls the filter must refuse, and some it must allow.
func TestSeccompFilter(t *testing.T) {
	if os.Getenv("SANDBOX_SECCOMP_CHILD") == "1" {
		seccompChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSeccompFilter$")
	cmd.Env = append(os.Environ(), "SANDBOX_SECCOMP_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, want := range []string{"ptrace EPERM", "keyctl EPERM", "unshare EPERM", "mount EPERM", "fsopen EPERM",
		"io_uring_setup EPERM", "bpf EPERM", "ioctl TIOCSTI EPERM", "ioctl TIOCSTI high bits EPERM", "clone3 ENOSYS",
		"clone newuser EPERM", "getpid ok", "fork ok",
		"ioctl TIOCSETD EPERM", "listmount EPERM", "statmount EPERM", "open_tree_attr EPERM",
		"socket AF_UNIX ok", "socket AF_INET ok", "socket AF_INET6 ok", "socket AF_NETLINK route ok",
		"socket AF_NETLINK audit " + unix.EAFNOSUPPORT.Error(), "socket AF_VSOCK " + unix.EAFNOSUPPORT.Error(),
		"socket AF_PACKET " + unix.EAFNOSUPPORT.Error(), "socket AF_ALG " + unix.EAFNOSUPPORT.Error(),
		"socket AF_KEY " + unix.EAFNOSUPPORT.Error(), "socket AF_VSOCK high bits " + unix.EAFNOSUPPORT.Error(),
		"socketpair AF_UNIX ok", "socketpair AF_VSOCK " + unix.EAFNOSUPPORT.Error(),
		"chmod 0755 ok", "chmod 04755 EPERM", "fchmod 02755 EPERM", "fchmodat 04700 EPERM", "fchmodat2 02700 EPERM",
		"openat O_CREAT 0644 ok", "openat O_CREAT 04755 EPERM", "openat2 ENOSYS", "mknodat 02644 EPERM",
		"setuid bit after the attempts false"} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("child did not report %q:\n%s", want, out)
		}
	}
}

func seccompChild() {
	prog, err := filterProgram()
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "seccomp-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		panic(err)
	}
	fd, err := unix.Open(file, unix.O_RDONLY, 0)
	if err != nil {
		panic(err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// TSYNC: the filter holds for every thread of this Go process.
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		panic(e)
	}
	report := func(name string, e unix.Errno) {
		switch e {
		case 0:
			os.Stdout.WriteString(name + " ok\n")
		case unix.EPERM:
			os.Stdout.WriteString(name + " EPERM\n")
		case unix.ENOSYS:
			os.Stdout.WriteString(name + " ENOSYS\n")
		default:
			os.Stdout.WriteString(name + " " + e.Error() + "\n")
		}
	}
	call := func(name string, nr uintptr, a ...uintptr) {
		a = append(a, 0, 0, 0)
		_, _, e := unix.Syscall(nr, a[0], a[1], a[2])
		report(name, e)
	}
	call("ptrace", unix.SYS_PTRACE, unix.PTRACE_TRACEME)
	call("keyctl", unix.SYS_KEYCTL, unix.KEYCTL_GET_KEYRING_ID)
	call("unshare", unix.SYS_UNSHARE, unix.CLONE_NEWUSER)
	call("mount", unix.SYS_MOUNT)
	call("fsopen", unix.SYS_FSOPEN)
	call("io_uring_setup", unix.SYS_IO_URING_SETUP, 1)
	call("bpf", unix.SYS_BPF)
	call("clone3", unix.SYS_CLONE3)
	call("ioctl TIOCSTI", unix.SYS_IOCTL, 0, unix.TIOCSTI)
	call("ioctl TIOCSTI high bits", unix.SYS_IOCTL, 0, 1<<32|unix.TIOCSTI)
	call("clone newuser", unix.SYS_CLONE, unix.CLONE_NEWUSER)
	call("getpid", unix.SYS_GETPID)
	call("ioctl TIOCSETD", unix.SYS_IOCTL, 0, unix.TIOCSETD)
	call("listmount", unix.SYS_LISTMOUNT)
	call("statmount", unix.SYS_STATMOUNT)
	call("open_tree_attr", unix.SYS_OPEN_TREE_ATTR)
	path := func(p string) uintptr {
		b, err := unix.BytePtrFromString(p)
		if err != nil {
			panic(err)
		}
		return uintptr(unsafe.Pointer(b))
	}
	cwd := unix.AT_FDCWD
	at := uintptr(cwd)
	call6 := func(name string, nr uintptr, a ...uintptr) {
		a = append(a, 0, 0, 0, 0, 0, 0)
		r, _, e := unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
		if e == 0 && (nr == unix.SYS_OPENAT || nr == unix.SYS_OPENAT2) {
			unix.Close(int(r))
		}
		report(name, e)
	}
	call6("chmod 0755", unix.SYS_FCHMODAT, at, path(file), 0o755)
	call6("chmod 04755", unix.SYS_FCHMODAT, at, path(file), 0o4755)
	call6("fchmod 02755", unix.SYS_FCHMOD, uintptr(fd), 0o2755)
	call6("fchmodat 04700", unix.SYS_FCHMODAT, at, path(file), 0o4700)
	call6("fchmodat2 02700", unix.SYS_FCHMODAT2, at, path(file), 0o2700, 0)
	call6("openat O_CREAT 0644", unix.SYS_OPENAT, at, path(filepath.Join(dir, "g")), unix.O_CREAT|unix.O_WRONLY, 0o644)
	call6("openat O_CREAT 04755", unix.SYS_OPENAT, at, path(filepath.Join(dir, "h")), unix.O_CREAT|unix.O_WRONLY, 0o4755)
	how := unix.OpenHow{Flags: unix.O_CREAT | unix.O_WRONLY, Mode: 0o4755}
	call6("openat2", unix.SYS_OPENAT2, at, path(filepath.Join(dir, "i")), uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how))
	call6("mknodat 02644", unix.SYS_MKNODAT, at, path(filepath.Join(dir, "j")), unix.S_IFREG|0o2644, 0)
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		panic(err)
	}
	os.Stdout.WriteString(fmt.Sprintf("setuid bit after the attempts %v\n", st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0))
	sock := func(name string, nr, family, typ, proto uintptr) {
		var fds [2]int32
		r, _, e := unix.Syscall6(nr, family, typ, proto, uintptr(unsafe.Pointer(&fds)), 0, 0)
		if e == 0 {
			if nr == unix.SYS_SOCKET {
				unix.Close(int(r))
			} else {
				unix.Close(int(fds[0]))
				unix.Close(int(fds[1]))
			}
		}
		report(name, e)
	}
	sock("socket AF_UNIX", unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0)
	sock("socket AF_INET", unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_DGRAM, 0)
	sock("socket AF_INET6", unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM, 0)
	sock("socket AF_NETLINK route", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE)
	sock("socket AF_NETLINK audit", unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT)
	sock("socket AF_VSOCK", unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	sock("socket AF_PACKET", unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW, 0)
	sock("socket AF_ALG", unix.SYS_SOCKET, unix.AF_ALG, unix.SOCK_SEQPACKET, 0)
	sock("socket AF_KEY", unix.SYS_SOCKET, unix.AF_KEY, unix.SOCK_RAW, 2)
	sock("socket AF_VSOCK high bits", unix.SYS_SOCKET, 1<<32|unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	sock("socketpair AF_UNIX", unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM, 0)
	sock("socketpair AF_VSOCK", unix.SYS_SOCKETPAIR, unix.AF_VSOCK, unix.SOCK_STREAM, 0)
	if err := exec.Command("/bin/true").Run(); err != nil {
		os.Stdout.WriteString("fork " + err.Error() + "\n")
	} else {
		os.Stdout.WriteString("fork ok\n")
	}
	os.Exit(0)
}

func TestValidRole(t *testing.T) {
	for role, want := range map[string]bool{
		"coder": true, "r": true, "0-reviewer_2.b": true, strings.Repeat("a", 63): true,
		"": false, strings.Repeat("a", 64): false, "Coder": false, "-x": false, ".x": false,
		"a..b": false, "a/b": false, "a b": false, "é": false,
	} {
		if got := validRole(role); got != want {
			t.Errorf("validRole(%q) = %v, want %v", role, got, want)
		}
	}
}

// TestReadStatus feeds what bwrap 0.8 writes on --json-status-fd, split at
// awkward places, for a session that ran and one whose setup failed.
func TestReadStatus(t *testing.T) {
	started := `{ "child-pid": 1199, "cgroup-namespace": 4026532181, "ipc-namespace": 4026532179, "mnt-namespace": 4026532177, "net-namespace": 4026532182, "pid-namespace": 4026532180, "uts-namespace": 4026532178 }` + "\n"
	for _, tc := range []struct {
		name string
		in   string
		want []bwrapStatus
	}{
		{"ran", started + `{ "exit-code": 3 }` + "\n", []bwrapStatus{{1199, "pid:[4026532180]", -1}, {0, "", 3}}},
		{"exit 0", started + `{ "exit-code": 0 }` + "\n", []bwrapStatus{{1199, "pid:[4026532180]", -1}, {0, "", 0}}},
		{"setup failed", started, []bwrapStatus{{1199, "pid:[4026532180]", -1}}},
		{"nothing", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w := io.Pipe()
			go func() {
				for i := 0; i < len(tc.in); i += 7 {
					w.Write([]byte(tc.in[i:min(i+7, len(tc.in))]))
				}
				w.Close()
			}()
			out := make(chan bwrapStatus, 4)
			readStatus(r, out)
			var got []bwrapStatus
			for ev := range out {
				got = append(got, ev)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestLookCommand finds commands as the session will see them, through the
// bind table, before bwrap is started.
func TestLookCommand(t *testing.T) {
	base, flags := layout(t)
	ws := filepath.Join(base, "ws")
	if err := os.WriteFile(filepath.Join(ws, "only-here"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "notes"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Links the caller planted: run (root) does not look where they lead,
	// which would tell the caller whether a file of root's exists; pid 1
	// follows them inside.
	for name, to := range map[string]string{"peek": "/etc/shadow", "gone": "/root/no-such"} {
		if err := os.Symlink(to, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	p, err := plan(t, flags...)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		command string
		path    string // what pid 1 runs
		status  int
	}{
		{"sh", "/usr/bin/sh", 0},
		{"/bin/sh", "/bin/sh", 0},
		{"./only-here", ws + "/only-here", 0},
		{ws + "/only-here", ws + "/only-here", 0},
		{"no-such-command", "", 127},
		{"./no-such", ws + "/no-such", 127},
		{"/opt/not-bound", "/opt/not-bound", 127},
		{"./notes", ws + "/notes", 126},
		{"/etc/passwd", "/etc/passwd", 126},
		{"/usr", "/usr", 126},
		{"only-here", "", 127}, // not on PATH: the workspace is not
		{"./peek", ws + "/peek", 0},
		{"./gone", ws + "/gone", 0},
	} {
		p.Command = []string{tc.command}
		if path, status, msg := p.lookCommand(); status != tc.status || path != tc.path {
			t.Errorf("%s: %q status %d (%s), want %q %d", tc.command, path, status, msg, tc.path, tc.status)
		}
	}
	if got := p.hostPath("/tmp/x", 0); got != filepath.Join(base, "run", "tmp", "x") {
		t.Errorf("/tmp/x maps to %q, want the run's tmp/", got)
	}
	if got := p.hostPath("/proc/1/root", 0); got != "" {
		t.Errorf("/proc/1/root maps to %q, want nothing", got)
	}
}

// freeGID returns a gid /etc/group does not name, so that no user is in it.
func freeGID(t *testing.T) uint32 {
	t.Helper()
	for gid := uint32(54321); gid < 54421; gid++ {
		if groupName(gid) == "" {
			return gid
		}
	}
	t.Fatal("no free gid")
	return 0
}

// socketHome makes base reachable by nobody and the bus home and its
// sockets what bushostd serve --socket-group makes them: home 0710, sockets
// 0660, both of group gid.
func socketHome(t *testing.T, base string, gid uint32) {
	t.Helper()
	nobody, err := lookupPasswd(DefaultUser)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chmod(base, 0o755))
	// The workspace is the session user's; the run directory stays
	// root's, as run requires of one it is given as root.
	must(os.Chown(filepath.Join(base, "ws"), int(nobody.uid), int(nobody.gid)))
	bus := filepath.Join(base, "bus")
	must(os.Chown(bus, 0, int(gid)))
	must(os.Chmod(bus, 0o710))
	for _, s := range []string{"broker.sock", "git.sock"} {
		must(os.Chown(filepath.Join(bus, s), 0, int(gid)))
		must(os.Chmod(filepath.Join(bus, s), 0o660))
	}
}

func TestPlanSocketGroups(t *testing.T) {
	testenv.NeedRoot(t, "only a session started by root is given groups")
	t.Run("the sockets' group is added, once", func(t *testing.T) {
		base, flags := layout(t)
		gid := freeGID(t)
		socketHome(t, base, gid)
		p, err := plan(t, append(flags, "--caps", "git.push.working")...)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Problems) > 0 {
			t.Errorf("problems with the sockets' group given: %q", p.Problems)
		}
		if n := slices.Index(p.User.Groups, gid); n < 0 || slices.Index(p.User.Groups[n+1:], gid) >= 0 || slices.Contains(p.User.Groups, 0) {
			t.Errorf("groups %v, want %d exactly once and never 0", p.User.Groups, gid)
		}
		if len(p.SocketGroups) != 1 || p.SocketGroups[0].GID != gid || len(p.SocketGroups[0].Sockets) != 2 {
			t.Fatalf("socket groups %+v, want %d for both sockets", p.SocketGroups, gid)
		}
		var text, js strings.Builder
		if err := Explain(&text, p, false); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("group: %d (-) for %s %s:", gid, filepath.Join(base, "bus", "broker.sock"), filepath.Join(base, "bus", "git.sock")); !strings.Contains(text.String(), want) {
			t.Errorf("explain does not say %q:\n%s", want, text.String())
		}
		if err := Explain(&js, p, true); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(js.String(), `"socket_groups"`) || !strings.Contains(js.String(), fmt.Sprintf(`"gid": %d`, gid)) {
			t.Errorf("explain --json lacks socket_groups:\n%s", js.String())
		}
	})
	t.Run("an unbound socket's group is not added", func(t *testing.T) {
		base, flags := layout(t)
		gid := freeGID(t)
		socketHome(t, base, gid)
		if err := os.Chown(filepath.Join(base, "bus", "git.sock"), 0, int(gid+1)); err != nil {
			t.Fatal(err)
		}
		p, err := plan(t, append(flags, "--caps", "event.record")...)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(p.User.Groups, gid+1) || len(p.SocketGroups) != 1 || len(p.SocketGroups[0].Sockets) != 1 {
			t.Errorf("groups %v, socket groups %+v: want only the broker socket's %d", p.User.Groups, p.SocketGroups, gid)
		}
	})
	t.Run("group root is never given", func(t *testing.T) {
		base, flags := layout(t)
		socketHome(t, base, 0)
		p, err := plan(t, append(flags, "--caps", "git.push.working")...)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(p.User.Groups, 0) || len(p.SocketGroups) != 0 {
			t.Errorf("groups %v, socket groups %+v: group 0 given", p.User.Groups, p.SocketGroups)
		}
		all := strings.Join(p.Problems, "\n")
		for _, want := range []string{filepath.Join(base, "bus"), "--socket-group"} {
			if !strings.Contains(all, want) {
				t.Errorf("problems do not name %s:\n%s", want, all)
			}
		}
		before, _ := os.ReadDir(filepath.Join(base, "run"))
		if _, err := Run(p, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "--socket-group") {
			t.Errorf("Run: %v, want a refusal naming --socket-group", err)
		}
		if after, _ := os.ReadDir(filepath.Join(base, "run")); len(after) != len(before) {
			t.Errorf("the refused run left %d entries in the run directory, had %d", len(after), len(before))
		}
	})
}

// TestPlanAbstractScope: with --net, the plan scopes the session off
// abstract sockets where the kernel can, and refuses where it cannot
// unless --allow-abstract-sockets says so.
func TestPlanAbstractScope(t *testing.T) {
	_, flags := layout(t)
	real := landlockABI
	t.Cleanup(func() { landlockABI = real })
	for _, tc := range []struct {
		abi     int
		extra   []string
		scope   bool
		problem bool
	}{
		{6, []string{"--net"}, true, false},
		{7, []string{"--net"}, true, false},
		{5, []string{"--net"}, false, true},
		{0, []string{"--net", "--allow-abstract-sockets"}, false, false},
		{0, nil, false, false},
	} {
		landlockABI = func() int { return tc.abi }
		p, err := plan(t, append(flags, tc.extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		problems := strings.Join(p.Problems, "\n")
		if p.ScopeAbstract != tc.scope || strings.Contains(problems, ReasonAbstractScopeMissing) != tc.problem {
			t.Errorf("ABI %d %q: scope %v, problems %q", tc.abi, tc.extra, p.ScopeAbstract, problems)
		}
		var text strings.Builder
		if err := Explain(&text, p, false); err != nil {
			t.Fatal(err)
		}
		if tc.problem && !strings.Contains(text.String(), "--allow-abstract-sockets") {
			t.Errorf("explain on ABI %d does not name --allow-abstract-sockets:\n%s", tc.abi, text.String())
		}
		if !strings.Contains(text.String(), "user: a uid of its own from 61184-65519") && os.Geteuid() == 0 {
			t.Errorf("explain as root does not say the session gets a uid of its own:\n%s", text.String())
		}
		if tc.scope && !strings.Contains(text.String(), "LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET") {
			t.Errorf("explain on ABI %d does not list the scope:\n%s", tc.abi, text.String())
		}
	}
}

// TestLimitUnavailable: where no cgroup can carry a limit, the launch is
// refused with the reason and what was tried, and nothing is made.
func TestLimitUnavailable(t *testing.T) {
	real := cgroupRoot
	t.Cleanup(func() { cgroupRoot = real })
	cgroupRoot = t.TempDir()
	for _, l := range []Limits{{Memory: 64 << 20}, {Pids: 32}, {CPU: 0.5}} {
		c, err := newCgroup(l, nil)
		var r *Refusal
		if c != nil || !errors.As(err, &r) || r.Reason != ReasonLimitUnavailable || !strings.Contains(r.Message, "cgroup v1: no ") || !strings.Contains(r.Message, "cgroup v2: ") {
			t.Errorf("%+v: %v %v, want a LIMIT_UNAVAILABLE refusal saying what was tried", l, c, err)
		}
	}
	if ents, _ := os.ReadDir(cgroupRoot); len(ents) != 0 {
		t.Errorf("the refusal left %d entries", len(ents))
	}
	if c, err := newCgroup(Limits{NoFile: 64, Timeout: time.Second}, nil); c != nil || err != nil {
		t.Errorf("rlimits and a timeout need no cgroup: %v %v", c, err)
	}
	// A parent that is not a session's cgroup v1 directory is refused,
	// never made or nested in.
	for _, parent := range []string{"/etc", filepath.Join(cgroupRoot, "pids", "bushost-sandbox-x"), filepath.Join(cgroupRoot, "pids", "..", "x"), "relative"} {
		c, err := newCgroup(Limits{Pids: 32}, []string{parent})
		var r *Refusal
		if c != nil || !errors.As(err, &r) || r.Reason != ReasonLimitUnavailable || !strings.Contains(r.Message, "--cgroup-parent") {
			t.Errorf("--cgroup-parent %s: %v %v, want a LIMIT_UNAVAILABLE refusal naming it", parent, c, err)
		}
	}
}

func TestExplainLimits(t *testing.T) {
	_, flags := layout(t)
	p, err := plan(t, append(flags, "--memory", "64M", "--pids", "32", "--timeout", "2s", "--nofile", "64")...)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	if err := Explain(&text, p, false); err != nil {
		t.Fatal(err)
	}
	if want := "limits: --memory 67108864 --pids 32 --nofile 64 --timeout 2s"; !strings.Contains(text.String(), want) {
		t.Errorf("explain does not say %q:\n%s", want, text.String())
	}
}

// TestExplainNetwork: explain names the network mode and why; with
// --net=proxy, the relay, each allowed rule with where it comes from and
// what it allows, the proxy's limits, and where its decisions go.
func TestExplainNetwork(t *testing.T) {
	_, flags := layout(t)
	token := filepath.Join(t.TempDir(), "audit.token")
	if err := os.WriteFile(token, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		extra []string
		want  []string
		not   []string
	}{
		{"none", nil, []string{"network: none: a network namespace of its own with only a loopback: no route anywhere"}, []string{"relay:", "allowed:", "egress"}},
		{"host", []string{"--net=host", "--allow-abstract-sockets"}, []string{"network: host: "}, []string{"relay:", "allowed:", "egress"}},
		{"proxy, nothing allowed", []string{"--net=proxy"}, []string{
			"network: proxy: ",
			"relay: 127.0.0.1:3128 (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY point here; NO_PROXY is empty)",
			"allowed: nothing (no --allow-domain or --allow-host): every connection is refused",
			"egress limits: at most 64 connections at once (--egress-conns",
			"closed once idle both ways for 5m0s (--egress-idle)",
			"egress decisions: to sandbox run's stderr",
		}, nil},
		{"proxy, audited", []string{"--net=proxy", "--allow-domain", "*.example.com", "--allow-host", "127.0.0.1:8080",
			"--egress-conns", "3", "--egress-idle", "2s", "--audit-token-file", token}, []string{
			"allowed: --allow-domain *.example.com: given on the command line: the name (or every name under *.), on its :PORT or else on 443 and 80, when it resolves to public addresses only, none of them the host's own",
			"allowed: --allow-host 127.0.0.1:8080: given on the command line: exactly this host and port, even a loopback or private address",
			"egress limits: at most 3 connections at once",
			"idle both ways for 2s (--egress-idle)",
			"egress decisions: to the broker: a network.egress event per decision and per close, on the task of " + token,
		}, []string{"allowed: nothing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := plan(t, append(slices.Clone(flags), tc.extra...)...)
			if err != nil {
				t.Fatal(err)
			}
			var text strings.Builder
			if err := Explain(&text, p, false); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(text.String(), w) {
					t.Errorf("explain lacks %q:\n%s", w, text.String())
				}
			}
			for _, w := range tc.not {
				if strings.Contains(text.String(), w) {
					t.Errorf("explain has %q:\n%s", w, text.String())
				}
			}
		})
	}
}

// TestPlanDisk: --disk holds only when the run directory is on a tmpfs of
// at most its size, which the plan checks (a problem, so run refuses,
// otherwise); explain says whether the workspace shares it.
func TestPlanDisk(t *testing.T) {
	base, flags := layout(t)
	p, err := plan(t, append(flags, "--disk", "64M")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(p.Problems, "\n"), "LIMIT_UNAVAILABLE: --disk 67108864: the run directory "+filepath.Join(base, "run")+" is not on a tmpfs of at most that size") {
		t.Errorf("a run directory on the host's disk: problems %q", p.Problems)
	}
	p.Close()
	testenv.NeedRoot(t, "mounts a tmpfs")
	disk := filepath.Join(base, "disk")
	if err := os.Mkdir(disk, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := MountDisk(disk, 64<<20); err != nil {
		t.Fatal(err)
	}
	defer UnmountDisk(disk)
	for _, d := range []string{"run", "ws"} {
		if err := os.Mkdir(filepath.Join(disk, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(disk, "run", "session.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	on := slices.Clone(flags)
	on[slices.Index(on, "--run-dir")+1] = filepath.Join(disk, "run")
	for _, c := range []struct {
		ws, size, problem, note string
	}{
		{filepath.Join(disk, "ws"), "64M", "", "the run directory (HOME, /tmp) and the workspace share one tmpfs"},
		{filepath.Join(base, "ws"), "64M", "", "the workspace " + filepath.Join(base, "ws") + " is the caller's own, outside it"},
		{filepath.Join(disk, "ws"), "32M", "is not on a tmpfs of at most that size", ""},
	} {
		args := slices.Clone(on)
		args[slices.Index(args, "--workspace")+1] = c.ws
		p, err := plan(t, append(args, "--disk", c.size)...)
		if err != nil {
			t.Fatal(err)
		}
		// Only the disk's: the layout's broker socket is not the
		// session user's to reach, which is another problem.
		var problems string
		for _, pr := range p.Problems {
			if strings.Contains(pr, "--disk") {
				problems += pr
			}
		}
		notes := strings.Join(p.Notes, "\n")
		p.Close()
		if c.problem == "" && problems != "" || !strings.Contains(problems, c.problem) || !strings.Contains(notes, c.note) {
			t.Errorf("--disk %s, workspace %s: problems %q, notes %q", c.size, c.ws, problems, notes)
		}
	}
}
