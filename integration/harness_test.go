package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/broker"
)

// Host is a running bushostd on a home of its own, and the bushost client
// pointed at it.
type Host struct {
	Home   string
	Args   []string // extra bushostd serve flags
	Log    string   // the daemon's stderr, appended across restarts
	Env    []string // extra environment of the daemon
	daemon string
	client string
	cmd    *exec.Cmd
	exited chan error
}

// hostOpts changes how startHostWith starts bushostd.
type hostOpts struct {
	// Home to use (default: a new directory).
	Home string
	// Args are extra flags for bushostd serve.
	Args []string
	// Env adds to (and overrides) the daemon's inherited environment.
	Env []string
	// Plain runs bushostd as users build it, without -race: for a test
	// that measures the daemon's memory, which the race runtime's shadow
	// memory would inflate.
	Plain bool
	// Daemon, when set, is the bushostd binary to run (failpointDaemon's,
	// hookBin's).
	Daemon string
}

// baseDir returns a new directory outside /tmp (a sandboxed session's /tmp
// is private, which would hide sockets bound from the host's /tmp), with a
// short path (Unix socket paths are limited to 108 bytes), removed at the
// end of the test.
func baseDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/var/tmp", "bh-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startHost starts bushostd with the embedded defaults on a fresh home and
// stops it when the test ends.
func startHost(t testing.TB) *Host {
	return startHostWith(t, hostOpts{})
}

func startHostWith(t testing.TB, o hostOpts) *Host {
	t.Helper()
	h := &Host{Home: o.Home, Args: o.Args, Env: o.Env, daemon: bin(t, "bushostd"), client: bin(t, "bushost")}
	if o.Plain {
		h.daemon = plainDaemon(t)
	}
	if o.Daemon != "" {
		h.daemon = o.Daemon
	}
	if h.Home == "" {
		h.Home = filepath.Join(baseDir(t), "home")
	}
	h.Log = filepath.Join(filepath.Dir(h.Home), filepath.Base(h.Home)+".log")
	h.start(t)
	t.Cleanup(func() {
		h.Stop(t)
		if b, err := os.ReadFile(h.Log); err == nil && strings.Contains(string(b), raceReport) {
			t.Errorf("bushostd (built with -race) reported a data race")
		}
		if t.Failed() {
			if b, err := os.ReadFile(h.Log); err == nil {
				t.Logf("bushostd log:\n%s", tail(string(b), 8000))
			}
		}
	})
	return h
}

// startSharing starts n bushostd that share one broker store (args name
// it, with any other flags), each with a log signing key of its own and
// all trusting every one of those keys, as docs/scaling.md sets hosts up.
func startSharing(t testing.TB, n int, args ...string) []*Host {
	t.Helper()
	var hosts []*Host
	for _, a := range sharedLogKeys(t, n) {
		hosts = append(hosts, startHostWith(t, hostOpts{Args: append(append([]string{}, args...), a...)}))
	}
	return hosts
}

