package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

// The attack of issue 30: a caller names a path, root checks it and uses
// it later; in between the caller exchanges it (renameat2 with
// RENAME_EXCHANGE) with a link to a directory only root may read. Root
// must act on what it checked, or refuse; it must never read or change the
// victim. Each attack runs twice: raced, at least 200 tries spread over
// the window, and with a hooked build (internal/testhook) that swaps at
// the exact point between check and use, which the code before the fix
// did not survive.

// swapTries is how many launches each race makes.
const swapTries = 200

// victim is a root-only directory holding a secret.
type victim struct {
	dir, secret, before string
}

func newVictim(t *testing.T, parent string) *victim {
	t.Helper()
	v := &victim{dir: parent, secret: "root-only-" + randomHex(t)}
	if err := os.MkdirAll(v.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(v.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.dir, "secret"), []byte(v.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v.before = v.snapshot()
	return v
}

// snapshot is every path under the victim with its owner, mode and content.
func (v *victim) snapshot() string {
	var b strings.Builder
	filepath.WalkDir(v.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p, err)
			return nil
		}
		var st syscall.Stat_t
		syscall.Lstat(p, &st)
		content := ""
		if d.Type().IsRegular() {
			c, _ := os.ReadFile(p)
			content = string(c)
		}
		fmt.Fprintf(&b, "%s %d:%d %o %q\n", p, st.Uid, st.Gid, st.Mode, content)
		return nil
	})
	return b.String()
}

// untouched fails the test if an output holds the secret or the victim
// changed in any way.
func (v *victim) untouched(t *testing.T, what string, outputs ...string) {
	t.Helper()
	for _, o := range outputs {
		if strings.Contains(o, v.secret) {
			t.Errorf("%s: the root-only secret was read:\n%s", what, o)
		}
	}
	if after := v.snapshot(); after != v.before {
		t.Errorf("%s: the victim changed:\nbefore\n%s\nafter\n%s", what, v.before, after)
	}
}

// swapLink puts at path+".swap" a link to target, owned by uid (the
// caller's own link).
func swapLink(t *testing.T, path, target string, uid int) {
	t.Helper()
	if err := os.Symlink(target, path+".swap"); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(path+".swap", uid, uid); err != nil {
		t.Fatal(err)
	}
}

// exchanger swaps path and path.swap until stopped, as the caller would
// from its own process.
type exchanger struct {
	stop  chan struct{}
	wg    sync.WaitGroup
	swaps atomic.Int64
}

func startExchanger(t *testing.T, path string) *exchanger {
	x := &exchanger{stop: make(chan struct{})}
	x.wg.Add(1)
	go func() {
		defer x.wg.Done()
		for {
			select {
			case <-x.stop:
				return
			default:
			}
			if unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, path+".swap", unix.RENAME_EXCHANGE) == nil {
				x.swaps.Add(1)
			}
		}
	}()
	t.Cleanup(x.halt)
	return x
}

// halt stops the swapping and leaves the directory (not the link) at path.
func (x *exchanger) halt() {
	select {
	case <-x.stop:
		return
	default:
	}
	close(x.stop)
	x.wg.Wait()
}

func settle(t *testing.T, path string) {
	t.Helper()
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, path+".swap", unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
	}
}

// lead is an unprivileged user holding the lead grant (session.launch),
// in the group of the bus host's home so that it reaches launch.sock.
type lead struct {
	name     string
	uid, gid int
	homeGID  uint32
	token    string
	dir      string // a directory of its own
}

func newLead(t *testing.T, e *launchEnv) *lead {
	t.Helper()
	name, uid := otherUser(t)
	out, err := exec.Command("id", "-g", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	gid, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	var st syscall.Stat_t
	if err := syscall.Stat(e.h.Home, &st); err != nil {
		t.Fatal(err)
	}
	base := filepath.Dir(e.h.Home)
	l := &lead{name: name, uid: uid, gid: gid, homeGID: st.Gid, token: filepath.Join(base, name+".token"), dir: filepath.Join(base, name)}
	tok, err := os.ReadFile(e.lead)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.token, tok, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(l.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{l.token, l.dir} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// mkdir makes a directory of the lead's.
func (l *lead) mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, l.uid, l.gid); err != nil {
		t.Fatal(err)
	}
}

// launch runs `bushost session launch --workspace ws -- sh -c script` as
// the lead; a launch the launcher accepted is waited for, and its logs
// (read as the host) are returned with its status.
func (l *lead) launch(t *testing.T, e *launchEnv, ws, script string) (output string, launched bool, status int) {
	t.Helper()
	cmd := exec.Command(bin(t, "bushost"), "--home", e.h.Home, "session", "launch", "--task", "t1", "--role", "worker",
		"--caps", "git.push.working", "--workspace", ws, "--", "sh", "-c", script)
	cmd.Env = append(cleanEnv(), "BUS_TOKEN_FILE="+l.token)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(l.uid), Gid: uint32(l.gid), Groups: []uint32{l.homeGID}}}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("session launch: %v", err)
	}
	if err != nil {
		return stdout.String() + stderr.String(), false, ee.ExitCode()
	}
	id := strings.TrimSpace(stdout.String())
	_, waitErr, code := e.h.Run(t, nil, "session", "wait", id)
	logs, logErr, _ := e.h.Run(t, nil, "session", "logs", id)
	return logs + logErr + waitErr, true, code
}

