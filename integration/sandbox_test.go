package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
	"golang.org/x/sys/unix"
)

// sandboxEnv is one agent's world on the host: a base directory outside
// /tmp (the session's private /tmp would hide a bind under the host's) with
// the workspace, the run directory, a bus host home with its sockets, and
// things the session must never see: a second workspace, the data root's
// admin token and repositories, a host user's ~/.ssh.
type sandboxEnv struct {
	sandbox   string
	base      string
	ws        string
	run       string
	otherWS   string
	busHost   string
	broker    string
	gitSock   string
	hostHome  string
	tools     string
	helper    string
	secret    string
	uid, gid  int
	listeners []net.Listener
}

func newSandboxEnv(t testing.TB) *sandboxEnv {
	t.Helper()
	sb := bin(t, "sandbox")
	helper := escapeHelper(t)
	base, err := os.MkdirTemp("/var/tmp", "sandbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e := &sandboxEnv{
		sandbox: sb, base: base,
		ws: filepath.Join(base, "ws"), run: filepath.Join(base, "run"), otherWS: filepath.Join(base, "other-ws"),
		busHost: filepath.Join(base, "bus-host"), hostHome: filepath.Join(base, "home", "alice"),
		tools: filepath.Join(base, "tools"), secret: randomHex(t),
		uid: os.Getuid(), gid: os.Getgid(),
	}
	e.broker = filepath.Join(e.busHost, "broker.sock")
	e.gitSock = filepath.Join(e.busHost, "git.sock")
	e.helper = filepath.Join(e.tools, "escape")
	if os.Geteuid() == 0 {
		e.uid, e.gid = 65534, 65534 // nobody, the sandbox's default session user
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Parents the session user must traverse are 0755 or 0711, as a
	// deployment would make them; secrets stay 0600/0700.
	must(os.Chmod(base, 0o755))
	for _, d := range []string{e.ws, e.run, e.otherWS, e.tools, filepath.Join(e.busHost, "repos", "acme"), filepath.Join(e.hostHome, ".ssh")} {
		must(os.MkdirAll(d, 0o755))
	}
	must(os.Chmod(e.busHost, 0o711))
	must(os.Chmod(filepath.Join(e.hostHome, ".ssh"), 0o700))
	must(os.WriteFile(filepath.Join(e.hostHome, ".ssh", "id_ed25519"), []byte(e.secret), 0o600))
	must(os.WriteFile(filepath.Join(e.otherWS, "notes.txt"), []byte(e.secret), 0o644))
	must(os.WriteFile(filepath.Join(e.busHost, "admin.token"), []byte(e.secret), 0o600))
	must(os.WriteFile(filepath.Join(e.run, "session.json"), []byte(`{"task":"t1"}`), 0o644))
	must(copyFile(helper, e.helper))
	// The run directory stays its maker's: run refuses one another user
	// owns or can write.
	must(os.Chown(e.ws, e.uid, e.gid))
	e.broker = e.listen(t, e.broker)
	e.gitSock = e.listen(t, e.gitSock)
	// The first launch makes home/, tmp/ and bundle/; what follows must
	// leave the tree as this run left it.
	if out, errOut, code := e.runIn(t, nil, "true"); code != 0 {
		t.Fatalf("sandbox run true: exit %d\n%s%s", code, out, errOut)
	}
	return e
}

// listen makes a real listening socket as a stand-in for bushostd's.
func (e *sandboxEnv) listen(t testing.TB, path string) string {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	e.listeners = append(e.listeners, l)
	return path
}

func (e *sandboxEnv) flags(caps string) []string {
	return []string{"--run-dir", e.run, "--workspace", e.ws, "--role", "coder", "--caps", caps,
		"--broker-socket", e.broker, "--git-socket", e.gitSock, "--ro", e.tools}
}

// runIn runs COMMAND in the session as an agent would, with the role
// holding git.push.working unless flags say otherwise.
func (e *sandboxEnv) runIn(t testing.TB, extra []string, command ...string) (string, string, int) {
	t.Helper()
	args := append([]string{"run"}, e.flags("git.push.working,review.request")...)
	args = append(args, extra...)
	args = append(append(args, "--"), command...)
	return runSandbox(t, e.sandbox, args...)
}

func runSandbox(t testing.TB, sandbox string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(sandbox, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	default:
		t.Fatalf("run sandbox: %v", err)
		return "", "", -1
	}
}

// snapshot lists every path under the base directory with its type, size
// and mode: a mount-point directory or a file an escape left behind shows.
func (e *sandboxEnv) snapshot(t testing.TB) map[string]string {
	t.Helper()
	snap := map[string]string{}
	err := filepath.WalkDir(e.base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		size := info.Size()
		if info.IsDir() {
			size = 0
		}
		snap[p] = fmt.Sprintf("%v %d", info.Mode(), size)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func (e *sandboxEnv) assertUnchanged(t *testing.T, before map[string]string) {
	t.Helper()
	after := e.snapshot(t)
	var diff []string
	for p, v := range after {
		if before[p] != v {
			diff = append(diff, fmt.Sprintf("%s: %q -> %q", p, before[p], v))
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			diff = append(diff, p+": removed")
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Errorf("the attempt left traces on the host:\n  %s", strings.Join(diff, "\n  "))
	}
}

// attempt runs an escape and requires it to fail: a non-zero exit, no
// secret in its output, and the host tree exactly as before.
func (e *sandboxEnv) attempt(t *testing.T, extra []string, command ...string) (string, string) {
	t.Helper()
	before := e.snapshot(t)
	out, errOut, code := e.runIn(t, extra, command...)
	t.Logf("%q: exit %d\nstdout: %s\nstderr: %s", command, code, out, errOut)
	if code == 0 {
		t.Errorf("escape %q succeeded:\n%s%s", command, out, errOut)
	}
	if strings.Contains(out+errOut, e.secret) {
		t.Errorf("escape %q printed a host secret", command)
	}
	if strings.Contains(out, "ESCAPED") {
		t.Errorf("escape %q: helper reports success: %s", command, out)
	}
	e.assertUnchanged(t, before)
	return out, errOut
}

// helperRefused runs the escape helper and requires it to say REFUSED.
func (e *sandboxEnv) helperRefused(t *testing.T, extra []string, args ...string) string {
	t.Helper()
	out, _ := e.attempt(t, extra, append([]string{e.helper}, args...)...)
	if !strings.Contains(out, "REFUSED") {
		t.Errorf("escape helper %q did not report a refusal: %s", args, out)
	}
	return out
}

func TestSandboxEscape(t *testing.T) {
	e := newSandboxEnv(t)
	mark := "escape-" + e.secret[:8]

	t.Run("read host ~/.ssh", func(t *testing.T) {
		e.attempt(t, nil, "cat", filepath.Join(e.hostHome, ".ssh", "id_ed25519"))
		e.attempt(t, nil, "ls", "-a", filepath.Join(e.hostHome, ".ssh"))
		if home, err := os.UserHomeDir(); err == nil {
			e.attempt(t, nil, "ls", "-a", filepath.Join(home, ".ssh"))
			e.attempt(t, nil, "ls", "-a", filepath.Join(home, ".config"))
		}
	})

	t.Run("write system and read-only run files", func(t *testing.T) {
		sessionJSON := filepath.Join(e.run, "session.json")
		bundle := filepath.Join(e.run, "bundle")
		for _, target := range []string{"/usr/" + mark, "/etc/" + mark, "/" + mark, "/usr/bin/" + mark, filepath.Join(bundle, mark)} {
			e.attempt(t, nil, "touch", target)
			if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s exists on the host after the attempt", target)
				os.Remove(target)
			}
		}
		e.attempt(t, nil, "sh", "-c", "echo forged > "+sessionJSON)
		e.attempt(t, nil, "rm", "-f", sessionJSON)
		e.attempt(t, nil, "mv", sessionJSON, sessionJSON+".old")
		e.attempt(t, nil, "rmdir", bundle)
		if data, err := os.ReadFile(sessionJSON); err != nil || string(data) != `{"task":"t1"}` {
			t.Errorf("session.json changed: %q %v", data, err)
		}
	})

	t.Run("see another workspace or the data root", func(t *testing.T) {
		e.attempt(t, nil, "ls", e.otherWS)
		e.attempt(t, nil, "cat", filepath.Join(e.otherWS, "notes.txt"))
		e.attempt(t, nil, "cat", filepath.Join(e.busHost, "admin.token"))
		e.attempt(t, nil, "ls", filepath.Join(e.busHost, "repos"))
		out, errOut, code := e.runIn(t, nil, "ls", "-a", e.busHost)
		if code != 0 || strings.Join(strings.Fields(out), " ") != ". .. broker.sock git.sock" {
			t.Errorf("bus host home inside: exit %d, %q %s; want only the two sockets", code, out, errOut)
		}
	})

	t.Run("host processes in /proc and kill -0", func(t *testing.T) {
		host := exec.Command("sleep", "3600."+strconv.Itoa(os.Getpid()))
		if err := host.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { host.Process.Kill(); host.Wait() }()
		pid := strconv.Itoa(host.Process.Pid)
		out, _, code := e.runIn(t, nil, "sh", "-c", "ls /proc | grep -E '^[0-9]+$'; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
		if code != 0 {
			t.Fatalf("list /proc: exit %d", code)
		}
		if strings.Contains(out, "3600."+strconv.Itoa(os.Getpid())) {
			t.Errorf("a host process is visible in the session's /proc:\n%s", out)
		}
		for _, f := range strings.Fields(out) {
			if f == pid {
				t.Errorf("host pid %s listed in the session's /proc", pid)
			}
		}
		e.attempt(t, nil, "kill", "-0", pid)
		e.attempt(t, nil, "cat", "/proc/"+pid+"/cmdline")
	})

	t.Run("open /proc/1/root to reach the host root", func(t *testing.T) {
		e.attempt(t, nil, "cat", "/proc/1/root"+filepath.Join(e.otherWS, "notes.txt"))
		e.attempt(t, nil, "sh", "-c", "cat /proc/*/root"+filepath.Join(e.hostHome, ".ssh", "id_ed25519"))
		e.attempt(t, nil, "sh", "-c", "cat /proc/*/cwd"+filepath.Join(e.otherWS, "notes.txt"))
		e.attempt(t, nil, "sh", "-c", "cat /proc/1/fd/*")
		e.attempt(t, nil, "ls", "/proc/1/root/")
		e.attempt(t, nil, "ls", "/proc/1/fd/")
		// pid 1 is the sandbox's init, running as the session user inside
		// the session's namespaces: non-dumpable, so its root, cwd and
		// descriptors are closed to the session, and without a capability.
		before := e.snapshot(t)
		out, errOut, code := e.runIn(t, nil, "sh", "-c", `
tr '\0' ' ' < /proc/1/cmdline; echo
for f in root cwd fd/0 fd/3; do readlink /proc/1/$f > /dev/null 2>&1 && echo "$f reachable"; done
grep -E '^(Uid|Gid|Cap[A-Za-z]+):' /proc/1/status
echo "me $(id -u) $(id -g)"`)
		e.assertUnchanged(t, before)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		// The session user: the caller, or as root a uid (and gid) of the
		// session's own, never 0.
		me := strings.Fields(lines[len(lines)-1])
		lines = lines[:len(lines)-1]
		if len(me) != 3 || me[0] != "me" || me[1] == "0" || me[2] != me[1] && os.Geteuid() == 0 {
			t.Fatalf("session user %q", me)
		}
		if code != 0 || len(lines) < 8 || !strings.HasPrefix(lines[0], "/run/sandbox/init init ") {
			t.Fatalf("pid 1 is not the sandbox's init: exit %d %q %s", code, out, errOut)
		}
		for _, line := range lines[1:] {
			f := strings.Fields(line)
			switch {
			case strings.HasSuffix(line, "reachable"):
				t.Errorf("the session can follow pid 1's %s", f[0])
			case f[0] == "Uid:" || f[0] == "Gid:":
				want := me[1]
				if f[0] == "Gid:" {
					want = me[2]
				}
				for _, id := range f[1:] {
					if id != want {
						t.Errorf("pid 1 %s, want %s throughout (the session user)", line, want)
						break
					}
				}
			case strings.HasPrefix(f[0], "Cap") && f[0] != "CapBnd:" && f[1] != "0000000000000000":
				t.Errorf("pid 1 holds a capability: %s", line)
			}
		}
		if !strings.Contains(out, "CapEff:\t0000000000000000") {
			t.Errorf("pid 1's CapEff is not 0: %q", out)
		}
	})

	t.Run("a descriptor the caller left open", func(t *testing.T) {
		secret, err := os.Open(filepath.Join(e.hostHome, ".ssh", "id_ed25519"))
		if err != nil {
			t.Fatal(err)
		}
		defer secret.Close()
		args := append([]string{"run"}, e.flags("event.record")...)
		cmd := exec.Command(e.sandbox, append(args, "--", "sh", "-c", `ls /proc/$$/fd; cat <&6`)...)
		// fds 3 to 6 without close-on-exec: run puts its own at 3 and 4.
		cmd.ExtraFiles = []*os.File{secret, secret, secret, secret}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err = cmd.Run()
		if strings.Contains(out.String(), e.secret) || strings.Join(strings.Fields(out.String()), " ") != "0 1 2" {
			t.Errorf("the session sees descriptors %q (%v, %s), want only 0 1 2", out.String(), err, errOut.String())
		}
	})

	t.Run("ptrace", func(t *testing.T) { e.helperRefused(t, nil, "ptrace") })
	t.Run("keyctl", func(t *testing.T) { e.helperRefused(t, nil, "keyctl") })
	t.Run("other refused system calls", func(t *testing.T) { e.helperRefused(t, nil, "syscalls") })

	t.Run("create a user namespace", func(t *testing.T) {
		e.helperRefused(t, nil, "userns")
		e.attempt(t, nil, "unshare", "--user", "--map-root-user", "true")
	})

	t.Run("mount anything", func(t *testing.T) {
		e.helperRefused(t, nil, "mount", e.ws)
		e.attempt(t, nil, "mount", "-t", "tmpfs", "none", e.ws)
		e.attempt(t, nil, "mount", "--bind", "/", e.ws)
	})

	t.Run("git socket without the capability", func(t *testing.T) {
		args := []string{"run"}
		for i, f := range e.flags("review.request,event.record") {
			args = append(args, f)
			_ = i
		}
		before := e.snapshot(t)
		out, errOut, code := runSandbox(t, e.sandbox, append(args, "--", e.helper, "connect", e.gitSock)...)
		if code != 3 || !strings.Contains(out, "REFUSED") || !strings.Contains(out, "no such file") {
			t.Errorf("connect to git.sock as a reviewer-requester: exit %d, %s%s; want REFUSED, no such file", code, out, errOut)
		}
		e.assertUnchanged(t, before)
		// The control: a role that holds git.push.working connects.
		out, errOut, code = e.runIn(t, nil, e.helper, "connect", e.gitSock)
		if code != 0 || !strings.Contains(out, "ESCAPED") {
			t.Errorf("control: git.push.working role could not connect: exit %d %s%s", code, out, errOut)
		}
	})

	t.Run("capabilities in CapEff", func(t *testing.T) {
		out, _, code := e.runIn(t, nil, "sh", "-c", "grep ^Cap /proc/self/status; sh -c 'grep ^Cap /proc/self/status'")
		if code != 0 || strings.Count(out, "Cap") != 10 {
			t.Fatalf("read capabilities: exit %d %q", code, out)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) != 2 || f[1] != "0000000000000000" {
				t.Errorf("capability held in the session: %q", line)
			}
		}
	})

	t.Run("socket families beyond unix, inet and netlink route", func(t *testing.T) {
		out := e.helperRefused(t, nil, "families")
		if !strings.Contains(out, "refused socket AF_VSOCK") {
			t.Errorf("without --net: %s", out)
		}
		out = e.helperRefused(t, []string{"--net"}, "families")
		if !strings.Contains(out, "refused socketpair AF_ALG") {
			t.Errorf("with --net: %s", out)
		}
	})

	t.Run("the host's abstract Unix sockets", func(t *testing.T) {
		name := "bushost-test-" + e.secret[:12]
		l, err := net.Listen("unix", "@"+name)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		accepted := make(chan string, 8)
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					close(accepted)
					return
				}
				b := make([]byte, 64)
				n, _ := c.Read(b)
				c.Close()
				accepted <- string(b[:n])
			}
		}()
		// The control: from the host, the helper connects.
		if out, err := exec.Command(e.helper, "abstract", name).CombinedOutput(); err != nil || !strings.Contains(string(out), "ESCAPED") {
			t.Fatalf("control: the helper could not reach @%s from the host: %v %s", name, err, out)
		}
		if got := <-accepted; got != "from the session\n" {
			t.Fatalf("control: the listener read %q", got)
		}
		e.helperRefused(t, nil, "abstract", name)
		out := e.helperRefused(t, []string{"--net"}, "abstract", name)
		if !strings.Contains(out, "operation not permitted") {
			t.Errorf("with --net: %s; want EPERM from Landlock's scope", out)
		}
		l.Close()
		for got := range accepted {
			t.Errorf("the host's listener on @%s accepted a connection from a session: %q", name, got)
		}
	})

	t.Run("network without --net", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		e.helperRefused(t, nil, "tcp", l.Addr().String())
		e.helperRefused(t, nil, "tcp", "1.1.1.1:53")
		out, errOut, code := e.runIn(t, []string{"--net"}, e.helper, "tcp", l.Addr().String())
		if code != 0 {
			t.Errorf("control: with --net the session could not reach the host: exit %d %s%s", code, out, errOut)
		}
	})
}

