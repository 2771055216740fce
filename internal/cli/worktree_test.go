package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func wtGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@localhost", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@localhost"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// The in-process cleanliness proof says clean only when git status lists
// nothing, and reads HEAD and refs as git does.
func TestWorkRepoClean(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		t.Helper()
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wtGit(t, dir, "init", "-q", "-b", "main")
	write("a.txt", "a\n")
	write("sub/b.txt", "b\n")
	write(".gitignore", "*.log\nbuild/\n")
	wtGit(t, dir, "add", "-A")
	wtGit(t, dir, "commit", "-q", "-m", "one")
	head := wtGit(t, dir, "rev-parse", "HEAD")
	status := func() bool { return wtGit(t, dir, "status", "--porcelain") == "" }
	check := func(what string) {
		t.Helper()
		w := openWorkRepo(filepath.Join(dir, "sub"))
		if got := w.commit("HEAD"); got != head {
			t.Fatalf("%s: HEAD read as %q, git says %s", what, got, head)
		}
		if got, want := w.clean(head), status(); got && !want {
			t.Fatalf("%s: proven clean, but git status lists changes", what)
		} else if got != want {
			t.Logf("%s: not proven clean (git status clean: %v)", what, want)
		}
	}
	if w := openWorkRepo(dir); !w.clean(head) {
		t.Fatal("a freshly committed tree is not proven clean")
	}
	check("fresh")
	write("x.log", "ignored\n")
	write("build/out", "ignored\n")
	if w := openWorkRepo(dir); !w.clean(head) {
		t.Fatal("ignored files make the tree unclean")
	}
	write("new.txt", "untracked\n")
	check("untracked file")
	os.Remove(filepath.Join(dir, "new.txt"))
	write("newdir/f", "untracked\n")
	check("untracked directory")
	os.RemoveAll(filepath.Join(dir, "newdir"))
	write("sub/b.txt", "B\n")
	check("modified file")
	wtGit(t, dir, "add", "sub/b.txt")
	check("staged file")
	wtGit(t, dir, "commit", "-q", "-m", "two")
	head = wtGit(t, dir, "rev-parse", "HEAD")
	os.Remove(filepath.Join(dir, "a.txt"))
	check("deleted file")
	wtGit(t, dir, "checkout", "-q", "--", "a.txt")
	if w := openWorkRepo(dir); !w.clean(head) {
		t.Fatal("the tree put back is not proven clean")
	}
	// A tracked directory replaced by a symbolic link to a copy of it:
	// its files' paths still resolve, but git takes them as deleted.
	copyDir := filepath.Join(t.TempDir(), "sub")
	os.MkdirAll(copyDir, 0o755)
	b, _ := os.ReadFile(filepath.Join(dir, "sub", "b.txt"))
	os.WriteFile(filepath.Join(copyDir, "b.txt"), b, 0o644)
	os.Rename(filepath.Join(dir, "sub"), filepath.Join(dir, "sub.moved"))
	if err := os.Symlink(copyDir, filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	if w := openWorkRepo(dir); w.clean(head) {
		t.Fatal("a tracked directory turned symbolic link proven clean")
	}
	os.Remove(filepath.Join(dir, "sub"))
	os.Rename(filepath.Join(dir, "sub.moved"), filepath.Join(dir, "sub"))
	os.Remove(filepath.Join(dir, "a.txt"))
	// Refs as git reads them: packed, through a symbolic HEAD, from a
	// linked worktree, from a bare repository.
	wtGit(t, dir, "update-ref", "refs/remotes/bushost/main", head)
	wtGit(t, dir, "pack-refs", "--all", "--prune")
	if w := openWorkRepo(dir); w.commit("refs/remotes/bushost/main") != head || w.commit("HEAD") != head {
		t.Fatalf("packed refs read as %q, HEAD %q; want %s", w.commit("refs/remotes/bushost/main"), w.commit("HEAD"), head)
	}
	linked := filepath.Join(t.TempDir(), "linked")
	wtGit(t, dir, "worktree", "add", "-q", "-b", "side", linked, "HEAD~1")
	if w, want := openWorkRepo(linked), wtGit(t, linked, "rev-parse", "HEAD"); w.commit("HEAD") != want || w.commit("refs/remotes/bushost/main") != head {
		t.Fatalf("linked worktree: HEAD %q (want %s), main %q", w.commit("HEAD"), want, w.commit("refs/remotes/bushost/main"))
	}
	bare := filepath.Join(t.TempDir(), "bare.git")
	wtGit(t, dir, "clone", "-q", "--bare", dir, bare)
	if w := openWorkRepo(bare); w.commit("HEAD") != wtGit(t, bare, "rev-parse", "HEAD") || w.clean(head) {
		t.Fatalf("bare repository: HEAD %q", w.commit("HEAD"))
	}
	if w := openWorkRepo(filepath.Join(t.TempDir())); w.commit("HEAD") != "" || w.clean("") {
		t.Fatal("a directory without a repository read as one")
	}
}
