package integration

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// Issue 30's finding 6: what root (or the daemon) opens for itself,
// reached through a link or a directory another user controls, or owned
// or writable by another user, is refused, naming the path and its owner,
// and nothing is left behind.

// serveRefusedArgs runs bushostd serve ARGS, wants it refused (exit 1)
// with every one of wants in its output.
func serveRefusedArgs(t *testing.T, args []string, wants ...string) string {
	t.Helper()
	out, err := exec.Command(bin(t, "bushostd"), append([]string{"serve"}, args...)...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("bushostd serve %v: want exit 1, got %v\n%s", args, err, out)
	}
	for _, w := range wants {
		if !strings.Contains(string(out), w) {
			t.Errorf("refusal does not say %q:\n%s", w, out)
		}
	}
	return string(out)
}

// theirs makes a directory (mode 0755) or file owned by uid.
func theirs(t *testing.T, path string, uid int, dir bool) {
	t.Helper()
	var err error
	if dir {
		err = os.Mkdir(path, 0o755)
	} else {
		err = os.WriteFile(path, []byte("theirs\n"), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func mustEmpty(t *testing.T, dir string) {
	t.Helper()
	if got := entries(t, dir); len(got) != 0 {
		t.Errorf("%s: a refused start left %v", dir, got)
	}
}

// A home below a directory of another user's, or reached through a link
// (a root-owned one in root's directory included, and one in the other
// user's directory, the case): refused, naming where, and nothing
// is made.
func TestDaemonRefusesHomeThroughOthersOrLinks(t *testing.T) {
	name, uid := otherUser(t)
	base := baseDir(t)
	dir := filepath.Join(base, "theirs")
	theirs(t, dir, uid, true)
	serveRefusedArgs(t, []string{"--home", filepath.Join(dir, "home")}, dir, name, "belongs to another user")
	mustEmpty(t, dir)

	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	serveRefusedArgs(t, []string{"--home", filepath.Join(link, "home")}, link, "symbolic link", "root (uid 0)")
	mustEmpty(t, real)
	// The issue's: a link in the other user's directory, which they may
	// repoint whenever they like.
	theirLink := filepath.Join(dir, "l")
	if err := os.Symlink(real, theirLink); err != nil {
		t.Fatal(err)
	}
	os.Lchown(theirLink, uid, uid)
	serveRefusedArgs(t, []string{"--home", filepath.Join(theirLink, "home")}, dir, name)
	mustEmpty(t, real)
}

// --checkpoint-file linked to another user's file, that file itself, or a
// file in their directory: refused before the broker reads or writes it.
func TestDaemonRefusesForeignCheckpoint(t *testing.T) {
	name, uid := otherUser(t)
	base := baseDir(t)
	file := filepath.Join(base, "their.checkpoint")
	theirs(t, file, uid, false)
	link := filepath.Join(base, "checkpoint-link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "their-dir")
	theirs(t, dir, uid, true)
	for _, c := range []struct {
		path  string
		wants []string
	}{
		{link, []string{link, "symbolic link"}},
		{file, []string{file, name, "belongs to another user"}},
		{filepath.Join(dir, "checkpoint"), []string{dir, name}},
	} {
		home := filepath.Join(base, "home-"+randSuffix())
		serveRefusedArgs(t, []string{"--home", home, "--checkpoint-file", c.path}, c.wants...)
		if b, _ := os.ReadFile(file); string(b) != "theirs\n" {
			t.Errorf("their file changed: %q", b)
		}
		mustEmpty(t, dir)
	}
}

// A git home in the home that is a link or another user's directory, and
// a host-id another user owns: refused, naming them and the owner.
func TestDaemonRefusesForeignGitHomeAndHostID(t *testing.T) {
	name, uid := otherUser(t)
	base := baseDir(t)
	elsewhere := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	home := func() string {
		h := filepath.Join(base, "home-"+randSuffix())
		if err := os.Mkdir(h, 0o700); err != nil {
			t.Fatal(err)
		}
		return h
	}
	h := home()
	if err := os.Symlink(elsewhere, filepath.Join(h, "git-home")); err != nil {
		t.Fatal(err)
	}
	serveRefusedArgs(t, []string{"--home", h}, filepath.Join(h, "git-home"), "symbolic link")
	mustEmpty(t, elsewhere)
	h = home()
	theirs(t, filepath.Join(h, "git-home"), uid, true)
	serveRefusedArgs(t, []string{"--home", h}, filepath.Join(h, "git-home"), name)
	mustEmpty(t, filepath.Join(h, "git-home"))
	h = home()
	theirs(t, filepath.Join(h, "host-id"), uid, false)
	serveRefusedArgs(t, []string{"--home", h}, filepath.Join(h, "host-id"), name)
	if b, _ := os.ReadFile(filepath.Join(h, "host-id")); string(b) != "theirs\n" {
		t.Errorf("their host-id changed: %q", b)
	}
}

// runDirEnv is a root-prepared run directory, a workspace and a listening
// broker socket for sandbox run.
type runDirEnv struct {
	base, ws, run, broker, token string
}

func newRunDirEnv(t *testing.T) *runDirEnv {
	t.Helper()
	testenv.NeedRoot(t, "the rules are about what root opens for another user")
	base := baseDir(t)
	e := &runDirEnv{base: base, ws: filepath.Join(base, "ws"), run: filepath.Join(base, "run"), token: filepath.Join(base, "token")}
	if err := os.Mkdir(e.ws, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(base, "broker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	e.broker = l.Addr().String()
	os.Chmod(e.broker, 0o666)
	if err := os.WriteFile(e.token, []byte("t0k3n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *runDirEnv) prepare(t *testing.T, run, token string) (string, int) {
	t.Helper()
	return runBounded(t, nil, bin(t, "sandbox"), "prepare", "--run-dir", run, "--business", "acme", "--project", "web", "--task", "t1",
		"--role", "worker", "--caps", "git.push.working", "--token-file", token)
}

func (e *runDirEnv) runIn(t *testing.T) (string, int) {
	t.Helper()
	return runBounded(t, nil, bin(t, "sandbox"), "run", "--run-dir", e.run, "--workspace", e.ws, "--role", "worker", "--caps", "git.push.working",
		"--broker-socket", e.broker, "--", "touch", "ran")
}

// runBounded runs a command (env added to the test's) that must end by
// itself: a refusal that blocked (a fifo opened for reading) is killed
// after a minute and fails the test. It returns the combined output and
// the exit status.
func runBounded(t *testing.T, env []string, name string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %v blocked: %s", name, args, b)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(b), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(b), 0
}

// An existing run directory another user owns, or one others can write:
// prepare refuses it and writes nothing there.
func TestSandboxPrepareRefusesForeignRunDir(t *testing.T) {
	e := newRunDirEnv(t)
	name, uid := otherUser(t)
	dir := filepath.Join(e.base, "their-run")
	theirs(t, dir, uid, true)
	os.Chmod(dir, 0o777)
	out, code := e.prepare(t, dir, e.token)
	if code == 0 || !strings.Contains(out, dir) || !strings.Contains(out, name) {
		t.Errorf("prepare into %s's run directory: exit %d, want a refusal naming it and its owner\n%s", name, code, out)
	}
	mustEmpty(t, dir)
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o777 || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
		t.Errorf("the refused run directory changed: %v", fi.Mode())
	}
	open := filepath.Join(e.base, "open-run")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	out, code = e.prepare(t, open, e.token)
	if code == 0 || !strings.Contains(out, open) || !strings.Contains(out, "writable by group or others") {
		t.Errorf("prepare into a run directory others can write: exit %d\n%s", code, out)
	}
	mustEmpty(t, open)
}

// --token-file a fifo: refused at once, never opened (an open for reading
// would wait for a writer forever); nothing made.
func TestSandboxPrepareRefusesTokenFifo(t *testing.T) {
	e := newRunDirEnv(t)
	fifo := filepath.Join(e.base, "token.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	out, code := e.prepare(t, e.run, fifo)
	if code == 0 || !strings.Contains(out, fifo) || !strings.Contains(out, "not a regular file") {
		t.Errorf("prepare --token-file FIFO: exit %d, want a refusal naming it\n%s", code, out)
	}
	if _, err := os.Lstat(e.run); !os.IsNotExist(err) {
		t.Errorf("the refused prepare made %s: %v", e.run, err)
	}
	name, uid := otherUser(t)
	tok := filepath.Join(e.base, "their.token")
	theirs(t, tok, uid, false)
	os.Chmod(tok, 0o600)
	out, code = e.prepare(t, e.run, tok)
	if code == 0 || !strings.Contains(out, tok) || !strings.Contains(out, name) {
		t.Errorf("prepare --token-file of %s's: exit %d, want a refusal naming it and its owner\n%s", name, code, out)
	}
	if _, err := os.Lstat(e.run); !os.IsNotExist(err) {
		t.Errorf("the refused prepare made %s: %v", e.run, err)
	}
}

// A run directory, session.json or token another user owns or can write,
// and a token that is a fifo: sandbox run refuses at once, naming it and
// its owner; the command never runs.
func TestSandboxRunRefusesForeignRunFiles(t *testing.T) {
	e := newRunDirEnv(t)
	name, uid := otherUser(t)
	for _, c := range []struct {
		what  string
		setup func(t *testing.T) string // returns the path the refusal names
		wants []string
	}{
		{"run directory of another user", func(t *testing.T) string {
			os.Chown(e.run, uid, uid)
			return e.run
		}, []string{name, "belongs to another user"}},
		{"run directory others can write", func(t *testing.T) string {
			os.Chmod(e.run, 0o777)
			return e.run
		}, []string{"writable by group or others"}},
		{"session.json of another user", func(t *testing.T) string {
			p := filepath.Join(e.run, "session.json")
			os.Chown(p, uid, uid)
			return p
		}, []string{name, "belongs to another user"}},
		{"session.json others can write", func(t *testing.T) string {
			p := filepath.Join(e.run, "session.json")
			os.Chmod(p, 0o666)
			return p
		}, []string{"writable by group or others"}},
		{"token of another user", func(t *testing.T) string {
			p := filepath.Join(e.run, "token")
			os.Chown(p, uid, uid)
			return p
		}, []string{name, "belongs to another user"}},
		{"token that is a fifo", func(t *testing.T) string {
			p := filepath.Join(e.run, "token")
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, []string{"not a regular file"}},
	} {
		t.Run(c.what, func(t *testing.T) {
			os.RemoveAll(e.run)
			if out, code := e.prepare(t, e.run, e.token); code != 0 {
				t.Fatalf("sandbox prepare: exit %d\n%s", code, out)
			}
			path := c.setup(t)
			out, code := e.runIn(t)
			if code == 0 || !strings.Contains(out, path) {
				t.Errorf("exit %d, want a refusal naming %s\n%s", code, path, out)
			}
			for _, w := range c.wants {
				if !strings.Contains(out, w) {
					t.Errorf("the refusal does not say %q:\n%s", w, out)
				}
			}
			if _, err := os.Lstat(filepath.Join(e.ws, "ran")); err == nil {
				t.Errorf("the command ran")
			}
			if got := entries(t, e.run); strings.Join(got, " ") != "bundle home session.json tmp token" {
				t.Errorf("the run directory after the refusal: %v", got)
			}
		})
	}
}

// A daemon running as root takes a project root only through root's
// own directories: a root below another user's directory (who could swap
// it under git's feet, and whom publish would write for) is refused,
// naming the directory and its owner; no project is made.
func TestProjectRootThroughOthersRefused(t *testing.T) {
	testenv.NeedRoot(t, "the rule is for a daemon running as root")
	h := startHost(t)
	name, uid := otherUser(t)
	dir := filepath.Join(filepath.Dir(h.Home), "their-dir")
	theirs(t, dir, uid, true)
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	testGit(t, root, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(root, "README.md"), []byte("# p\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, root, "add", "README.md")
	testGit(t, root, "commit", "-q", "-m", "seed")
	_, errOut, code := h.Run(t, nil, "project", "add", "--business", "acme", "--project", "p", "--root", root)
	if code != 1 || !strings.Contains(errOut, dir) || !strings.Contains(errOut, name) || !strings.Contains(errOut, "PATH_UNSAFE") {
		t.Errorf("project add --root below %s's directory: exit %d, want 1 naming %s and its owner\n%s", name, code, dir, errOut)
	}
	if out := h.Must(t, "project", "list"); strings.Contains(out, "acme") {
		t.Errorf("the refused project was made:\n%s", out)
	}
}
