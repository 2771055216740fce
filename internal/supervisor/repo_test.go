package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
)

var (
	testAgent = Identity{Name: "agent", Email: "agent@localhost"}
	testSup   = Identity{Name: "supervisor", Email: "supervisor@localhost"}
)

func newTestRepo(t *testing.T) (*Repo, string) {
	t.Helper()
	git, err := gitcmd.New(filepath.Join(t.TempDir(), "githome"))
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	r := NewRepo(git, ws, filepath.Join(base, "sup.git"), []string{"src"}, Default().Ignore, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := r.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r, ws
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// authorOf returns "name <email>" of rev's author and committer.
func authorOf(t *testing.T, r *Repo, rev string) (string, string) {
	t.Helper()
	out, err := r.git.Line(context.Background(), r.cmd("log", []string{"-1", "--format=%an <%ae>%n%cn <%ce>"}, rev), gitcmd.MaxLine)
	if err != nil {
		t.Fatal(err)
	}
	a, c, _ := strings.Cut(out, "\n")
	return a, c
}

func TestRepoCommitsOnlyWatchedTreesAsTheAgent(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	if err := r.Ensure(ctx); err != nil {
		t.Fatal("Ensure is not idempotent:", err)
	}
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "one\n")
	writeFile(t, filepath.Join(ws, "infra", "AGENTS.md"), "rules\n")
	first, _, err := r.InitialCommit(ctx, testSup)
	if err != nil || first == "" {
		t.Fatal(first, err)
	}
	if again, _, err := r.InitialCommit(ctx, testSup); err != nil || again != first {
		t.Fatalf("second InitialCommit = %s, %v", again, err)
	}

	c, paths, err := r.CommitPending(ctx, testAgent)
	if err != nil || c != "" || len(paths) != 0 {
		t.Fatalf("no edit, yet commit %q %v %v", c, paths, err)
	}

	writeFile(t, filepath.Join(ws, "src", "a.txt"), "two\n")
	writeFile(t, filepath.Join(ws, "src", "node_modules", "dep.js"), "ignored\n")
	writeFile(t, filepath.Join(ws, "src", "new", "b.txt"), "b\n")
	writeFile(t, filepath.Join(ws, "notes.txt"), "outside the watched trees\n")
	c, paths, err = r.CommitPending(ctx, testAgent)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(paths, ",") != "src/a.txt,src/new/b.txt" {
		t.Errorf("committed %v", paths)
	}
	if a, cm := authorOf(t, r, c); a != "agent <agent@localhost>" || cm != a {
		t.Errorf("author %q committer %q", a, cm)
	}
	files, err := r.git.Line(ctx, r.cmd("ls-tree", []string{"-r", "--name-only"}, c), 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if files != "src/a.txt\nsrc/new/b.txt" {
		t.Errorf("tree holds:\n%s", files)
	}
}

func TestRepoRevert(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "good\n")
	good, _, err := r.InitialCommit(ctx, testSup)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetGood(ctx, good, ""); err != nil {
		t.Fatal(err)
	}
	if err := r.SetGood(ctx, good, ""); err == nil {
		t.Error("SetGood with a stale old value succeeded")
	}
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "bad\n")
	writeFile(t, filepath.Join(ws, "src", "added.txt"), "new\n")
	bad, _, err := r.CommitPending(ctx, testAgent)
	if err != nil {
		t.Fatal(err)
	}
	// An edit not yet committed when the revert comes is recorded first.
	writeFile(t, filepath.Join(ws, "src", "late.txt"), "late\n")
	writeFile(t, filepath.Join(ws, "AGENTS.md"), "untracked, must survive\n")

	from, rev, err := r.Revert(ctx, good, testAgent, testSup, "a crash loop")
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := authorOf(t, r, rev); a != "supervisor <supervisor@localhost>" {
		t.Errorf("revert author %q", a)
	}
	gt, _ := r.Tree(ctx, good)
	rt, _ := r.Tree(ctx, rev)
	if gt != rt {
		t.Errorf("revert tree %s, good tree %s", rt, gt)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "src", "a.txt")); string(b) != "good\n" {
		t.Errorf("a.txt = %q", b)
	}
	for _, gone := range []string{"added.txt", "late.txt"} {
		if _, err := os.Stat(filepath.Join(ws, "src", gone)); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", gone, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "AGENTS.md")); string(b) != "untracked, must survive\n" {
		t.Errorf("AGENTS.md = %q", b)
	}
	parent, err := r.git.Line(ctx, r.cmd("rev-parse", nil, rev+"^"), gitcmd.MaxLine)
	if err != nil {
		t.Fatal(err)
	}
	if parent == bad || parent != from {
		t.Errorf("revert's parent %s, reverted from %s: the late edit was not committed first", parent, from)
	}
	if a, _ := authorOf(t, r, parent); a != "agent <agent@localhost>" {
		t.Errorf("late edit author %q", a)
	}
	// A revert when the trees already are the good commit makes no
	// commit: there is nothing to revert.
	head, _ := r.Head(ctx)
	if _, again, err := r.Revert(ctx, good, testAgent, testSup, "again"); !errors.Is(err, ErrNothingToRevert) || again != "" {
		t.Errorf("revert with nothing to revert: %q %v", again, err)
	}
	if now, _ := r.Head(ctx); now != head {
		t.Errorf("HEAD moved from %s to %s with nothing to revert", head, now)
	}
	// An ignored file is something to revert: it goes.
	writeFile(t, filepath.Join(ws, "src", "debug.log"), "ignored\n")
	if _, again, err := r.Revert(ctx, good, testAgent, testSup, "ignored file"); err != nil || again == "" {
		t.Errorf("revert of an ignored file: %q %v", again, err)
	}
	if _, err := os.Stat(filepath.Join(ws, "src", "debug.log")); !os.IsNotExist(err) {
		t.Errorf("debug.log survived the revert: %v", err)
	}
	// The supervisor's own reset leaves nothing to commit.
	if c, _, err := r.CommitPending(ctx, testAgent); c != "" || err != nil {
		t.Errorf("commit after revert: %q %v", c, err)
	}
}