func randomHex(t testing.TB) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, data, 0o755)
}

// emptyHome does what a host does between two sessions in one run
// directory: a session starts with an empty HOME, and run refuses otherwise.
func (e *sandboxEnv) emptyHome(t *testing.T) {
	t.Helper()
	home := filepath.Join(e.run, "home")
	ents, err := os.ReadDir(home)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range ents {
		if err := os.RemoveAll(filepath.Join(home, ent.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSandboxWorks(t *testing.T) {
	e := newSandboxEnv(t)

	t.Run("workspace writable", func(t *testing.T) {
		out, errOut, code := e.runIn(t, nil, "sh", "-c", "echo made-inside > made.txt && cat made.txt")
		if code != 0 || out != "made-inside\n" {
			t.Fatalf("write the workspace: exit %d %q %s", code, out, errOut)
		}
		st, err := os.Stat(filepath.Join(e.ws, "made.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != e.uid {
			t.Errorf("file made inside is owned by uid %d on the host, want %d", uid, e.uid)
		}
	})

	t.Run("git commit", func(t *testing.T) {
		script := `set -e
git init -q -b main
echo 'package main' > main.go
git add main.go
git -c user.name=agent -c user.email=agent@example.com commit -q -m "made inside the sandbox"
git log --format=%s`
		out, errOut, code := e.runIn(t, nil, "sh", "-c", script)
		if code != 0 || !strings.Contains(out, "made inside the sandbox") {
			t.Fatalf("git commit inside: exit %d %q %s", code, out, errOut)
		}
		log, err := exec.Command("git", "-C", e.ws, "-c", "safe.directory=*", "log", "--format=%s").Output()
		if err != nil || strings.TrimSpace(string(log)) != "made inside the sandbox" {
			t.Errorf("host sees git log %q, %v", log, err)
		}
		e.emptyHome(t)
	})

	t.Run("gcc and fork/exec", func(t *testing.T) {
		if _, err := exec.LookPath("gcc"); err != nil {
			testenv.Missing(t, "gcc", "building C inside the session")
		}
		if err := os.WriteFile(filepath.Join(e.ws, "hello.c"), []byte("#include <stdio.h>\nint main(void){puts(\"hello from c\");return 0;}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := e.runIn(t, nil, "sh", "-c", "gcc -o hello hello.c && ./hello && "+e.helper+" fork")
		if code != 0 || out != "hello from c\nforked\n" {
			t.Fatalf("gcc inside: exit %d %q %s", code, out, errOut)
		}
	})

	t.Run("go build", func(t *testing.T) {
		goBin, err := exec.LookPath("go")
		if err != nil {
			testenv.Missing(t, "go", "building Go inside the session")
		}
		if goBin, err = filepath.EvalSymlinks(goBin); err != nil || !strings.HasPrefix(goBin, "/usr/") {
			testenv.Missing(t, "go under /usr", "building Go inside the session: go at %s is not under /usr, so the session does not see it", goBin)
		}
		if testing.Short() {
			t.Skip("builds the standard library from scratch in the session's empty HOME")
		}
		if err := os.WriteFile(filepath.Join(e.ws, "hello.go"), []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello from go\") }\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer e.emptyHome(t)
		out, errOut, code := e.runIn(t, []string{"--env", "GOTOOLCHAIN=local", "--env", "GOFLAGS=-mod=mod"}, goBin, "run", "hello.go")
		if code != 0 || out != "hello from go\n" {
			t.Fatalf("go run inside: exit %d %q %s", code, out, errOut)
		}
	})

	t.Run("exit status", func(t *testing.T) {
		if _, _, code := e.runIn(t, nil, "sh", "-c", "exit 42"); code != 42 {
			t.Errorf("exit 42 inside: sandbox run exited %d", code)
		}
		if _, errOut, code := e.runIn(t, nil, "no-such-command"); code != 127 || !strings.Contains(errOut, "not found") {
			t.Errorf("missing command: exit %d %s, want 127", code, errOut)
		}
		if _, _, code := e.runIn(t, nil, "sh", "-c", "kill -KILL $$"); code != 128+9 {
			t.Errorf("command killed by SIGKILL: exit %d, want 137", code)
		}
	})

	t.Run("HOME empty, private /tmp on disk", func(t *testing.T) {
		out, errOut, code := e.runIn(t, nil, "sh", "-c", `ls -A "$HOME"; echo "home=$HOME"; echo kept > /tmp/kept; stat -c %a "$HOME" /tmp`)
		want := fmt.Sprintf("home=%s\n700\n700\n", filepath.Join(e.run, "home"))
		if code != 0 || out != want {
			t.Fatalf("exit %d %q %s, want %q", code, out, errOut, want)
		}
		if data, err := os.ReadFile(filepath.Join(e.run, "tmp", "kept")); err != nil || string(data) != "kept\n" {
			t.Errorf("/tmp is not the run's tmp/: %q %v", data, err)
		}
	})

	t.Run("orphans reaped", func(t *testing.T) {
		// Five double-forked orphans: their parent exits at once, so they
		// are pid 1's children, and once killed only pid 1 can reap them,
		// while the command is still running. Every wait is for a
		// condition (bounded at 10 s), so a loaded machine only slows it.
		out, errOut, code := e.runIn(t, nil, "sh", "-c", `
sh -c 'for i in 1 2 3 4 5; do sleep 300 & done; exit 0'
orphans() {
	for p in /proc/[0-9]*; do
		[ "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" = "sleep 300 " ] && echo ${p#/proc/}
	done
}
i=0
while [ $i -lt 100 ]; do
	set -- $(orphans)
	[ $# -eq 5 ] && break
	sleep 0.1; i=$((i+1))
done
pids="$*"
for p in $pids; do grep '^PPid:' /proc/$p/status; done
kill $pids
i=0
while [ $i -lt 100 ]; do
	left=0
	for p in $pids; do [ -e /proc/$p ] && left=1; done
	[ $left = 0 ] && break
	sleep 0.1; i=$((i+1))
done
grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null
echo done`)
		want := strings.Repeat("PPid:\t1\n", 5) + "done\n"
		if code != 0 || out != want {
			t.Errorf("orphans not adopted and reaped by pid 1: exit %d %q %s; want %q", code, out, errOut, want)
		}
	})
}

// TestSandboxSignals checks the session's pid 1: the signals sandbox run
// forwards reach the command, whose status becomes run's, and killing bwrap
// outside kills the whole session even when sandbox run is gone first.
func TestSandboxSignals(t *testing.T) {
	e := newSandboxEnv(t)
	// start runs script in a session until it touches "started". Its
	// output goes to a file, not a pipe: a session outliving sandbox run
	// would hold a pipe open and keep exec's Wait waiting.
	start := func(t *testing.T, script string) (*exec.Cmd, func() string) {
		os.Remove(filepath.Join(e.ws, "started"))
		args := append([]string{"run"}, e.flags("event.record")...)
		cmd := exec.Command(e.sandbox, append(args, "--", "sh", "-c", script)...)
		out, err := os.Create(filepath.Join(t.TempDir(), "out"))
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(20 * time.Second); ; {
			if _, err := os.Stat(filepath.Join(e.ws, "started")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				data, _ := os.ReadFile(out.Name())
				t.Fatalf("the session never touched started: %s", data)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The session outlives a killed sandbox run by design: whatever
		// the test does, its bwrap (and with it the session) is killed at
		// the end, through a pidfd taken while it is sure to be bwrap.
		for _, c := range unprivilegedChildrenOf(t, cmd.Process.Pid) {
			if fd, err := unix.PidfdOpen(c, 0); err == nil {
				t.Cleanup(func() {
					unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
					unix.Close(fd)
				})
			}
		}
		return cmd, func() string {
			data, _ := os.ReadFile(out.Name())
			return string(data)
		}
	}

	// A session process signalling pid 1 with what would crash a Go
	// program cannot end the session with a status not its command's.
	t.Run("crash signals to pid 1 are dropped", func(t *testing.T) {
		_, errOut, code := e.runIn(t, nil, "sh", "-c",
			`for s in ABRT ILL TRAP SYS SEGV BUS FPE PIPE; do kill -$s 1 || exit 3; done; sleep 0.3; exit 7`)
		if code != 7 {
			t.Fatalf("exit %d, want 7 (the command's); stderr %q", code, errOut)
		}
		if strings.Contains(errOut, "goroutine") || strings.Contains(errOut, "SIGABRT") {
			t.Fatalf("pid 1 crashed: %q", errOut)
		}
	})

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1} {
		name := strings.TrimPrefix(unix.SignalName(sig), "SIG")
		t.Run(name+" reaches the command", func(t *testing.T) {
			got := filepath.Join(e.ws, "got")
			os.Remove(got)
			cmd, out := start(t, `trap 'echo `+name+` > got; exit 7' `+name+`; touch started; while :; do sleep 0.05; done`)
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 7 {
				t.Errorf("after %s: %v, output %q; want exit 7, the command's", name, err, out())
			}
			if data, err := os.ReadFile(got); err != nil || string(data) != name+"\n" {
				t.Errorf("the command's trap did not run: %q %v", data, err)
			}
		})
	}

	t.Run("SIGTERM at once is not lost", func(t *testing.T) {
		// Sent before pid 1 catches signals (a namespace's pid 1 drops the
		// others): run holds it until pid 1 is ready. The command either
		// has its trap by then (7) or dies of it (143); a lost signal
		// leaves it looping.
		args := append([]string{"run"}, e.flags("event.record")...)
		cmd := exec.Command(e.sandbox, append(args, "--", "sh", "-c", `trap 'exit 7' TERM; while :; do sleep 0.05; done`)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// sandbox run catches SIGTERM before it starts bwrap: send it as
		// soon as bwrap shows, while the session is still being built.
		for deadline := time.Now().Add(10 * time.Second); len(childrenOf(t, cmd.Process.Pid)) == 0; time.Sleep(200 * time.Microsecond) {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatal("sandbox run started no bwrap")
			}
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || (ee.ExitCode() != 7 && ee.ExitCode() != 128+15) {
				t.Errorf("after an early SIGTERM: %v; want exit 7 or 143", err)
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Fatal("an early SIGTERM was lost: the command still runs")
		}
	})

	t.Run("session dies with bwrap after sandbox run", func(t *testing.T) {
		// A host that dies hard leaves bwrap and the session running; when
		// bwrap dies too, pid 1's parent-death signal ends the session,
		// with no sandbox run left to clean up.
		// sleep takes fractions: the digits make its arguments unique.
		mark := strconv.Itoa(os.Getpid()) + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
		cmdMark, orphanMark := "300."+mark, "301."+mark
		cmd, _ := start(t, `sh -c 'sleep `+orphanMark+` & exit 0'; touch started; exec sleep `+cmdMark)
		defer cmd.Process.Kill()
		bwrap := unprivilegedChildrenOf(t, cmd.Process.Pid)
		if len(bwrap) != 1 {
			t.Fatalf("sandbox run has children %v not root's, want bwrap alone", bwrap)
		}
		bwrapFD, err := unix.PidfdOpen(bwrap[0], 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(bwrapFD)
		// The orphan may not have exec'd sleep yet.
		session := withArg(t, cmdMark, orphanMark)
		for deadline := time.Now().Add(5 * time.Second); len(session) != 2 && time.Now().Before(deadline); session = withArg(t, cmdMark, orphanMark) {
			time.Sleep(10 * time.Millisecond)
		}
		if len(session) != 2 {
			t.Fatalf("session processes %v, want the command and its orphan", session)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		time.Sleep(300 * time.Millisecond)
		if left := withArg(t, cmdMark, orphanMark); len(left) != 2 {
			t.Fatalf("the session did not outlive sandbox run (%v left of %v): it must survive a host that died hard", left, session)
		}
		if err := unix.PidfdSendSignal(bwrapFD, unix.SIGKILL, nil, 0); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Second)
		for left := withArg(t, cmdMark, orphanMark); len(left) > 0; left = withArg(t, cmdMark, orphanMark) {
			if time.Now().After(deadline) {
				for _, pid := range left {
					syscall.Kill(pid, syscall.SIGKILL)
				}
				t.Fatalf("session processes %v outlived bwrap by 2s", left)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	t.Run("session dies with bwrap", func(t *testing.T) {
		cmd, _ := start(t, `touch started; exec sleep 3600`)
		defer cmd.Process.Kill()
		bwrap := unprivilegedChildrenOf(t, cmd.Process.Pid)
		if len(bwrap) != 1 {
			t.Fatalf("sandbox run has children %v not root's, want bwrap alone", bwrap)
		}
		session := descendants(t, bwrap[0])
		if len(session) == 0 {
			t.Fatal("no session processes under bwrap")
		}
		if err := syscall.Kill(bwrap[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+9 {
			t.Errorf("sandbox run after bwrap was killed: %v, want exit 137", err)
		}
		for _, pid := range session {
			if alive(pid) {
				t.Errorf("session process %d outlived bwrap and sandbox run", pid)
			}
		}
	})
}

// withArg lists the live processes on the host with any of args on their
// command line.
func withArg(t *testing.T, args ...string) []int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue // gone meanwhile
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		for _, a := range strings.Split(string(data), "\x00") {
			if slices.Contains(args, a) && alive(pid) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

func waitFor(t *testing.T, path string) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, path+" to appear", func() bool {
		_, err := os.Stat(path)
		return err == nil
	})
}

// childrenOf reads every thread's children list: a Go parent forks from
// whichever thread it is on.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	files, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil || len(files) == 0 {
		t.Fatalf("children of %d: %v", pid, err)
	}
	var pids []int
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			continue // the thread ended
		}
		for _, f := range strings.Fields(string(data)) {
			n, _ := strconv.Atoi(f)
			pids = append(pids, n)
		}
	}
	return pids
}

// unprivilegedChildrenOf is childrenOf without root's: sandbox run's
// bwrap runs as the session's uid, and the helpers that made its
// idmapped mounts (killed, reaped at its end) are root's.
func unprivilegedChildrenOf(t *testing.T, pid int) []int {
	t.Helper()
	var pids []int
	for _, c := range childrenOf(t, pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c))
		if err != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Uid:"); ok {
				if f := strings.Fields(v); len(f) > 0 && f[0] != "0" {
					pids = append(pids, c)
				}
			}
		}
	}
	return pids
}

func descendants(t *testing.T, pid int) []int {
	t.Helper()
	var all []int
	for _, c := range childrenOf(t, pid) {
		all = append(all, c)
		all = append(all, descendants(t, c)...)
	}
	return all
}

// alive is true while pid exists and is not a zombie.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func TestSandboxRefusals(t *testing.T) {
	e := newSandboxEnv(t)
	withFlag := func(name, value string) []string {
		f := e.flags("git.push.working")
		for i := range f {
			if f[i] == name {
				f[i+1] = value
			}
		}
		return f
	}
	tmpWS := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"workspace under /tmp", withFlag("--workspace", tmpWS), 125, "under /tmp, which the session's private /tmp hides"},
		{"unknown capability", e.flags("git.push.everything"), 2, `unknown capability "git.push.everything"`},
		{"bwrap missing", append(e.flags("git.push.working"), "--bwrap", "/nonexistent/bwrap"), 125, "sandbox-unavailable:"},
		{"bwrap failing", append(e.flags("git.push.working"), "--bwrap", "/bin/false"), 125, "sandbox-unavailable:"},
		{"run as root", append(e.flags("git.push.working"), "--user", "root"), 125, "never runs as uid or gid 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.snapshot(t)
			marker := filepath.Join(e.ws, "ran")
			out, errOut, code := runSandbox(t, e.sandbox, append(append([]string{"run"}, tc.args...), "--", "touch", marker)...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut, tc.code, tc.want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the command ran unconfined or anyway: %s", out)
			}
			e.assertUnchanged(t, before)
		})
	}
	t.Run("probe", func(t *testing.T) {
		out, errOut, code := runSandbox(t, e.sandbox, "probe")
		if code != 0 || !strings.HasPrefix(out, "ok:") {
			t.Errorf("probe: exit %d %q %s", code, out, errOut)
		}
		_, errOut, code = runSandbox(t, e.sandbox, "probe", "--bwrap", "/bin/false")
		if code != 1 || !strings.HasPrefix(errOut, "sandbox-unavailable:") {
			t.Errorf("probe with a failing bwrap: exit %d %q", code, errOut)
		}
	})
	t.Run("home not empty", func(t *testing.T) {
		stale := filepath.Join(e.run, "home", ".bash_history")
		if err := os.WriteFile(stale, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(stale)
		_, errOut, code := e.runIn(t, nil, "true")
		if code != 125 || !strings.Contains(errOut, "not empty") {
			t.Errorf("stale HOME: exit %d %q", code, errOut)
		}
	})
}

func TestSandboxExplain(t *testing.T) {
	e := newSandboxEnv(t)
	// A sandbox with no bushost beside it nor on PATH (the build directory
	// has one next to the sandbox binary, which explain would find and bind).
	lone := filepath.Join(e.base, "lone")
	if err := os.Mkdir(lone, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.ReadFile(e.sandbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lone, "sandbox"), exe, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(lone, "sandbox"), append([]string{"explain", "--json"}, e.flags("review.request")...)...)
	cmd.Env = append(os.Environ(), "PATH=/usr/bin:/bin")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("explain: %v %s", err, stderr.String())
	}
	var plan struct {
		Binds []struct{ Kind, Source, Target, Why string }
		Notes []string
	}
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatalf("explain --json: %v\n%s", err, out)
	}
	targets := map[string]bool{}
	for _, b := range plan.Binds {
		if b.Why == "" {
			t.Errorf("bind %+v has no why", b)
		}
		targets[b.Target] = true
	}
	for _, want := range []string{"/usr", "/etc", "/proc", "/dev", "/tmp", e.ws, e.run, e.broker, e.tools, filepath.Join(e.run, "session.json"), filepath.Join(e.run, "bundle"), "/"} {
		if !targets[want] {
			t.Errorf("bind table has no %s", want)
		}
	}
	if targets[e.gitSock] {
		t.Errorf("git socket bound for a role holding only review.request")
	}
	if notes := strings.Join(plan.Notes, "\n"); !strings.Contains(notes, "git socket") || !strings.Contains(notes, "bushost") {
		t.Errorf("notes do not say why the git socket and bushost are missing: %q", notes)
	}
	text, _, code := runSandbox(t, e.sandbox, append([]string{"explain"}, e.flags("git.push.working")...)...)
	if code != 0 || !strings.Contains(text, e.gitSock) || !strings.HasPrefix(text, "KIND") {
		t.Errorf("explain text: exit %d\n%s", code, text)
	}
	// A --bushost that is not there is the caller's mistake: refused, not
	// a session that cannot push.
	missing := filepath.Join(e.base, "no-such-bushost")
	before := e.snapshot(t)
	text, errOut, code := runSandbox(t, e.sandbox, append([]string{"run", "--bushost", missing}, append(e.flags("git.push.working"), "--", "true")...)...)
	if code == 0 || !strings.Contains(errOut, "--bushost "+missing) || text != "" {
		t.Errorf("missing --bushost: exit %d stdout %q stderr %q", code, text, errOut)
	}
	e.assertUnchanged(t, before)
}

// TestSandboxPushWorking runs the whole way out of a session: a real
// bushostd serving with --socket-group, a session as nobody that gets that
// group from sandbox run, fetches main, commits and pushes through the
// bound git socket; the host then finds the commit at refs/work/<task>. The
// session reaches the sockets and nothing else of the home: admin.token
// stays unreadable.
func TestSandboxPushWorking(t *testing.T) {
	testenv.NeedRoot(t, "makes a group and runs the session as nobody, who must not read the host's admin.token")
	s := newSessionHost(t, "git.push.working")
	h, group, ws, sessionToken, flags := s.h, s.group, s.ws, s.token, s.flags
	sb := bin(t, "sandbox")

	gr, err := os.Stat(filepath.Join(h.Home, "git.sock"))
	if err != nil {
		t.Fatal(err)
	}
	gid := gr.Sys().(*syscall.Stat_t).Gid
	explained, errOut, code := runSandbox(t, sb, append([]string{"explain"}, flags...)...)
	if code != 0 || !strings.Contains(explained, fmt.Sprintf("group: %d (%s) for ", gid, group)) {
		t.Fatalf("explain: exit %d, want a group line for %s (%d)\n%s%s", code, group, gid, explained, errOut)
	}

	admin, err := os.ReadFile(filepath.Join(h.Home, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	homeBefore := listDir(t, h.Home)
	out, errOut, code := runSandbox(t, sb, append(append([]string{"run"}, flags...), "--", "cat", filepath.Join(h.Home, "admin.token"))...)
	if code == 0 || strings.Contains(out+errOut, strings.TrimSpace(string(admin))) {
		t.Errorf("the session read admin.token: exit %d\n%s%s", code, out, errOut)
	}
	// Not bound, so not there; and the group the session got does not open
	// it on the host either: the same credentials, outside, are refused.
	if !strings.Contains(errOut, "No such file") {
		t.Errorf("reading admin.token inside: %q, want No such file", errOut)
	}
	cat := exec.Command("cat", filepath.Join(h.Home, "admin.token"))
	cat.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{65534, gid}}}
	if b, err := cat.CombinedOutput(); err == nil || !strings.Contains(string(b), "Permission denied") {
		t.Errorf("nobody with group %s read admin.token on the host: %v %q", group, err, b)
	}
	if after := listDir(t, h.Home); after != homeBefore {
		t.Errorf("the bus host home changed under the refused read:\nbefore %s\nafter  %s", homeBefore, after)
	}

	repo := filepath.Join(ws, "repo")
	bushost := "bushost --home " + h.Home + " --token-file " + sessionToken
	script := `set -e
` + bushost + ` fetch-main --repo ` + repo + `
cd ` + repo + `
echo "made inside" > work.txt
git add work.txt
git -c user.name=agent -c user.email=agent@example.com commit -q -m "work from inside the sandbox"
echo "head $(git rev-parse HEAD)"
echo "pushed $(` + bushost + ` push-working --repo ` + repo + `)"`
	out, errOut, code = runSandbox(t, sb, append(append([]string{"run"}, flags...), "--", "sh", "-c", script)...)
	if code != 0 {
		t.Fatalf("fetch, commit and push inside: exit %d\n%s%s", code, out, errOut)
	}
	var head, pushed string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "head "); ok {
			head = v
		}
		if v, ok := strings.CutPrefix(line, "pushed "); ok {
			pushed = v
		}
	}
	if len(head) != 40 || pushed != head {
		t.Fatalf("inside: HEAD %q, push-working printed %q; want the same commit\n%s%s", head, pushed, out, errOut)
	}
	work := testGit(t, h.TaskRepo("acme", "web", "t1"), "rev-parse", "refs/work/t1")
	if work != head {
		t.Errorf("host refs/work/t1 = %s, want the commit made inside, %s", work, head)
	}
}

// listDir names dir's entries with their modes, one line.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		s = append(s, fmt.Sprintf("%s:%v", e.Name(), info.Mode()))
	}
	return strings.Join(s, " ")
}

