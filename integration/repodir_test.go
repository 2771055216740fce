package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repoState is what a repository holds that a client must not touch: its
// refs and its objects.
func repoState(t *testing.T, dir string) string {
	t.Helper()
	return testGit(t, dir, "for-each-ref") + "\n" + testGit(t, dir, "count-objects", "-v")
}

// fetch-main --repo P/sub, where P is another repository, is refused naming
// P, and P is left as it was; an empty P/empty becomes a repository of its
// own without touching P.
func TestFetchMainWritesOnlyWhereTold(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	tok := h.Grant(t, "acme", "web", "t1", "coder", "git.push.working")
	p := filepath.Join(filepath.Dir(h.Home), "P")
	os.MkdirAll(filepath.Join(p, "sub"), 0o755)
	testGit(t, p, "init", "-q", "-b", "main")
	os.WriteFile(filepath.Join(p, "sub", "f.txt"), []byte("mine\n"), 0o644)
	testGit(t, p, "add", ".")
	testGit(t, p, "commit", "-q", "-m", "P's own")
	before := repoState(t, p)

	_, errs, code := h.Run(t, nil, "--token-file", tok, "fetch-main", "--repo", filepath.Join(p, "sub"))
	if code == 0 {
		t.Fatal("fetch-main into a subdirectory of another repository succeeded")
	}
	if !strings.Contains(errs, "REPO_NOT_TOP_LEVEL") && !strings.Contains(errs, "not the top of a repository") || !strings.Contains(errs, p) {
		t.Fatalf("refusal does not name the repository git would have used (%s): %s", p, errs)
	}
	if after := repoState(t, p); after != before {
		t.Fatalf("P changed:\n%s\n->\n%s", before, after)
	}

	empty := filepath.Join(p, "empty")
	os.Mkdir(empty, 0o755)
	main := runAs1(t, h, tok, "fetch-main", "--repo", empty)
	if got := testGit(t, empty, "rev-parse", "refs/heads/main"); got != main {
		t.Fatalf("the empty directory's main is %s, want %s", got, main)
	}
	if top := testGit(t, empty, "rev-parse", "--show-toplevel"); top != empty {
		t.Fatalf("fetch-main into an empty directory made no repository of its own (top %s)", top)
	}
	if after := repoState(t, p); after != before {
		t.Fatalf("P changed by a fetch into P/empty:\n%s\n->\n%s", before, after)
	}
}

// A worker's main ahead of the bus host's is left as it is, silently; one
// that has diverged from it is left as it is, with a message saying how to
// rebase; refs/remotes/bushost/main always
// follows the bus host.
func TestFetchMainLeavesDivergedMain(t *testing.T) {
	h := startHost(t)
	root := h.AddProject(t, "acme", "web")
	tok := h.Grant(t, "acme", "web", "t1", "coder", "git.push.working")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	runAs1(t, h, tok, "fetch-main", "--repo", work)
	os.WriteFile(filepath.Join(work, "mine.txt"), []byte("local\n"), 0o644)
	testGit(t, work, "add", "mine.txt")
	testGit(t, work, "commit", "-q", "-m", "local work on main")
	local := testGit(t, work, "rev-parse", "HEAD")

	// Ahead of the bus host's main, with main unchanged there: nothing to
	// do, and nothing to say.
	out, errs := runAs(t, h, tok, 0, "fetch-main", "--repo", work)
	if got := testGit(t, work, "rev-parse", "refs/heads/main"); got != local || errs != "" {
		t.Fatalf("a main ahead of the bus host's: main %s (want %s), stderr %q", got, local, errs)
	}

	os.WriteFile(filepath.Join(root, "host.txt"), []byte("host\n"), 0o644)
	testGit(t, root, "add", "host.txt")
	testGit(t, root, "commit", "-q", "-m", "host moves main")
	h.Must(t, "project", "sync", "--business", "acme", "--project", "web")
	hostMain := testGit(t, root, "rev-parse", "HEAD")

	out, errs = runAs(t, h, tok, 0, "fetch-main", "--repo", work)
	if strings.TrimSpace(out) != hostMain {
		t.Fatalf("fetch-main printed %q, want %s", out, hostMain)
	}
	if got := testGit(t, work, "rev-parse", "refs/heads/main"); got != local {
		t.Fatalf("a diverged main was moved: %s, want %s", got, local)
	}
	if got := testGit(t, work, "rev-parse", "refs/remotes/bushost/main"); got != hostMain {
		t.Fatalf("refs/remotes/bushost/main = %s, want %s", got, hostMain)
	}
	if !strings.Contains(errs, "diverged") || !strings.Contains(errs, "git rebase bushost/main") {
		t.Fatalf("no message saying how to rebase: %q", errs)
	}
	if st := testGit(t, work, "status", "--porcelain"); st != "" {
		t.Fatalf("work tree changed: %s", st)
	}
}

func runAs1(t *testing.T, h *Host, tok string, args ...string) string {
	t.Helper()
	out, _ := runAs(t, h, tok, 0, args...)
	return strings.TrimSpace(out)
}