// The agent's own git in the workspace, its .gitignore, .gitattributes and
// exclude files: none of them hides a file from the supervisor, runs a
// program, or converts content; a revert leaves the watched trees exactly
// as the good commit, ignored files included.
func TestRepoIgnoresTheAgentsGitFiles(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "one\n")
	good, _, err := r.InitialCommit(ctx, testSup)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	agentGit := filepath.Join(ws, ".git")
	writeFile(t, filepath.Join(agentGit, "HEAD"), "ref: refs/heads/main\n")
	writeFile(t, filepath.Join(agentGit, "config"), "[core]\n\tworktree = "+dir+"\n\tfsmonitor = touch "+marker+"-fsmonitor\n"+
		"[filter \"evil\"]\n\tclean = touch "+marker+"-clean\n\tsmudge = touch "+marker+"-smudge\n")
	writeFile(t, filepath.Join(agentGit, "info", "exclude"), "implant-exclude\n")
	writeFile(t, filepath.Join(ws, "src", ".gitignore"), "implant-gitignore\n*.secret\n")
	writeFile(t, filepath.Join(ws, "src", ".gitattributes"), "* filter=evil text eol=crlf ident\n")
	writeFile(t, filepath.Join(ws, "src", "implant-exclude"), "x\n")
	writeFile(t, filepath.Join(ws, "src", "implant-gitignore"), "x\n")
	writeFile(t, filepath.Join(ws, "src", "deep", "k.secret"), "x\n")
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "two\r\n$Id$\n")
	writeFile(t, filepath.Join(ws, "src", "node_modules", "implant.js"), "x\n")
	writeFile(t, filepath.Join(ws, "src", "sub", ".env"), "x\n")

	c, paths, err := r.CommitPending(ctx, testAgent)
	if err != nil || c == "" {
		t.Fatalf("commit: %v", err)
	}
	want := "src/.gitattributes,src/.gitignore,src/a.txt,src/deep/k.secret,src/implant-exclude,src/implant-gitignore"
	if got := strings.Join(paths, ","); got != want {
		t.Errorf("committed %s\nwant      %s", got, want)
	}
	blob, err := r.git.Output(ctx, r.cmd("cat-file", []string{"-p"}, c+":src/a.txt"), 16<<20)
	if err != nil || string(blob) != "two\r\n$Id$\n" {
		t.Errorf("a.txt committed as %q (%v): attributes converted it", blob, err)
	}
	if _, _, err := r.Revert(ctx, good, testAgent, testSup, "test"); err != nil {
		t.Fatal(err)
	}
	if matches, _ := filepath.Glob(marker + "*"); len(matches) > 0 {
		t.Errorf("git ran the agent's programs: %v", matches)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("git wrote to the agent's core.worktree: %v", entries)
	}
	var onDisk []string
	filepath.WalkDir(filepath.Join(ws, "src"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(ws, p)
			onDisk = append(onDisk, rel)
		}
		return err
	})
	if strings.Join(onDisk, ",") != "src/a.txt" {
		t.Errorf("after the revert the watched tree holds %v, want only src/a.txt", onDisk)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "src", "a.txt")); string(b) != "one\n" {
		t.Errorf("a.txt = %q", b)
	}
	if _, err := os.Stat(filepath.Join(agentGit, "config")); err != nil {
		t.Errorf("the agent's own git was touched: %v", err)
	}
}