// TestSandboxGroups reads, from the host, the groups a session's process
// holds: the broker socket's group, never that of a socket bound with --ro
// (a docker.sock would hand the session the docker group, which is root).
func TestSandboxGroups(t *testing.T) {
	testenv.NeedRoot(t, "only a session started by root is given groups")
	e := newSandboxEnv(t)
	busGID, otherGID := unusedGID(t, 0), unusedGID(t, 1)
	other := e.listen(t, filepath.Join(e.base, "other.sock"))
	for sock, gid := range map[string]uint32{e.broker: busGID, other: otherGID} {
		if err := os.Chown(sock, 0, int(gid)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(sock, 0o660); err != nil {
			t.Fatal(err)
		}
	}
	mark := "3600." + strconv.Itoa(os.Getpid())
	started := filepath.Join(e.ws, "started")
	os.Remove(started)
	args := append([]string{"run"}, e.flags("event.record")...)
	cmd := exec.Command(e.sandbox, append(args, "--ro", other, "--", "sh", "-c", "touch started; exec sleep "+mark)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	waitFor(t, started)
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); len(pids) == 0 && time.Now().Before(deadline); pids = withArg(t, mark) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(pids) != 1 {
		t.Fatalf("session processes %v, want one sleep", pids)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	var groups []string
	for _, line := range strings.Split(string(status), "\n") {
		if g, ok := strings.CutPrefix(line, "Groups:"); ok {
			groups = strings.Fields(g)
		}
	}
	t.Logf("session groups from the host: %v", groups)
	if !slices.Contains(groups, strconv.Itoa(int(busGID))) {
		t.Errorf("groups %v lack the broker socket's %d", groups, busGID)
	}
	if slices.Contains(groups, strconv.Itoa(int(otherGID))) {
		t.Errorf("groups %v hold %d, the group of a socket bound with --ro", groups, otherGID)
	}
	if slices.Contains(groups, "0") {
		t.Errorf("groups %v hold root's", groups)
	}
}

// unusedGID returns the n-th gid from 54321 up that /etc/group does not
// name, so that no user is in it.
func unusedGID(t *testing.T, n int) uint32 {
	t.Helper()
	data, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	for gid := 54321; gid < 54421; gid++ {
		if !strings.Contains(string(data), ":"+strconv.Itoa(gid)+":") {
			if n == 0 {
				return uint32(gid)
			}
			n--
		}
	}
	t.Fatal("no unused gid")
	return 0
}

// TestSandboxPrepare makes a run directory with sandbox prepare and runs a
// session in it: bushost's home and token and git's identity come from it,
// a second session refuses the first one's HOME unless --fresh-home.
func TestSandboxPrepare(t *testing.T) {
	e := newSandboxEnv(t)
	grant := filepath.Join(e.base, "grant.token")
	token := "tok-" + e.secret
	if err := os.WriteFile(grant, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(e.base, "prepared")
	prepare := func(extra ...string) []string {
		args := []string{"prepare", "--run-dir", run, "--business", "acme", "--project", "web", "--task", "t1",
			"--role", "coder", "--caps", "git.push.working,review.request", "--token-file", grant}
		return append(args, extra...)
	}
	t.Run("refusals leave nothing", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			args []string
			code int
			want string
		}{
			{"newline in the git name", prepare("--git-name", "a\nb", "--git-email", "a@example.com"), 2, "no control characters"},
			{"name without email", prepare("--git-name", "a"), 2, "go together"},
			{"bad task", append(prepare(), "--task", "../x"), 2, "task"},
			{"unknown capability", append(prepare(), "--caps", "root"), 2, "unknown capability"},
			{"token with a space", append(prepare(), "--token-file", e.helper), 6, "printable ASCII"},
			{"under /tmp", append(prepare(), "--run-dir", filepath.Join(t.TempDir(), "run")), 6, "under /tmp"},
		} {
			before := e.snapshot(t)
			out, errOut, code := runSandbox(t, e.sandbox, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("%s: exit %d %q %q; want exit %d and %q", tc.name, code, out, errOut, tc.code, tc.want)
			}
			e.assertUnchanged(t, before)
		}
	})

	out, errOut, code := runSandbox(t, e.sandbox, prepare("--git-name", "Agent Smith", "--git-email", "agent@example.com")...)
	if code != 0 || out != filepath.Join(run, "session.json")+"\n" {
		t.Fatalf("prepare: exit %d %q %s", code, out, errOut)
	}
	var session map[string]any
	data, err := os.ReadFile(filepath.Join(run, "session.json"))
	if err != nil || json.Unmarshal(data, &session) != nil {
		t.Fatalf("session.json: %v\n%s", err, data)
	}
	want := map[string]any{"version": 1.0, "business": "acme", "project": "web", "task": "t1", "role": "coder",
		"caps": []any{"git.push.working", "review.request"}, "token_file": "token",
		"git": map[string]any{"name": "Agent Smith", "email": "agent@example.com"}}
	if fmt.Sprint(session) != fmt.Sprint(want) {
		t.Errorf("session.json = %v, want %v", session, want)
	}
	for name, mode := range map[string]fs.FileMode{"": fs.ModeDir | 0o755, "session.json": 0o644, "token": 0o400,
		"bundle": fs.ModeDir | 0o755, "home": fs.ModeDir | 0o700, "tmp": fs.ModeDir | 0o700} {
		st, err := os.Lstat(filepath.Join(run, name))
		if err != nil || st.Mode() != mode || st.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
			t.Errorf("%s: %v %v, want mode %v owned by the caller", filepath.Join(run, name), st.Mode(), err, mode)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(run, "token")); string(b) != token+"\n" {
		t.Errorf("token file holds %q", b)
	}
	before := e.snapshot(t)
	if _, errOut, code := runSandbox(t, e.sandbox, prepare()...); code != 5 || !strings.Contains(errOut, "not empty") {
		t.Errorf("prepare over a prepared run directory: exit %d %q, want 5 and not empty", code, errOut)
	}
	e.assertUnchanged(t, before)

	flags := []string{"run", "--run-dir", run, "--workspace", e.ws, "--role", "coder", "--caps", "review.request,git.push.working",
		"--broker-socket", e.broker, "--git-socket", e.gitSock}
	script := `echo "home=$BUSHOST_HOME"; cat "$BUS_TOKEN_FILE"; git var GIT_AUTHOR_IDENT | cut -d'>' -f1; git var GIT_COMMITTER_IDENT | cut -d'>' -f1; touch "$HOME/.history"`
	out, errOut, code = runSandbox(t, e.sandbox, append(flags, "--", "sh", "-c", script)...)
	wantOut := fmt.Sprintf("home=%s\n%s\nAgent Smith <agent@example.com\nAgent Smith <agent@example.com\n", e.busHost, token)
	if code != 0 || out != wantOut {
		t.Fatalf("inside: exit %d %q %s; want %q", code, out, errOut, wantOut)
	}
	if _, errOut, code := runSandbox(t, e.sandbox, append(flags, "--", "true")...); code != 125 || !strings.Contains(errOut, "--fresh-home") {
		t.Errorf("second session on a full HOME: exit %d %q, want 125 naming --fresh-home", code, errOut)
	}
	out, errOut, code = runSandbox(t, e.sandbox, append(flags, "--fresh-home", "--", "ls", "-A", filepath.Join(run, "home"))...)
	if code != 0 || out != "" {
		t.Errorf("--fresh-home: exit %d, HOME holds %q %s", code, out, errOut)
	}
	wrongCaps := []string{"run", "--run-dir", run, "--workspace", e.ws, "--role", "coder", "--caps", "task.close",
		"--broker-socket", e.broker, "--", "true"}
	if _, errOut, code := runSandbox(t, e.sandbox, wrongCaps...); code != 125 || !strings.Contains(errOut, "session.json says") {
		t.Errorf("--caps unlike session.json's: exit %d %q, want 125", code, errOut)
	}
}

// TestSandboxLimits checks the resource limits from outside: a session
// over its memory is killed, a fork bomb stops at --pids, --timeout ends a
// session with 124, the rlimits hold, and no cgroup is left behind.
func TestSandboxLimits(t *testing.T) {
	e := newSandboxEnv(t)
	testenv.NeedRoot(t, "cgroups are made by root")
	run := func(t *testing.T, limits []string, command ...string) (string, string, int) {
		t.Helper()
		before := e.snapshot(t)
		cgBefore := sessionCgroups(t)
		out, errOut, code := e.runIn(t, limits, command...)
		e.assertUnchanged(t, before)
		// Sessions of tests running beside this one (make test runs the
		// integration tests in several processes) make and remove
		// cgroups of their own: one that appeared is this session's only
		// if it stays.
		var left []string
		if !testenv.Poll(time.Minute, func() bool {
			left = nil
			for _, cg := range sessionCgroups(t) {
				if !slices.Contains(cgBefore, cg) {
					left = append(left, cg)
				}
			}
			return len(left) == 0
		}) {
			t.Errorf("cgroups left behind: %v", left)
		}
		return out, errOut, code
	}
	t.Run("memory", func(t *testing.T) {
		out, errOut, code := run(t, []string{"--memory", "64M"}, e.helper, "alloc", "200")
		if code != 128+9 || strings.Contains(out, "ALLOCATED") {
			t.Errorf("200 MiB under --memory 64M: exit %d %q %s; want killed (137)", code, out, errOut)
		}
		out, errOut, code = run(t, []string{"--memory", "64M"}, e.helper, "alloc", "16")
		if code != 0 || !strings.Contains(out, "ALLOCATED 16 MiB") {
			t.Errorf("control: 16 MiB under --memory 64M: exit %d %q %s", code, out, errOut)
		}
	})
	t.Run("pids", func(t *testing.T) {
		out, errOut, code := run(t, []string{"--pids", "32"}, e.helper, "forks", "200")
		if code != 3 || !strings.Contains(out, "REFUSED: forks") {
			t.Errorf("200 processes under --pids 32: exit %d %q %s; want refused", code, out, errOut)
		}
		out, errOut, code = run(t, []string{"--pids", "32"}, e.helper, "forks", "4")
		if code != 0 || !strings.Contains(out, "started 4 processes") {
			t.Errorf("control: 4 processes under --pids 32: exit %d %q %s", code, out, errOut)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		_, errOut, code := run(t, []string{"--timeout", "2s"}, "sleep", "60")
		if took := time.Since(start); code != 124 || took > 20*time.Second || !strings.Contains(errOut, "timed out after 2s") {
			t.Errorf("sleep 60 under --timeout 2s: exit %d after %s, %q; want 124 at about 2s", code, took, errOut)
		}
		// A command that ignores SIGTERM is killed after the grace.
		start = time.Now()
		_, _, code = run(t, []string{"--timeout", "1s"}, "sh", "-c", "trap '' TERM; sleep 60")
		if took := time.Since(start); code != 124 || took > 20*time.Second {
			t.Errorf("a session ignoring SIGTERM under --timeout 1s: exit %d after %s; want 124", code, took)
		}
	})
	t.Run("rlimits and cpu", func(t *testing.T) {
		out, errOut, code := run(t, []string{"--nofile", "64", "--fsize", "1M", "--cpu", "0.5"}, "grep", "-E", "^Max (open files|file size|core file size) ", "/proc/self/limits")
		want := []string{"Max file size 1048576 1048576 bytes", "Max core file size 0 0 bytes", "Max open files 64 64 files"}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			got = append(got, strings.Join(strings.Fields(line), " "))
		}
		if code != 0 || !slices.Equal(got, want) {
			t.Errorf("limits inside: exit %d %q %s; want %q", code, got, errOut, want)
		}
	})
	t.Run("usage", func(t *testing.T) {
		for _, bad := range [][]string{{"--memory", "1K"}, {"--pids", "-1"}, {"--memory", "lots"}, {"--timeout", "soon"}} {
			if _, errOut, code := run(t, bad, "true"); code != 2 {
				t.Errorf("%q: exit %d %s, want 2", bad, code, errOut)
			}
		}
	})
}

// sessionCgroups lists the cgroups sandbox run made that are still there,
// under this process's own cgroup of each hierarchy.
func sessionCgroups(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		mount := "/sys/fs/cgroup/unified"
		if parts[1] != "" {
			mount = filepath.Join("/sys/fs/cgroup", strings.TrimPrefix(parts[1], "name="))
		}
		found, _ := filepath.Glob(filepath.Join(mount, parts[2], "bushost-sandbox-*"))
		left = append(left, found...)
	}
	return left
}

