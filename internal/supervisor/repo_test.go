package supervisor

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	ws := filepath.Join(t.TempDir(), "ws")
	r := NewRepo(git, ws, []string{"src"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	out, err := r.git.Line(context.Background(), r.cmd("log", []string{"-1", "--format=%an <%ae>%n%cn <%ce>"}, rev))
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
	first, err := r.InitialCommit(ctx, testSup)
	if err != nil || first == "" {
		t.Fatal(first, err)
	}
	if again, err := r.InitialCommit(ctx, testSup); err != nil || again != first {
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
	files, err := r.git.Line(ctx, r.cmd("ls-tree", []string{"-r", "--name-only"}, c))
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
	good, err := r.InitialCommit(ctx, testSup)
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
	parent, err := r.git.Line(ctx, r.cmd("rev-parse", nil, rev+"^"))
	if err != nil {
		t.Fatal(err)
	}
	if parent == bad || parent != from {
		t.Errorf("revert's parent %s, reverted from %s: the late edit was not committed first", parent, from)
	}
	if a, _ := authorOf(t, r, parent); a != "agent <agent@localhost>" {
		t.Errorf("late edit author %q", a)
	}
	// A revert when the tree already matches is still recorded.
	_, again, err := r.Revert(ctx, good, testAgent, testSup, "again")
	if err != nil || again == rev {
		t.Errorf("empty revert: %s %v", again, err)
	}
	// The supervisor's own reset leaves nothing to commit.
	if c, _, err := r.CommitPending(ctx, testAgent); c != "" || err != nil {
		t.Errorf("commit after revert: %q %v", c, err)
	}
}

// The agent can write .git/config. Filter drivers, includes and a foreign
// work tree there must not make the supervisor run a program or write
// elsewhere.
func TestRepoHostileGitConfig(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "one\n")
	good, err := r.InitialCommit(ctx, testSup)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	marker := filepath.Join(dir, "pwned")
	elsewhere := filepath.Join(dir, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o755); err != nil {
		t.Fatal(err)
	}
	included := filepath.Join(dir, "included")
	writeFile(t, included, "[filter \"inc\"]\n\tclean = touch "+marker+"-include\n")
	cfgPath := filepath.Join(ws, ".git", "config")
	old, _ := os.ReadFile(cfgPath)
	evil := string(old) + "[user]\n\tname = kept\n" +
		"[filter \"evil\"]\n\tclean = touch " + marker + "-clean\n\tsmudge = touch " + marker + "-smudge\n\tprocess = touch " + marker + "-process\n" +
		"[include]\n\tpath = " + included + "\n" +
		"[core]\n\tworktree = " + elsewhere + "\n\tfsmonitor = touch " + marker + "-fsmonitor\n\thooksPath = " + dir + "\n" +
		"[extensions]\n\tworktreeConfig = true\n" +
		"[diff \"x\"]\n\ttextconv = touch " + marker + "-textconv\n"
	writeFile(t, cfgPath, evil)
	writeFile(t, filepath.Join(ws, "src", ".gitattributes"), "* filter=evil diff=x\n*.txt filter=inc\n")
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "two\n")
	writeFile(t, filepath.Join(ws, ".git", "commondir"), elsewhere+"\n")

	c, paths, err := r.CommitPending(ctx, testAgent)
	if err != nil || c == "" {
		t.Fatalf("commit refused: %v", err)
	}
	if _, _, err := r.Revert(ctx, good, testAgent, testSup, "test"); err != nil {
		t.Fatal(err)
	}
	matches, _ := filepath.Glob(marker + "*")
	if len(matches) > 0 {
		t.Errorf("git ran the agent's programs: %v", matches)
	}
	if entries, _ := os.ReadDir(elsewhere); len(entries) > 0 {
		t.Errorf("git wrote outside the workspace: %v", entries)
	}
	if _, err := os.Stat(filepath.Join(ws, ".git", "commondir")); !os.IsNotExist(err) {
		t.Error("commondir kept")
	}
	now, _ := os.ReadFile(cfgPath)
	for _, gone := range []string{"filter", "include", "worktree", "fsmonitor", "hooksPath", "worktreeConfig", "textconv"} {
		if strings.Contains(strings.ToLower(string(now)), strings.ToLower(gone)) {
			t.Errorf("%s kept in .git/config:\n%s", gone, now)
		}
	}
	if !strings.Contains(string(now), `name = "kept"`) {
		t.Errorf("inert user.name dropped:\n%s", now)
	}
	if len(paths) != 2 {
		t.Errorf("paths %v", paths)
	}
}

func TestConfigAllowed(t *testing.T) {
	for key, want := range map[string]bool{
		"core.repositoryformatversion": true, "core.bare": true, "core.filemode": true,
		"user.name": true, "remote.origin.url": true, "color.diff.meta": true,
		"core.worktree": false, "core.fsmonitor": false, "core.hookspath": false,
		"core.sshcommand": false, "core.editor": false, "core.pager": false,
		"filter.lfs.clean": false, "include.path": false, "includeif.gitdir:/x.path": false,
		"diff.x.textconv": false, "merge.x.driver": false, "credential.helper": false,
		"extensions.worktreeconfig": false, "gpg.program": false, "uploadpack.packobjectshook": false,
	} {
		value := "false"
		if key == "core.repositoryformatversion" {
			value = "0"
		}
		if got := configAllowed(key, value); got != want {
			t.Errorf("configAllowed(%q) = %v, want %v", key, got, want)
		}
	}
	if configAllowed("core.bare", "true") {
		t.Error("core.bare=true allowed")
	}
}
