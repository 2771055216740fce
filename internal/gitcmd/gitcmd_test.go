package gitcmd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
	"golang.org/x/sys/unix"
)

func newRunner(t *testing.T) *Runner {
	t.Helper()
	r, err := New(filepath.Join(t.TempDir(), "home"))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustRun(t *testing.T, r *Runner, c Cmd) string {
	t.Helper()
	out, err := r.Line(context.Background(), c, MaxLine)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// initRepo makes a repository with one commit, through the Runner.
func initRepo(t *testing.T, r *Runner) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "repo")
	mustRun(t, r, Cmd{Sub: "init", Flags: []string{"-q"}, Args: []string{dir}})
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, r, Cmd{Dir: dir, Sub: "add", Args: []string{"f"}})
	mustRun(t, r, Cmd{Dir: dir, Sub: "commit", Flags: []string{"-q", "--message=one"}, Env: author()})
	return dir
}

func author() []string {
	return []string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@localhost", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@localhost"}
}

// A hook in the repository, a hostile ~/.gitconfig, a repository config that
// turns on fsmonitor and GIT_* variables in our own environment must change
// nothing about what git does for us.
func TestHostileSurroundingsChangeNothing(t *testing.T) {
	r := newRunner(t)
	dir := initRepo(t, r)
	marker := filepath.Join(t.TempDir(), "pwned")
	evil := "#!/bin/sh\ntouch " + marker + "\n"

	hook := filepath.Join(dir, ".git", "hooks", "pre-commit")
	if err := os.WriteFile(hook, []byte(evil), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"post-commit", "reference-transaction", "post-index-change"} {
		if err := os.WriteFile(filepath.Join(dir, ".git", "hooks", h), []byte(evil), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(t.TempDir(), "evil.sh")
	if err := os.WriteFile(script, []byte(evil), 0o755); err != nil {
		t.Fatal(err)
	}
	// Repository config a hostile agent could write.
	cfg := "[core]\n\tfsmonitor = " + script + "\n\thooksPath = .git/hooks\n\tpager = " + script + "\n[commit]\n\tgpgSign = true\n[gpg]\n\tprogram = " + script + "\n"
	f, err := os.OpenFile(filepath.Join(dir, ".git", "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(cfg)
	f.Close()

	// Our process's own HOME and GIT_* variables.
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, ".gitconfig"), []byte("[core]\n\thooksPath = "+filepath.Dir(hook)+"\n[user]\n\tname = evil\n"), 0o644)
	other := initRepo(t, r)
	t.Setenv("HOME", home)
	t.Setenv("GIT_DIR", filepath.Join(other, ".git"))
	t.Setenv("GIT_CONFIG_COUNT", "1")
	t.Setenv("GIT_CONFIG_KEY_0", "core.hooksPath")
	t.Setenv("GIT_CONFIG_VALUE_0", filepath.Dir(hook))
	t.Setenv("GIT_CONFIG_PARAMETERS", "'core.hookspath'='"+filepath.Dir(hook)+"'")
	t.Setenv("GIT_INDEX_FILE", "/nonexistent/index")

	os.WriteFile(filepath.Join(dir, "g"), []byte("y\n"), 0o644)
	mustRun(t, r, Cmd{Dir: dir, Sub: "add", Args: []string{"g"}})
	mustRun(t, r, Cmd{Dir: dir, Sub: "commit", Flags: []string{"-q", "--message=two"}, Env: author()})
	mustRun(t, r, Cmd{Dir: dir, Sub: "status", Flags: []string{"--porcelain"}})
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a hook, fsmonitor, pager or gpg program ran")
	}
	// The commit went to dir, not to $GIT_DIR's repository.
	log := mustRun(t, r, Cmd{Dir: dir, Sub: "log", Flags: []string{"--format=%s %an"}})
	if log != "two t\none t" {
		t.Fatalf("log in dir = %q", log)
	}
	otherLog := mustRun(t, r, Cmd{Dir: other, Sub: "log", Flags: []string{"--format=%s"}})
	if otherLog != "one" {
		t.Fatalf("GIT_DIR's repository was touched: %q", otherLog)
	}
}

func TestRefusesWhatIsNotAllowed(t *testing.T) {
	r := newRunner(t)
	cases := []struct {
		name string
		cmd  Cmd
		want string
	}{
		{"subcommand", Cmd{Sub: "daemon"}, "not allowed"},
		{"upload-pack", Cmd{Sub: "upload-pack"}, "not allowed"},
		{"flag without dash", Cmd{Sub: "log", Flags: []string{"HEAD"}}, "does not start with '-'"},
		{"option-like value", Cmd{Sub: "index-pack", Args: []string{"--stdin"}}, "could be read as an option"},
		{"environment", Cmd{Sub: "status", Env: []string{"GIT_DIR=/"}}, "not allowed"},
		{"config", Cmd{Sub: "status", Config: []string{"--exec-path"}}, "bad config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := r.Run(context.Background(), c.cmd)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

// A value that looks like an option is a value: the ref "--output=x" is not
// taken as a flag.
func TestValuesAfterEndOfOptions(t *testing.T) {
	r := newRunner(t)
	dir := initRepo(t, r)
	out := filepath.Join(t.TempDir(), "written")
	err := r.Run(context.Background(), Cmd{Dir: dir, Sub: "log", Args: []string{"--output=" + out}})
	if err == nil {
		t.Fatal("log of a ref named like an option succeeded")
	}
	if _, serr := os.Stat(out); serr == nil {
		t.Fatal("value was read as --output")
	}
}

func TestErrorKeepsStderrAndExitCode(t *testing.T) {
	r := newRunner(t)
	dir := initRepo(t, r)
	err := r.Run(context.Background(), Cmd{Dir: dir, Sub: "cat-file", Flags: []string{"-t"}, Args: []string{"0000000000000000000000000000000000000001"}})
	if ExitCode(err) != 128 {
		t.Fatalf("exit = %d, err = %v", ExitCode(err), err)
	}
	if !strings.Contains(err.Error(), "could not get object info") {
		t.Fatalf("stderr not kept: %v", err)
	}
}

func TestTimeoutKillsGit(t *testing.T) {
	base := newRunner(t)
	// The repository is made without the short timeout: under load, git
	// init alone may take longer than it.
	dir := initRepo(t, base)
	r := base.WithTimeout(200 * time.Millisecond)
	pr, pw, _ := os.Pipe()
	defer pw.Close()
	start := time.Now()
	// hash-object --stdin waits on a pipe nobody writes.
	err := r.Run(context.Background(), Cmd{Dir: dir, Sub: "hash-object", Flags: []string{"--stdin"}, Stdin: pr})
	if err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("err = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestOutputCapped: Output reads at most its cap. Past it, git is killed
// at once (here it would otherwise wait on a stdin nobody closes, and the
// runner has no timeout) and the call fails GIT_OUTPUT_TOO_LARGE; an
// answer of exactly the cap is whole.
func TestOutputCapped(t *testing.T) {
	r := newRunner(t).WithTimeout(0)
	dir := initRepo(t, r)
	blob := mustRun(t, r, Cmd{Dir: dir, Sub: "hash-object", Flags: []string{"-w", "--stdin"}, Stdin: strings.NewReader(strings.Repeat("x", 1<<20))})
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if _, err := pw.WriteString(blob + "\n"); err != nil {
		t.Fatal(err)
	}
	out, err := r.Output(context.Background(), Cmd{Dir: dir, Sub: "cat-file", Flags: []string{"--batch"}, Stdin: pr}, 4096)
	e, ok := errdefs.As(err)
	if !ok || e.Reason != errdefs.GitOutputTooLarge || e.Metadata["limit"] != "4096" || e.Metadata["command"] != "cat-file" {
		t.Fatalf("err = %v", err)
	}
	if len(out) > 4096 {
		t.Fatalf("read %d bytes past a cap of 4096", len(out))
	}
	if ExitCode(err) != -1 {
		t.Fatalf("exit = %d: git should have been killed", ExitCode(err))
	}

	id := mustRun(t, r, Cmd{Dir: dir, Sub: "rev-parse", Args: []string{"HEAD"}})
	if got, err := r.Line(context.Background(), Cmd{Dir: dir, Sub: "rev-parse", Args: []string{"HEAD"}}, len(id)+1); err != nil || got != id {
		t.Fatalf("an answer of exactly the cap: %q, %v", got, err)
	}
	if _, err := r.Line(context.Background(), Cmd{Dir: dir, Sub: "rev-parse", Args: []string{"HEAD"}}, len(id)); errdefs.ReasonOf(err) != errdefs.GitOutputTooLarge {
		t.Fatalf("one byte over: %v", err)
	}
	if _, err := r.Output(context.Background(), Cmd{Dir: dir, Sub: "rev-parse", Stdout: pw}, 10); err == nil {
		t.Fatal("Output took a Stdout of its own")
	}
}

func TestStderrBounded(t *testing.T) {
	b := &tailBuffer{limit: 10}
	b.Write([]byte("0123456789abcdef"))
	b.Write([]byte("more"))
	if got := b.String(); !strings.HasPrefix(got, "0123456789\n") || !strings.Contains(got, "truncated") {
		t.Fatalf("got %q", got)
	}
}

// TestParentDeathKillsGit: a git started by a WithParentDeath runner dies
// with the process that started it, and one started without it lives on
// and finishes its work (so the test would see the difference).
//
// Nothing here depends on timing: git is identified by its executable and
// pinned with a pidfd before its parent is killed (a reused pid cannot
// stand in for it), its end is waited for on that pidfd, and the one that
// lives proves it by writing, after its parent's death, the object the
// test feeds it only then.
func TestParentDeathKillsGit(t *testing.T) {
	if os.Getenv("GITCMD_TEST_PARENT") != "" {
		parentDeathChild()
		return
	}
	for _, tc := range []struct {
		mode      string
		wantAlive bool
	}{{"die", false}, {"live", true}} {
		t.Run(tc.mode, func(t *testing.T) {
			home := t.TempDir()
			r := newRunner(t)
			repo := filepath.Join(home, "repo.git")
			mustRun(t, r, Cmd{Dir: home, Sub: "init", Flags: []string{"-q", "--bare"}, Args: []string{repo}})
			// git reads a FIFO this test holds open for writing, so git
			// waits on it whether or not its parent lives, until the test
			// writes and closes it.
			fifo := filepath.Join(home, "stdin")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			hold, err := os.OpenFile(fifo, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Close()
			cmd := exec.Command(os.Args[0], "-test.run=^TestParentDeathKillsGit$")
			cmd.Env = append(os.Environ(), "GITCMD_TEST_PARENT="+tc.mode, "GITCMD_TEST_HOME="+home)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// The child prints git's pid once git runs (its executable is
			// git's, not the child's own before exec).
			var gitPid int
			if _, err := fmt.Fscan(out, &gitPid); err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("no pid from the child: %v", err)
			}
			// While the child lives, gitPid is its child and cannot be
			// reused: pin it.
			pidfd, err := unix.PidfdOpen(gitPid, 0)
			if err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("pidfd of git %d: %v", gitPid, err)
			}
			defer unix.Close(pidfd)
			defer unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
			if ppid := parentOf(t, gitPid); ppid != cmd.Process.Pid {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("process %d is not the child's: its parent is %d", gitPid, ppid)
			}
			cmd.Process.Kill()
			cmd.Wait()
			// The input git waits for, given only now that its parent is
			// dead; its end closes git's stdin.
			const content = "written after the parent died\n"
			if _, err := hold.WriteString(content); err != nil {
				t.Fatal(err)
			}
			hold.Close()
			// Ended, dead or done: the pidfd turns readable when git exits
			// (the bound only keeps a broken build from hanging the suite).
			fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			for {
				n, err := unix.Poll(fds, int(time.Minute/time.Millisecond))
				if err == unix.EINTR {
					continue
				}
				if err != nil || n != 1 {
					t.Fatalf("git %d still runs a minute after its parent died and its input ended (poll: %d, %v)", gitPid, n, err)
				}
				break
			}
			want := mustRun(t, r, Cmd{Dir: home, Sub: "hash-object", Flags: []string{"--stdin"}, Stdin: strings.NewReader(content)})
			err = r.Run(context.Background(), Cmd{Dir: repo, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{want}})
			switch {
			case tc.wantAlive && err != nil:
				t.Fatalf("git %d without the option did not outlive its parent to write %s: %v", gitPid, want, err)
			case !tc.wantAlive && err == nil:
				t.Fatalf("git %d with the option outlived its parent and wrote %s", gitPid, want)
			}
		})
	}
}

// parentOf returns pid's parent from /proc.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	var state string
	var ppid int
	fmt.Sscan(s[strings.LastIndexByte(s, ')')+1:], &state, &ppid)
	return ppid
}

// parentDeathChild starts git hash-object -w --stdin (into the test's
// repository, from the test's FIFO) through a Runner, with WithParentDeath
// when asked, prints git's pid once git runs, and waits to be killed.
func parentDeathChild() {
	home := os.Getenv("GITCMD_TEST_HOME")
	r, err := New(filepath.Join(home, "childhome"))
	if err != nil {
		os.Exit(3)
	}
	if os.Getenv("GITCMD_TEST_PARENT") == "die" {
		r = r.WithParentDeath()
	}
	gitExe, err := filepath.EvalSymlinks(r.gitPath)
	if err != nil {
		os.Exit(3)
	}
	in, err := os.Open(filepath.Join(home, "stdin"))
	if err != nil {
		os.Exit(3)
	}
	go r.Run(context.Background(), Cmd{Dir: filepath.Join(home, "repo.git"), Sub: "hash-object", Flags: []string{"-w", "--stdin"}, Stdin: in})
	self := os.Getpid()
	for {
		// git is the one child of this process whose executable is git
		// (before its exec, the child runs this binary).
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
			if err != nil {
				continue
			}
			s := string(b)
			i := strings.LastIndexByte(s, ')')
			if i < 0 {
				continue
			}
			var state string
			var ppid int
			fmt.Sscan(s[i+1:], &state, &ppid)
			if ppid != self {
				continue
			}
			if exe, err := os.Readlink("/proc/" + e.Name() + "/exe"); err == nil && exe == gitExe {
				fmt.Println(e.Name())
				select {}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}