// sessionProc is one running session, seen from the host.
type sessionProc struct {
	cmd  *exec.Cmd
	pid  int    // the command's host pid
	uid  string // its uid on the host
	mark string
}

// startSession starts `sleep MARK` as env e's session, with extra flags,
// and finds its process on the host.
func startSession(t *testing.T, e *sandboxEnv, extra ...string) *sessionProc {
	t.Helper()
	mark := "3600." + strconv.Itoa(os.Getpid()) + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	args := append(append([]string{"run"}, e.flags("event.record")...), extra...)
	cmd := exec.Command(e.sandbox, append(args, "--", "sh", "-c", "echo secret-"+e.secret+" > mine.txt; echo home > $HOME/mine; exec sleep "+mark)...)
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sessionProc{cmd: cmd, mark: mark}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	if !testenv.Poll(20*time.Second, func() bool {
		pids := withArg(t, mark)
		if len(pids) == 1 {
			s.pid = pids[0]
		}
		return len(pids) == 1
	}) {
		data, _ := os.ReadFile(out.Name())
		t.Fatalf("the session never started: %s", data)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			s.uid = strings.Fields(rest)[0]
		}
	}
	return s
}

// asUID runs argv on the host as uid (and gid) and returns its output and
// whether it succeeded.
func asUID(t *testing.T, uid string, argv ...string) (string, bool) {
	t.Helper()
	n, err := strconv.Atoi(uid)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(n), Gid: uint32(n)}}
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// ownedBy lists the paths under dir owned (user or group) by any of ids.
func ownedBy(t *testing.T, dir string, ids ...string) []string {
	t.Helper()
	var found []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st := info.Sys().(*syscall.Stat_t)
		if slices.Contains(ids, strconv.Itoa(int(st.Uid))) || slices.Contains(ids, strconv.Itoa(int(st.Gid))) {
			found = append(found, p)
		}
		return nil
	})
	return found
}