const attackScript = "cat secret; echo planted > planted"

// leadWithVictim is a launcher, a lead, the lead's directory d (the
// workspace it names) and, at d.swap, the lead's link to a root-only
// victim.
func leadWithVictim(t *testing.T) (*launchEnv, *lead, string, *victim) {
	t.Helper()
	e := newLaunchEnv(t)
	v := newVictim(t, filepath.Join(filepath.Dir(e.h.Home), "victim"))
	l := newLead(t, e)
	d := filepath.Join(l.dir, "d")
	l.mkdir(t, d)
	swapLink(t, d, v.dir, l.uid)
	return e, l, d, v
}

// mustBeSwapped fails the test unless the hook exchanged path for the
// link: a hooked test whose hook never ran proves nothing.
func mustBeSwapped(t *testing.T, path, out string) {
	t.Helper()
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("the hook did not swap %s: %v %v\n%s", path, fi, err, out)
	}
}

// The lead's workspace swapped for a link to a root-only directory right
// after the launcher checked it: the session never runs in the victim.
func TestLaunchWorkspaceSwapAtCheck(t *testing.T) {
	e, l, d, v := leadWithVictim(t)
	e.stop(t)
	hookBin(t, "bushostd")
	e.sandbox = hookBin(t, "sandbox")
	e.env = []string{"BUSHOST_TESTHOOK_SWAP=launch.workspace=" + d}
	e.start(t)
	out, launched, status := l.launch(t, e, d, attackScript)
	mustBeSwapped(t, d, out)
	v.untouched(t, "launch with the workspace swapped after the check", out)
	if launched && status == 0 {
		t.Errorf("the session ran with its workspace swapped:\n%s", out)
	}
	if !strings.Contains(out, "PATH_CHANGED") {
		t.Errorf("the refusal does not say PATH_CHANGED:\n%s", out)
	}
	if _, err := os.Lstat(filepath.Join(d+".swap", "planted")); err == nil {
		t.Errorf("the command ran in the workspace it was refused")
	}
}

// The same exchange raced against the launch, over and over.
func TestLaunchWorkspaceSwapRace(t *testing.T) {
	e, l, d, v := leadWithVictim(t)
	x := startExchanger(t, d)
	var ran, refused int
	for i := range swapTries {
		out, launched, status := l.launch(t, e, d, attackScript)
		v.untouched(t, fmt.Sprintf("try %d", i), out)
		if t.Failed() {
			break
		}
		if launched && status == 0 {
			ran++
		} else {
			refused++
		}
	}
	x.halt()
	settle(t, d)
	t.Logf("%d tries: %d ran in the lead's own directory, %d refused; %d swaps", swapTries, ran, refused, x.swaps.Load())
	v.untouched(t, "after the race")
}

// sandboxSwapEnv is what `sandbox run` as root needs for a workspace of
// the lead's under a directory of the lead's (p) that the lead swaps
// for a link to a root-only directory holding a "ws" of its own.
type sandboxSwapEnv struct {
	base, p, ws, run, broker string
	v                        *victim
	uid                      int
}