// sharedLogKeys makes the signing keys of n hosts sharing one store and a
// trusted-keys file listing them all, and returns each host's flags.
func sharedLogKeys(t testing.TB, n int) [][]string {
	t.Helper()
	dir := baseDir(t)
	trusted := filepath.Join(dir, "trusted-keys")
	var list []byte
	var out [][]string
	for i := 0; i < n; i++ {
		key, data, err := broker.NewSigningKey()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("log-%d.key", i))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		list = append(list, broker.PublicKeyPEM(key.Public().(ed25519.PublicKey), fmt.Sprintf("host %d", i))...)
		out = append(out, []string{"--log-key", path, "--log-trusted-keys", trusted})
	}
	if err := os.WriteFile(trusted, list, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func (h *Host) start(t testing.TB) {
	t.Helper()
	logf, err := os.OpenFile(h.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--home", h.Home}, h.Args...)
	cmd := exec.Command(h.daemon, args...)
	if len(h.Env) > 0 {
		cmd.Env = append(os.Environ(), h.Env...)
	}
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	logf.Close()
	h.cmd = cmd
	h.exited = make(chan error, 1)
	go func() { h.exited <- cmd.Wait() }()
	if err := h.waitReady(20 * time.Second); err != nil {
		b, _ := os.ReadFile(h.Log)
		t.Fatalf("bushostd did not come up: %v\nlog:\n%s", err, tail(string(b), 4000))
	}
}

// waitReady waits until both sockets accept connections.
func (h *Host) waitReady(d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		select {
		case err := <-h.exited:
			h.exited <- err
			return &exitedError{err}
		default:
		}
		ok := true
		for _, s := range []string{"git.sock", "broker.sock"} {
			c, err := net.Dial("unix", filepath.Join(h.Home, s))
			if err != nil {
				ok = false
				break
			}
			c.Close()
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type exitedError struct{ err error }

func (e *exitedError) Error() string { return "bushostd exited: " + errString(e.err) }

func errString(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// PID is the running daemon's process id.
func (h *Host) PID() int { return h.cmd.Process.Pid }

// Kill stops the daemon with SIGKILL, as a crash would.
func (h *Host) Kill() {
	if h.cmd == nil {
		return
	}
	h.cmd.Process.Signal(syscall.SIGKILL)
	<-h.exited
	h.cmd = nil
}

// Stop stops the daemon with SIGTERM and waits for it (SIGKILL after 30 s).
// It returns the daemon's exit error (nil for exit 0).
func (h *Host) Stop(t testing.TB) error {
	if h.cmd == nil {
		return nil
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-h.exited:
	case <-time.After(30 * time.Second):
		t.Errorf("bushostd did not stop within 30s of SIGTERM")
		h.cmd.Process.Signal(syscall.SIGKILL)
		err = <-h.exited
	}
	h.cmd = nil
	return err
}

// Restart starts the daemon again on the same home (after Kill or Stop).
func (h *Host) Restart(t testing.TB) {
	t.Helper()
	if h.cmd != nil {
		h.Stop(t)
	}
	h.start(t)
}

// Run runs bushost with --home h.Home, the given extra environment
// ("NAME=value") and args, and returns what it printed and its exit code.
func (h *Host) Run(t testing.TB, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return h.RunIn(t, "", env, args...)
}

// RunIn is Run in directory dir.
func (h *Host) RunIn(t testing.TB, dir string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	stdout, stderr, code, _ = h.RunCPU(t, dir, env, args...)
	return stdout, stderr, code
}

// RunCPU is RunIn that also returns the CPU bushost and the children it
// waited for (its git processes) used: the rusage wait4 reports.
func (h *Host) RunCPU(t testing.TB, dir string, env []string, args ...string) (stdout, stderr string, code int, cpu time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.client, append([]string{"--home", h.Home}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	err := cmd.Run()
	code = 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("bushost %v: %v", args, err)
		}
		code = ee.ExitCode()
	}
	if strings.Contains(errb.String(), raceReport) {
		t.Errorf("bushost %v (built with -race) reported a data race:\n%s", args, errb.String())
	}
	if cmd.ProcessState != nil {
		cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	return out.String(), errb.String(), code, cpu
}

// raceReport starts what a binary built with -race prints on a data race.
const raceReport = "WARNING: DATA RACE"

// Must runs bushost and fails the test unless it exits 0; it returns stdout
// trimmed.
func (h *Host) Must(t testing.TB, args ...string) string {
	t.Helper()
	out, errs, code := h.Run(t, nil, args...)
	if code != 0 {
		t.Fatalf("bushost %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return strings.TrimSpace(out)
}

// Grant adds the task (idempotent) and issues a grant for it; the token is
// written 0600 to a file whose path is returned.
func (h *Host) Grant(t testing.TB, business, project, task, role string, caps ...string) string {
	t.Helper()
	h.Must(t, "task", "add", "--business", business, "--project", project, "--task", task)
	f := filepath.Join(filepath.Dir(h.Home), "token-"+business+"-"+project+"-"+task+"-"+role+"-"+randSuffix())
	h.Must(t, "grant", "--business", business, "--project", project, "--task", task,
		"--role", role, "--cap", strings.Join(caps, ","), "--out", f)
	return f
}

// PoolRepo is business/project's pool (main and what landed).
func (h *Host) PoolRepo(business, project string) string {
	return filepath.Join(h.Home, "repos", business, project, "pool.git")
}

// TaskRepo is the repository of task in business/project (refs/work/<task>;
// made on the task's first push).
func (h *Host) TaskRepo(business, project, task string) string {
	return filepath.Join(h.Home, "repos", business, project, "tasks", task+".git")
}

// RefRepo is the repository that holds ref: a task's for refs/work/<task>,
// else the pool.
func (h *Host) RefRepo(business, project, ref string) string {
	if task, ok := strings.CutPrefix(ref, "refs/work/"); ok {
		return h.TaskRepo(business, project, task)
	}
	return h.PoolRepo(business, project)
}

// FsckProject runs git fsck --strict (with extra flags) on the pool and on
// every task repository of business/project.
func (h *Host) FsckProject(t testing.TB, business, project string, flags ...string) {
	t.Helper()
	tasks, _ := filepath.Glob(filepath.Join(h.Home, "repos", business, project, "tasks", "*.git"))
	for _, r := range append([]string{h.PoolRepo(business, project)}, tasks...) {
		testGit(t, r, append([]string{"fsck", "--strict", "--no-progress"}, flags...)...)
	}
}

// AddProject makes a small git repository as the project's root and adds
// the project with it; it returns the root.
func (h *Host) AddProject(t testing.TB, business, project string) string {
	t.Helper()
	root := filepath.Join(filepath.Dir(h.Home), "root-"+business+"-"+project)
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	testGit(t, root, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(root, "README.md"), []byte("# "+project+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, root, "add", "README.md")
	testGit(t, root, "commit", "-q", "-m", "seed "+project)
	h.Must(t, "project", "add", "--business", business, "--project", project, "--root", root)
	return root
}

// testGit runs the real git for a test's own setup, isolated from the
// machine's config, and returns its stdout trimmed. (The product's code runs
// git only through internal/gitcmd; tests use git directly to build and
// inspect repositories as a person would.)
func testGit(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=tester", "GIT_AUTHOR_EMAIL=tester@localhost",
		"GIT_COMMITTER_NAME=tester", "GIT_COMMITTER_EMAIL=tester@localhost")
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("git %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// cleanEnv is the environment for processes a test starts: PATH and HOME of
// a throwaway kind, nothing of the caller's git or bus host settings.
func cleanEnv() []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "GORACE=" + os.Getenv("GORACE")}
	if h := os.Getenv("HOME"); h != "" {
		env = append(env, "HOME="+h)
	}
	return env
}

func randSuffix() string {
	var b [4]byte
	f, err := os.Open("/dev/urandom")
	if err == nil {
		f.Read(b[:])
		f.Close()
	}
	const hex = "0123456789abcdef"
	out := make([]byte, 8)
	for i, x := range b {
		out[2*i], out[2*i+1] = hex[x>>4], hex[x&15]
	}
	return string(out)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}