// shareModes runs f once with idmapped mounts and once with the fallback
// a kernel without them takes (a hooked build told to walk), each new env
// of the subtest using the sandbox binary given.
func shareModes(t *testing.T, f func(t *testing.T, walk bool, sandbox string)) {
	for _, walk := range []bool{false, true} {
		name := "idmap"
		if walk {
			name = "walk"
		}
		t.Run(name, func(t *testing.T) {
			sb := bin(t, "sandbox")
			if walk {
				sb = hookBin(t, "sandbox")
				t.Setenv("BUSHOST_TESTHOOK_NO_IDMAP", "1")
			}
			f(t, walk, sb)
		})
	}
}

// inSession runs argv inside the running session s (its user, mount and
// pid namespaces, as its uid), as a process of that session would.
func inSession(t *testing.T, s *sessionProc, argv ...string) (string, bool) {
	t.Helper()
	args := append([]string{"-t", strconv.Itoa(s.pid), "-U", "-m", "-p", "-S", s.uid, "-G", s.uid, "--"}, argv...)
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	return string(out), err == nil
}

// TestSandboxSessionUIDs runs two sessions at once, as root: each runs as
// a uid of its own, neither can read or write the other's workspace or run
// directory nor signal its processes, and once both end no file on the
// host is owned by either uid. From inside, a session has nothing of the
// other's to name. On the host, the walk hands each tree to its session's
// uid at 0700; through idmapped mounts nothing changes hands, and who on
// the host may read a workspace is up to its owner's modes, as always.
func TestSandboxSessionUIDs(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	shareModes(t, func(t *testing.T, walk bool, sandbox string) {
		a, b := newSandboxEnv(t), newSandboxEnv(t)
		a.sandbox, b.sandbox = sandbox, sandbox
		sa, sb := startSession(t, a), startSession(t, b)
		t.Logf("session A uid %s pid %d, session B uid %s pid %d", sa.uid, sa.pid, sb.uid, sb.pid)
		for _, s := range []*sessionProc{sa, sb} {
			if n, _ := strconv.Atoi(s.uid); n < 61184 || n > 65519 {
				t.Errorf("session uid %s is outside 61184-65519", s.uid)
			}
		}
		if sa.uid == sb.uid {
			t.Fatalf("both sessions run as uid %s", sa.uid)
		}
		for _, x := range []struct {
			me, other *sessionProc
			env       *sandboxEnv
		}{{sa, sb, b}, {sb, sa, a}} {
			attempts := [][]string{
				{"ls", x.env.ws},
				{"cat", filepath.Join(x.env.ws, "mine.txt")},
				{"touch", filepath.Join(x.env.ws, "from-the-other")},
				{"ls", filepath.Join(x.env.run, "home")},
				{"cat", filepath.Join(x.env.run, "home", "mine")},
				{"kill", "-0", strconv.Itoa(x.other.pid)},
			}
			for _, argv := range attempts {
				if out, ok := inSession(t, x.me, argv...); ok || strings.Contains(out, "secret-") {
					t.Errorf("inside session uid %s, %q worked: %s", x.me.uid, argv, out)
				}
			}
			host := [][]string{
				{"cat", filepath.Join(x.env.run, "home", "mine")},
				{"kill", "-0", strconv.Itoa(x.other.pid)},
			}
			if walk {
				host = append(host, attempts[:3]...)
				host = append(host, []string{"ls", x.env.run})
			}
			for _, argv := range host {
				if out, ok := asUID(t, x.me.uid, argv...); ok || strings.Contains(out, "secret-") {
					t.Errorf("as uid %s, %q worked: %s", x.me.uid, argv, out)
				}
			}
			// The control: the session itself may.
			if out, ok := inSession(t, x.other, "cat", filepath.Join(x.env.ws, "mine.txt"), filepath.Join(x.env.run, "home", "mine")); !ok {
				t.Errorf("control: session uid %s cannot read its own workspace and HOME: %s", x.other.uid, out)
			}
			if out, ok := inSession(t, x.other, "kill", "-0", "1"); !ok {
				t.Errorf("control: session uid %s cannot signal its own pid 1: %s", x.other.uid, out)
			}
		}
		for _, s := range []*sessionProc{sa, sb} {
			s.cmd.Process.Signal(syscall.SIGTERM)
			s.cmd.Wait()
		}
		for _, e := range []*sandboxEnv{a, b} {
			if left := ownedBy(t, e.base, sa.uid, sb.uid); len(left) > 0 {
				t.Errorf("files left owned by a session uid: %v", left)
			}
			if st, err := os.Stat(filepath.Join(e.ws, "mine.txt")); err != nil || st.Sys().(*syscall.Stat_t).Uid != uint32(e.uid) {
				t.Errorf("mine.txt is not the workspace's owner's (%d): %v", e.uid, err)
			}
		}
	})
}