// A file name can add neither a line nor a trailer to a commit message.
func TestRepoCommitMessageQuotesPaths(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "one\n")
	if _, _, err := r.InitialCommit(ctx, testSup); err != nil {
		t.Fatal(err)
	}
	evil := "nl\n\nReverted-from: deadbeef\nGood: cafe\nSigned-off-by: x <y@z>"
	writeFile(t, filepath.Join(ws, "src", evil), "x\n")
	writeFile(t, filepath.Join(ws, "src", "Good: cafe"), "x\n")
	c, _, err := r.CommitPending(ctx, testAgent)
	if err != nil {
		t.Fatal(err)
	}
	trailers, err := r.git.Output(ctx, r.cmd("log", []string{"-1", "--format=%(trailers)"}, c), 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(trailers)); got != RecordedTrailer {
		t.Errorf("trailers %q, want only %q", got, RecordedTrailer)
	}
	msg, _ := r.git.Output(ctx, r.cmd("log", []string{"-1", "--format=%B"}, c), 16<<20)
	if !strings.Contains(string(msg), "  "+QuotePath("src/"+evil)+"\n") {
		t.Errorf("message does not hold the quoted path:\n%s", msg)
	}
}

func TestQuotePath(t *testing.T) {
	for in, want := range map[string]string{
		"src/a.txt":   "src/a.txt",
		"a b":         "a b",
		"a\nb":        `"a\nb"`,
		`q"\`:         `"q\"\\"`,
		"tab\there":   `"tab\there"`,
		"caf\xc3\xa9": `"caf\303\251"`,
		"\x01\x7f":    `"\001\177"`,
	} {
		if got := QuotePath(in); got != want {
			t.Errorf("QuotePath(%q) = %s, want %s", in, got, want)
		}
	}
}

// The git dir must be the supervisor's alone.
func TestRepoRefusesASharedGitDir(t *testing.T) {
	git, err := gitcmd.New(filepath.Join(t.TempDir(), "githome"))
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	gitDir := filepath.Join(base, "sup.git")
	if err := os.Mkdir(gitDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(gitDir, 0o777); err != nil {
		t.Fatal(err)
	}
	r := NewRepo(git, filepath.Join(base, "ws"), gitDir, []string{"src"}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	err = r.Ensure(context.Background())
	if errdefs.ReasonOf(err) != errdefs.GitDirUnsafe {
		t.Fatalf("Ensure on a 0777 git dir: %v", err)
	}
	if entries, _ := os.ReadDir(gitDir); len(entries) != 0 {
		t.Errorf("refused git dir was written: %v", entries)
	}
	link := filepath.Join(base, "link.git")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	r = NewRepo(git, filepath.Join(base, "ws"), link, []string{"src"}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := r.Ensure(context.Background()); errdefs.ReasonOf(err) != errdefs.GitDirUnsafe {
		t.Fatalf("Ensure on a linked git dir: %v", err)
	}
}

// A repository the agent makes in a watched tree neither blocks commits nor
// survives a revert.
func TestRepoNestedRepository(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "one\n")
	good, _, err := r.InitialCommit(ctx, testSup)
	if err != nil {
		t.Fatal(err)
	}
	// An empty repository (git add would fail on it) and a file beside it.
	writeFile(t, filepath.Join(ws, "src", "evil", ".git", "HEAD"), "ref: refs/heads/main\n")
	for _, d := range []string{"objects", "refs"} {
		if err := os.MkdirAll(filepath.Join(ws, "src", "evil", ".git", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(ws, "src", "evil", "implant"), "x\n")
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "two\n")
	c, paths, err := r.CommitPending(ctx, testAgent)
	if err != nil || c == "" {
		t.Fatalf("commit blocked by a nested repository: %v", err)
	}
	if strings.Join(paths, ",") != "src/a.txt" {
		t.Errorf("committed %v", paths)
	}
	if _, _, err := r.Revert(ctx, good, testAgent, testSup, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(ws, "src", "evil")); !os.IsNotExist(err) {
		t.Errorf("the nested repository survived the revert: %v", err)
	}
}

// blockedThenReverted checks that the agent's pending edits are refused
// as a tree that cannot be recorded, with want in the reason, and that a
// revert to good leaves src holding left (filesUnderTree) and nothing else.
func blockedThenReverted(t *testing.T, r *Repo, ws, good, want, left string) {
	t.Helper()
	ctx := context.Background()
	var be *BlockedError
	if _, _, err := r.CommitPending(ctx, testAgent); !errors.As(err, &be) || !strings.Contains(err.Error(), want) {
		t.Fatalf("commit: %.300v, want it refused for %q", err, want)
	}
	if _, _, err := r.Revert(ctx, good, testAgent, testSup, "blocked"); err != nil {
		t.Fatal(err)
	}
	if got := filesUnderTree(t, filepath.Join(ws, "src")); got != left {
		t.Errorf("after the revert src holds %.200q, want %q", got, left)
	}
}

// A sparse file of a terabyte costs the agent nothing to make and git
// hours to read: staging it would hold the supervisor (and its health
// answers, which wait for the same lock) for the whole of gitTimeout at
// every try. It is refused by name before git runs, and a revert removes
// it. The runner's timeout only keeps a supervisor without the bound from
// hanging this test.
func TestRepoRefusesAHugeSparseFile(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	r.git = r.git.WithTimeout(20 * time.Second)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "good\n")
	good, _, err := r.InitialCommit(ctx, testSup)
	if err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(ws, "src", "lib", "big.bin")
	writeFile(t, big, "")
	if err := os.Truncate(big, 1<<40); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "an edit beside it\n")
	blockedThenReverted(t, r, ws, good, "src/lib/big.bin", "a.txt")

	// The same terabyte in files each under the bound: the sum is refused.
	for i := range maxTreeBytes/maxFileSize + 1 {
		p := filepath.Join(ws, "src", fmt.Sprintf("part%02d.bin", i))
		writeFile(t, p, "")
		if err := os.Truncate(p, maxFileSize); err != nil {
			t.Fatal(err)
		}
	}
	blockedThenReverted(t, r, ws, good, "bytes of files", "a.txt")
}

// Names git refuses to record (git~1 and ".git " under core.protectNTFS, a
// .gitmodules that is a link) fail the whole git add. With the history
// lost, that was every boot's first commit failing: the supervisor never
// started. They block commits by name instead, like a tree too deep.
func TestRepoNamesGitRefusesBlockNotBoot(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "the agent's work\n")
	writeFile(t, filepath.Join(ws, "src", "lib", "git~1"), "x\n")
	if err := os.Symlink("a.txt", filepath.Join(ws, "src", ".gitmodules")); err != nil {
		t.Fatal(err)
	}
	head, adopted, err := r.InitialCommit(ctx, testSup)
	if err != nil || head == "" || !adopted {
		t.Fatalf("first commit next to names git refuses: %q adopted=%v %v", head, adopted, err)
	}
	// git stops at the first it meets: each is named in turn.
	for _, name := range []string{"src/.gitmodules", "src/lib/git~1"} {
		var be *BlockedError
		_, _, err = r.CommitPending(ctx, testAgent)
		if !errors.As(err, &be) || !strings.Contains(err.Error(), "'"+name+"' is a name git refuses") {
			t.Fatalf("commit with %s: %v, want it refused by name", name, err)
		}
		if err := os.Remove(filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	if c, paths, err := r.CommitPending(ctx, testAgent); err != nil || c == "" || strings.Join(paths, ",") != "src/a.txt" {
		t.Errorf("commit once they are gone: %q %v %v", c, paths, err)
	}
}

// Each repository the agent makes in a watched tree becomes an exclude
// pathspec on git's command line: ten thousand of them with long names
// are more than exec takes (E2BIG), and every commit failed, the first
// commit of a lost history too, so the supervisor never started. Past a
// bound they block commits by name instead; a revert removes them.
func TestRepoManyNestedRepositories(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "the agent's work\n")
	long := strings.Repeat("r", 200)
	for i := range 10000 {
		writeFile(t, filepath.Join(ws, "src", "repos", fmt.Sprintf("%s%05d", long, i), ".git"), "gitdir: x\n")
	}
	head, adopted, err := r.InitialCommit(ctx, testSup)
	if err != nil || head == "" || !adopted {
		t.Fatalf("first commit next to 10,000 repositories: %q adopted=%v %v", head, adopted, err)
	}
	blockedThenReverted(t, r, ws, head, "repositories", "")
}

// Names cost the agent no inode (hard links), and git holds an index
// entry for each: millions of them take git's memory at every commit (and
// the first commit of a lost history with it). More than maxTreeEntries
// entries in the watched trees block commits by count, before git runs.
func TestRepoRefusesTooManyEntries(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "good\n")
	good, _, err := r.InitialCommit(ctx, testSup)
	if err != nil {
		t.Fatal(err)
	}
	many := filepath.Join(ws, "src", "many")
	writeFile(t, filepath.Join(many, "f0"), "x")
	writeFile(t, filepath.Join(many, "f1"), "x")
	fd, err := os.Open(many)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	for i := range 100000 {
		if err := unix.Linkat(int(fd.Fd()), fmt.Sprintf("f%d", i%2), int(fd.Fd()), fmt.Sprintf("l%06d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	blockedThenReverted(t, r, ws, good, "entries", "a.txt")
}

// A commit's message lists up to 50 changed paths, each quoted: a byte
// above 0x7f takes four characters, so ten paths of 3,750 such bytes made
// a --message of 150,000 characters, past what exec takes in one argument
// (128 KiB): every commit failed, and the agent's edits stayed unrecorded
// with nothing named. Each path in the message is shortened.
func TestRepoCommitMessageOfLongPaths(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "one\n")
	if _, _, err := r.InitialCommit(ctx, testSup); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("\xff", 250)
	for i := range 10 {
		dir := filepath.Join(ws, "src", fmt.Sprintf("d%d", i))
		for range 15 {
			dir = filepath.Join(dir, long)
		}
		writeFile(t, filepath.Join(dir, "f"), "x\n")
	}
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "two\n")
	c, paths, err := r.CommitPending(ctx, testAgent)
	if err != nil || c == "" || len(paths) != 11 {
		t.Fatalf("commit of ten long paths: %q, %d paths, %.300v", c, len(paths), err)
	}
	if a, _ := authorOf(t, r, c); a != "agent <agent@localhost>" {
		t.Errorf("author %q", a)
	}
}

// A file whose path from the workspace is longer than PATH_MAX, in a
// directory whose own path is not: git cannot stat it, and fails the whole
// add ("fatal: unable to stat"), the first commit of a lost history too,
// so the supervisor never started. It blocks commits by name instead, and
// a revert removes it.
func TestRepoPathPastPathMax(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "the agent's work\n")
	cur := unixOpen(t, filepath.Join(ws, "src"))
	long := strings.Repeat("d", 250)
	for range 16 {
		if err := unix.Mkdirat(cur, long, 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(cur, long, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(next) })
		cur = next
	}
	fd, err := unix.Openat(cur, strings.Repeat("f", 250), unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	head, adopted, err := r.InitialCommit(ctx, testSup)
	if err != nil || head == "" || !adopted {
		t.Fatalf("first commit next to a path past PATH_MAX: %q adopted=%v %.300v", head, adopted, err)
	}
	blockedThenReverted(t, r, ws, head, "fffff", "")
}