// fetch-main names the main it has: fetched again unchanged, nothing is
// sent and the repository gains no pack; after main moves, only what it
// gained comes; a repository whose refs/remotes/bushost/main names a
// commit it lacks is told how to recover.
func TestFetchMainSendsWhatIsNew(t *testing.T) {
	h := startHost(t)
	root := h.AddProject(t, "acme", "web")
	tok := h.Grant(t, "acme", "web", "t1", "coder", "git.push.working")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	packs := func() int {
		m, _ := filepath.Glob(filepath.Join(work, ".git", "objects", "pack", "*.pack"))
		return len(m)
	}
	first := runAs1(t, h, tok, "fetch-main", "--repo", work)
	n := packs()
	if again := runAs1(t, h, tok, "fetch-main", "--repo", work); again != first || packs() != n {
		t.Fatalf("fetch-main again: %s and %d packs, want %s and %d", again, packs(), first, n)
	}
	os.WriteFile(filepath.Join(root, "more.txt"), []byte("more\n"), 0o644)
	testGit(t, root, "add", "more.txt")
	testGit(t, root, "commit", "-q", "-m", "more")
	h.Must(t, "project", "sync", "--business", "acme", "--project", "web")
	next := runAs1(t, h, tok, "fetch-main", "--repo", work)
	if next == first || packs() != n+1 {
		t.Fatalf("after main moved: %s and %d packs, want a new main and %d", next, packs(), n+1)
	}
	if got := testGit(t, work, "rev-list", "--count", first+".."+next); got != "1" {
		t.Fatalf("main gained %s commits, want 1", got)
	}
	testGit(t, work, "fsck", "--strict", "--no-dangling")

	// A ref naming a commit the repository lacks.
	other := filepath.Join(filepath.Dir(h.Home), "other")
	testGit(t, filepath.Dir(other), "init", "-q", "-b", "main", other)
	// git's update-ref would refuse it: the ref's file, as a crash or a
	// hand could leave it.
	refFile := filepath.Join(other, ".git", "refs", "remotes", "bushost", "main")
	os.MkdirAll(filepath.Dir(refFile), 0o755)
	if err := os.WriteFile(refFile, []byte(next+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code := h.Run(t, nil, "--token-file", tok, "fetch-main", "--repo", other)
	if code == 0 || !strings.Contains(errs, "remove that ref") {
		t.Fatalf("a base the repository lacks: exit %d: %s", code, errs)
	}
}

// A client repository that has gathered clientPackLimit packs (a fetch
// adds one each time) has its small packs rolled together by the next
// fetch, and stays whole.
func TestFetchTidiesClientPacks(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	tok := h.Grant(t, "acme", "web", "t1", "coder", "git.push.working")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	testGit(t, filepath.Dir(work), "init", "-q", "-b", "mine", work)
	for i := 0; i < 20; i++ {
		os.WriteFile(filepath.Join(work, "f.txt"), []byte(strings.Repeat("x", i)+"\n"), 0o644)
		testGit(t, work, "add", "f.txt")
		testGit(t, work, "commit", "-q", "-m", "c")
		testGit(t, work, "repack", "-q")
	}
	packs := func() int {
		m, _ := filepath.Glob(filepath.Join(work, ".git", "objects", "pack", "*.pack"))
		return len(m)
	}
	if n := packs(); n < 20 {
		t.Fatalf("set-up made %d packs, want 20", n)
	}
	runAs1(t, h, tok, "fetch-main", "--repo", work)
	if n := packs(); n >= 16 {
		t.Fatalf("%d packs after the fetch, want fewer than 16", n)
	}
	testGit(t, work, "fsck", "--strict", "--no-dangling")
	testGit(t, work, "rev-parse", "--verify", "mine")
	testGit(t, work, "rev-parse", "--verify", "refs/remotes/bushost/main")
}

// TestFetchPacksLooseCommits: a worker's own commits are loose objects,
// and fetch-main, which asks where the worker's main stands against the
// bus host's, would read each one: once there are about 256, the fetch
// packs them and writes the commit-graph, and the worker's history stays
// whole.
func TestFetchPacksLooseCommits(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	tok := h.Grant(t, "acme", "web", "t1", "coder", "git.push.working")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	runAs1(t, h, tok, "fetch-main", "--repo", work)
	// Many loose objects, fast: one commit of 400 new files.
	for i := 0; i < 400; i++ {
		os.WriteFile(filepath.Join(work, fmt.Sprintf("f%03d.txt", i)), []byte(fmt.Sprintf("file %d\n", i)), 0o644)
	}
	testGit(t, work, "add", ".")
	testGit(t, work, "commit", "-q", "-m", "many files")
	head := testGit(t, work, "rev-parse", "HEAD")
	loose := func() int {
		m, _ := filepath.Glob(filepath.Join(work, ".git", "objects", "[0-9a-f][0-9a-f]", "*"))
		return len(m)
	}
	if n := loose(); n < 400 {
		t.Fatalf("set-up made %d loose objects, want 400 or more", n)
	}
	_, errs := runAs(t, h, tok, 0, "fetch-main", "--repo", work)
	if n := loose(); n != 0 {
		t.Fatalf("%d loose objects after the fetch, want none", n)
	}
	if _, err := os.Stat(filepath.Join(work, ".git", "objects", "info", "commit-graphs", "commit-graph-chain")); err != nil {
		t.Fatalf("no commit-graph after the fetch: %v", err)
	}
	if errs != "" {
		t.Fatalf("fetch-main of a main ahead said %q", errs)
	}
	testGit(t, work, "fsck", "--strict", "--no-dangling")
	testGit(t, work, "commit-graph", "verify")
	if got := testGit(t, work, "rev-parse", "refs/heads/main"); got != head {
		t.Fatalf("main %s, want %s", got, head)
	}
}