// TestSandboxUIDReclaimed: a launcher that dies leaves its session
// running under its uid, which no other launcher takes; once the session
// is gone, the next launcher given that uid takes it (after handing its
// files back first, where they were handed over by a walk).
func TestSandboxUIDReclaimed(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	shareModes(t, testUIDReclaimed)
}

func testUIDReclaimed(t *testing.T, walk bool, sandbox string) {
	e := newSandboxEnv(t)
	e.sandbox = sandbox
	const rng = "65500-65519"
	s := startSession(t, e, "--uid-range", rng)
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	s.cmd.Wait()
	if !alive(s.pid) {
		t.Fatalf("the session died with its launcher")
	}
	// A second launcher while the session runs: another uid. Handed over
	// by a walk, the workspace, still the first session's, is not taken
	// from it; through idmapped mounts both see it, each as its own.
	out, errOut, code := e.runIn(t, []string{"--uid-range", rng, "--fresh-home"}, "id", "-u")
	switch {
	case walk && (code != 125 || !strings.Contains(errOut, "belongs to uid "+s.uid)):
		t.Errorf("a launch on a workspace a running session holds: exit %d %q; want a refusal naming uid %s", code, errOut, s.uid)
	case !walk && (code != 0 || strings.TrimSpace(out) == s.uid):
		t.Errorf("a second session on the workspace: exit %d, uid %q (the first is %s)\n%s", code, out, s.uid, errOut)
	}
	if walk && len(ownedBy(t, e.ws, s.uid)) == 0 {
		t.Fatalf("the running session's workspace is no longer its own")
	}
	// End the orphaned session: kill its pid 1, and with it the pid
	// namespace.
	pid1 := 0
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			pid1, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if pid1 <= 1 {
		t.Fatalf("no pid 1 above the session's command %d", s.pid)
	}
	syscall.Kill(pid1, syscall.SIGKILL)
	testenv.WaitFor(t, 10*time.Second, "the orphaned session to end", func() bool { return !alive(s.pid) && !alive(pid1) })
	out, errOut, code = e.runIn(t, []string{"--uid-range", s.uid + "-" + s.uid, "--fresh-home"}, "id", "-u")
	if code != 0 || strings.TrimSpace(out) != s.uid {
		t.Fatalf("launch on the reclaimed uid: exit %d %q %s", code, out, errOut)
	}
	if left := ownedBy(t, e.base, s.uid); len(left) > 0 {
		t.Errorf("files left owned by the reclaimed uid %s: %v", s.uid, left)
	}
}