func newSandboxSwapEnv(t *testing.T) *sandboxSwapEnv {
	t.Helper()
	testenv.NeedRoot(t, "sandbox run hands the workspace to a uid of its own")
	base := baseDir(t)
	_, uid := otherUser(t)
	s := &sandboxSwapEnv{base: base, uid: uid, p: filepath.Join(base, "lead", "p"), run: filepath.Join(base, "run")}
	s.ws = filepath.Join(s.p, "ws")
	for _, d := range []string{filepath.Dir(s.p), s.p, s.ws} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	// Root's, open to all as /var/lib is; its ws is root's alone.
	parent := filepath.Join(base, "victim-parent")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	s.v = newVictim(t, filepath.Join(parent, "ws"))
	swapLink(t, s.p, parent, uid)
	l, err := net.Listen("unix", filepath.Join(base, "broker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	s.broker = l.Addr().String()
	if err := os.Chmod(s.broker, 0o666); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(base, "token")
	if err := os.WriteFile(tok, []byte("t0k3n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, code := runCmd(t, bin(t, "sandbox"), "prepare", "--run-dir", s.run, "--business", "acme", "--project", "web", "--task", "t1",
		"--role", "worker", "--caps", "git.push.working", "--token-file", tok); code != 0 {
		t.Fatalf("sandbox prepare: exit %d\n%s", code, out)
	}
	return s
}

func (s *sandboxSwapEnv) run1(t *testing.T, sandbox string, env ...string) (string, int) {
	t.Helper()
	return runBounded(t, env, sandbox, "run", "--run-dir", s.run, "--workspace", s.ws, "--role", "worker", "--caps", "git.push.working",
		"--broker-socket", s.broker, "--fresh-home", "--", "sh", "-c", attackScript)
}

// `sandbox run --workspace` as root, a directory on the way swapped for a
// link after the plan was made: the session never runs in the victim.
func TestSandboxRunWorkspaceSwapAtCheck(t *testing.T) {
	s := newSandboxSwapEnv(t)
	out, status := s.run1(t, hookBin(t, "sandbox"), "BUSHOST_TESTHOOK_SWAP=run.workspace="+s.p)
	mustBeSwapped(t, s.p, out)
	s.v.untouched(t, "sandbox run with the workspace's parent swapped after the check", out)
	if status == 0 {
		t.Errorf("the session ran with its workspace swapped:\n%s", out)
	}
	if !strings.Contains(out, "changed") {
		t.Errorf("the refusal does not say the workspace changed:\n%s", out)
	}
}

func TestSandboxRunWorkspaceSwapRace(t *testing.T) {
	s := newSandboxSwapEnv(t)
	sb := bin(t, "sandbox")
	x := startExchanger(t, s.p)
	var ran int
	for i := range swapTries {
		out, status := s.run1(t, sb)
		s.v.untouched(t, fmt.Sprintf("try %d", i), out)
		if t.Failed() {
			break
		}
		if status == 0 {
			ran++
		}
	}
	x.halt()
	settle(t, s.p)
	t.Logf("%d tries: %d ran in the lead's own workspace; %d swaps", swapTries, ran, x.swaps.Load())
	s.v.untouched(t, "after the race")
}

// seedUnder moves the env's seed below a directory of the agent's (p),
// which the test swaps for a link to a root-owned directory holding a
// "seed" of root's only; it returns p and the victim.
func seedUnder(t *testing.T, e *supEnv) (string, *victim) {
	t.Helper()
	// A first boot makes the users; the workspace goes, so that the
	// next init seeds it again.
	e.boot()
	e.shutdown()
	if err := os.RemoveAll(e.ws); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("id", "-u", e.agent).Output()
	if err != nil {
		t.Fatal(err)
	}
	agent, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	p := filepath.Join(e.base, "agent-seeds")
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, agent, agent); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(p, "seed")
	if err := os.Rename(e.seed, seed); err != nil {
		t.Fatal(err)
	}
	e.seed = seed
	parent := filepath.Join(e.base, "victim-parent")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	v := newVictim(t, filepath.Join(parent, "seed"))
	swapLink(t, p, parent, agent)
	return p, v
}

// grepTree fails the test if a file under dir holds the secret.
func grepTree(t *testing.T, dir, secret string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
				t.Errorf("%s holds the root-only secret", p)
			}
		}
		return nil
	})
}

// The seed's directory swapped for a link right after init opened the
// seed: the workspace gets the seed's files, never root's.
func TestSupervisorInitSeedSwapAtCheck(t *testing.T) {
	e := newSupEnv(t)
	p, v := seedUnder(t, e)
	e.exe = hookBin(t, "supervisor")
	e.env = []string{"BUSHOST_TESTHOOK_SWAP=init.seed=" + p}
	e.boot()
	e.shutdown()
	mustBeSwapped(t, p, e.out.String())
	grepTree(t, e.ws, v.secret)
	v.untouched(t, "init with the seed swapped after it was opened", e.out.String())
	if _, err := os.Lstat(filepath.Join(e.ws, "src", "website", "serve.sh")); err != nil {
		t.Errorf("the seed's own files were not copied: %v", err)
	}
}