// TestSandboxHandBackHostile: whatever a session does to the trees it was
// handed (moves its HOME away and leaves a link to /etc in its place,
// makes files beside session.json, links and fifos in the workspace),
// nothing stays owned by its uid once it ends, and the uid is free again.
//
// Through idmapped mounts the run directory stays the host's, which the
// session cannot write: there, the same is done to the workspace, HOME
// and /tmp alone.
func TestSandboxHandBackHostile(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	shareModes(t, testHandBackHostile)
}

func testHandBackHostile(t *testing.T, walk bool, sandbox string) {
	e := newSandboxEnv(t)
	e.sandbox = sandbox
	state := filepath.Join(e.base, "state")
	script := `id -u; ln -s /etc/shadow link && mkfifo fifo && mkdir -p a/b/c && touch a/b/c/d &&
mkfifo "$HOME/fifo" && ln -s /etc "$HOME/etc" && mkdir -p /tmp/x/y && touch /tmp/x/y/z`
	if walk {
		script += ` && mv "$HOME" ` + e.run + `/moved && ln -s /etc "$HOME" &&
mkdir -p ` + e.run + `/top/deep && touch ` + e.run + `/top/deep/f`
	}
	// A state directory of its own does not see the uids other runs
	// hold: its range is kept apart from the default's low end, which
	// tests running beside this one take first.
	out, errOut, code := e.runIn(t, []string{"--state-dir", state, "--uid-range", "65400-65519", "--fresh-home"}, "sh", "-c", script)
	uid := strings.TrimSpace(out)
	if code != 0 || uid == "" {
		t.Fatalf("the session: exit %d %q %s", code, out, errOut)
	}
	if left := ownedBy(t, e.base, uid); len(left) > 0 {
		t.Errorf("files left owned by the session's uid %s: %v", uid, left)
	}
	if ents, err := os.ReadDir(state); err != nil || len(ents) != 0 {
		t.Errorf("state directory after the session: %v %v, want no lock file", ents, err)
	}
}