// A fifo, or a symbolic link, in the agent's tree swapped, between the
// walk's stat that saw it and init's chown, for a hard link the agent made
// to a root-only file on the same filesystem: root's chown must not hand
// the agent that file, and init goes on to serve.
func TestSupervisorInitOwnerEntrySwappedForHardLink(t *testing.T) {
	for _, kind := range []struct {
		name string
		make func(p string) error
	}{
		{"fifo", func(p string) error { return unix.Mkfifo(p, 0o660) }},
		{"symlink", func(p string) error { return os.Symlink("elsewhere", p) }},
	} {
		t.Run(kind.name, func(t *testing.T) {
			e := newSupEnv(t)
			// A first boot makes the users and the workspace.
			e.boot()
			e.shutdown()
			out, err := exec.Command("id", "-u", e.agent).Output()
			if err != nil {
				t.Fatal(err)
			}
			agent, _ := strconv.Atoi(strings.TrimSpace(string(out)))
			v := newVictim(t, filepath.Join(e.base, "victim"))
			secret := filepath.Join(v.dir, "secret")
			entry := filepath.Join(e.ws, "src", "entry")
			if err := kind.make(entry); err != nil {
				t.Fatal(err)
			}
			if err := os.Lchown(entry, agent, agent); err != nil {
				t.Fatal(err)
			}
			if err := os.Link(secret, entry+".swap"); err != nil {
				t.Fatal(err)
			}
			e.exe = hookBin(t, "supervisor")
			e.env = []string{"BUSHOST_TESTHOOK_SWAP=init.owner=" + entry}
			e.boot()
			e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })
			e.shutdown()
			// The hook ran: the entry's name is now the hard link.
			fi, err := os.Lstat(entry)
			sfi, serr := os.Stat(secret)
			if err != nil || serr != nil || !os.SameFile(fi, sfi) {
				t.Fatalf("the hook did not swap %s for the hard link: %v %v %v\n%s", entry, fi, err, serr, e.out.String())
			}
			var st syscall.Stat_t
			if err := syscall.Stat(secret, &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != 0 || st.Gid != 0 || st.Mode&0o7777 != 0o600 {
				t.Errorf("root's file is now %d:%d %o, was 0:0 600", st.Uid, st.Gid, st.Mode&0o7777)
			}
			v.untouched(t, "init with a "+kind.name+" swapped for a hard link to root's file", e.out.String())
			if !strings.Contains(e.out.String(), "init: skipped a path that changed under it") {
				t.Errorf("init did not say it skipped the swapped path:\n%s", e.out.String())
			}
		})
	}
}

// The workspace swapped for a link to a root-only directory right after
// init opened it: nothing is written there, and init refuses to run on
// the path it no longer names.
func TestSupervisorInitWorkspaceSwapAtCheck(t *testing.T) {
	e := newSupEnv(t)
	v := newVictim(t, filepath.Join(e.base, "victim"))
	if err := os.Symlink(v.dir, e.ws+".swap"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(hookBin(t, "supervisor"), "init", "--config", e.config, "--seed", e.seed)
	cmd.Env = append(os.Environ(), "TMPDIR="+filepath.Join(e.base, "tmp"), "BUSHOST_TESTHOOK_SWAP=init.workspace="+e.ws)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Errorf("init ran on a swapped workspace:\n%s", out)
	}
	mustBeSwapped(t, e.ws, string(out))
	v.untouched(t, "init with the workspace swapped after it was opened", string(out))
	if !strings.Contains(string(out), "PATH_CHANGED") {
		t.Errorf("the refusal does not say PATH_CHANGED:\n%s", out)
	}
}

// The seed's directory exchanged with the link over and over while init
// runs: no round copies root's files, none changes them.
func TestSupervisorInitSeedSwapRace(t *testing.T) {
	e := newSupEnv(t)
	// No service: each round is init's seeding and the supervisor's start.
	mustWrite(t, e.config, fmt.Sprintf("workspace = \"ws\"\ngit_dir = %q\napp_user = %q\nagent_user = %q\nservices_user = %q\nhealth_addr = %q\n",
		e.gitDir, e.app, e.agent, e.svc, e.addr), 0o644)
	p, v := seedUnder(t, e)
	x := startExchanger(t, p)
	var seeded int
	for round := range swapTries {
		// A fresh workspace each round: init seeds only an empty one.
		if err := os.RemoveAll(e.ws); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin(t, "supervisor"), "init", "--config", e.config, "--seed", e.seed)
		cmd.Env = append(os.Environ(), "TMPDIR="+filepath.Join(e.base, "tmp"))
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		// Stopped once it has seeded: the supervisor's run is not what
		// this round tests.
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		testenv.WaitFor(t, time.Minute, "init to seed or stop", func() bool {
			select {
			case <-done:
				return true
			default:
			}
			_, err := os.Lstat(filepath.Join(e.ws, "AGENTS.md"))
			return err == nil
		})
		cmd.Process.Kill()
		<-done
		if _, err := os.Lstat(filepath.Join(e.ws, "src", "website", "serve.sh")); err == nil {
			seeded++
		}
		grepTree(t, e.ws, v.secret)
		v.untouched(t, fmt.Sprintf("round %d", round))
		if t.Failed() {
			break
		}
	}
	x.halt()
	settle(t, p)
	t.Logf("%d rounds: %d seeded from the agent's seed; %d swaps", swapTries, seeded, x.swaps.Load())
}
