package gitd

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/treesnap"
)

func TestAddProjectPlainDirectory(t *testing.T) {
	e := newEnv(t)
	plain := t.TempDir()
	os.MkdirAll(filepath.Join(plain, "src"), 0o755)
	os.WriteFile(filepath.Join(plain, "src", "main.go"), []byte("package main\n"), 0o644)
	os.WriteFile(filepath.Join(plain, "README"), []byte("plain\n"), 0o644)

	// Concurrent first calls: one creates, all agree on main.
	var wg sync.WaitGroup
	commits := make([]string, 8)
	created := make([]bool, 8)
	errs := make([]error, 8)
	for i := range commits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			commits[i], created[i], errs[i] = e.svc.AddProject(context.Background(), mustProject("acme", "plain"), plain)
		}()
	}
	wg.Wait()
	n := 0
	for i := range commits {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if commits[i] != commits[0] {
			t.Fatalf("AddProject disagrees: %s vs %s", commits[i], commits[0])
		}
		if created[i] {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d calls created the project", n)
	}
	repo := filepath.Join(e.svc.o.ReposDir, "acme", "plain", poolName)
	files, err := e.git.Line(context.Background(), gitcmd.Cmd{GitDir: repo, Sub: "ls-tree", Flags: []string{"-r", "--name-only"}, Args: []string{commits[0]}}, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if files != "README\nsrc/main.go" {
		t.Fatalf("seeded files = %q", files)
	}
	if _, err := os.Stat(filepath.Join(plain, ".git")); err == nil {
		t.Fatal("seeding left a .git in the root")
	}
	assertNoSeedingLeftovers(t, e)

	// Sync: unchanged root is a no-op; a change is one commit on top.
	c, prev, err := e.svc.SyncProject(context.Background(), mustProject("acme", "plain"))
	if err != nil || c != commits[0] || prev != commits[0] {
		t.Fatalf("no-op sync = %s %s %v", c, prev, err)
	}
	os.WriteFile(filepath.Join(plain, "NEW"), []byte("new\n"), 0o644)
	c, prev, err = e.svc.SyncProject(context.Background(), mustProject("acme", "plain"))
	if err != nil || prev != commits[0] || c == prev {
		t.Fatalf("sync = %s %s %v", c, prev, err)
	}
	parent, _ := e.git.Line(context.Background(), gitcmd.Cmd{GitDir: repo, Sub: "rev-parse", Args: []string{c + "^"}}, gitcmd.MaxLine)
	if parent != prev {
		t.Fatalf("synced commit's parent = %s, want %s", parent, prev)
	}
	assertNoSeedingLeftovers(t, e)
}

func assertNoSeedingLeftovers(t *testing.T, e *env) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(e.svc.o.ReposDir, "acme"))
	for _, en := range ents {
		if strings.HasPrefix(en.Name(), seedPrefix) {
			t.Fatalf("seeding directory left behind: %s", en.Name())
		}
	}
}

func TestSyncProjectGitRoot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	os.WriteFile(filepath.Join(e.root, "more"), []byte("more\n"), 0o644)
	next := e.commitAll(e.root, "more")
	c, prev, err := e.svc.SyncProject(ctx, testScope())
	if err != nil || c != next || prev != e.main {
		t.Fatalf("sync = %s %s %v, want %s after %s", c, prev, err, next, e.main)
	}
	// Rewriting the root's history is refused, and main stays.
	e.run(e.root, "reset", nil, "--hard", "--quiet", "--", e.main)
	os.WriteFile(filepath.Join(e.root, "other"), []byte("other\n"), 0o644)
	e.commitAll(e.root, "rewrite")
	before := e.snapshot()
	_, _, err = e.svc.SyncProject(ctx, testScope())
	if errdefs.ReasonOf(err) != errdefs.NonFastForward {
		t.Fatalf("non-fast-forward sync: %v", err)
	}
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Fatalf("refused sync changed the store:\n%s", d)
	}
	if got := e.ref(MainRef); got != next {
		t.Fatalf("main = %s, want %s", got, next)
	}
	e.fsck()
}

func TestReconcile(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	c1 := e.commitFile("a.txt", "1\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	c2 := e.commitFile("a.txt", "2\n")
	b2 := e.bundle("HEAD", "^main")

	// A crash after the record and before the ref move: the pack is in the
	// repository and the log says c2, but refs/work/t1 is still c1. Made
	// here by doing the first half of a push by hand.
	q, err := bundle.NewQuarantine(filepath.Join(e.repo, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	br := bufioReader(b2)
	if _, err := bundle.ReadHeader(br); err != nil {
		t.Fatal(err)
	}
	if _, err := q.IndexPack(ctx, e.git, e.repo, br); err != nil {
		t.Fatal(err)
	}
	if err := q.Migrate(); err != nil {
		t.Fatal(err)
	}
	e.auth.lastExtra = map[string]string{"t1": c2}
	// A stale ref lock and a stale quarantine, as a SIGKILL leaves them.
	os.WriteFile(filepath.Join(e.repo, "refs", "work", "t1.lock"), []byte(c2+"\n"), 0o644)
	stale, _ := bundle.NewQuarantine(filepath.Join(e.repo, "objects"))

	if got := e.ref("refs/work/t1"); got != c1 {
		t.Fatalf("before: %s", got)
	}
	// A restart: New cleans quarantines, Reconcile the refs.
	svc, err := New(e.svc.o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale.Dir); !os.IsNotExist(err) {
		t.Fatalf("stale quarantine kept: %v", err)
	}
	if err := svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.ref("refs/work/t1"); got != c2 {
		t.Fatalf("after Reconcile refs/work/t1 = %s, want %s", got, c2)
	}
	if _, err := os.Stat(filepath.Join(e.repo, "refs", "work", "t1.lock")); !os.IsNotExist(err) {
		t.Fatal("stale ref lock kept")
	}
	// The next push goes through.
	e.svc = svc
	c3 := e.commitFile("a.txt", "3\n")
	e.auth.lastExtra = nil
	if res, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil || res.Previous != c2 || res.Commit != c3 {
		t.Fatalf("push after reconcile = %+v, %v", res, err)
	}
	q.Remove()
	e.fsck()
}

// TestConcurrentPushesOneTask: 16 pushes of one growing line of commits to
// one task, all at once. Every accepted push must fast-forward the one
// before it, the ref must end at the last accepted commit, and nothing may
// be lost or left behind.
func TestConcurrentPushesOneTask(t *testing.T) {
	e := newEnv(t)
	const n = 16
	bundles := make([][]byte, n)
	order := map[string]int{}
	for i := range bundles {
		c := e.commitFile("a.txt", strings.Repeat("x", i+1))
		order[c] = i
		bundles[i] = e.bundle("HEAD", "^main")
	}
	var wg sync.WaitGroup
	results := make([]PushResult, n)
	errs := make([]error, n)
	for i := range bundles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.push("t1", bundles[i])
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && errdefs.ReasonOf(err) != errdefs.NonFastForward {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	rec := e.auth.recorded()
	if len(rec) == 0 {
		t.Fatal("no push accepted")
	}
	prev := ""
	for _, p := range rec {
		if p.Previous != prev {
			t.Fatalf("recorded push %s has previous %s, want %s (lost update)", p.Commit, p.Previous, prev)
		}
		if prev != "" && order[p.Commit] <= order[prev] {
			t.Fatalf("push %s is not a fast-forward of %s", p.Commit, prev)
		}
		prev = p.Commit
	}
	if got := e.ref("refs/work/t1"); got != prev {
		t.Fatalf("refs/work/t1 = %s, last recorded %s", got, prev)
	}
	// The last commit must win: no push of it can be refused as non-ff.
	if errs[n-1] != nil {
		t.Fatalf("push of the newest commit refused: %v", errs[n-1])
	}
	assertNoQuarantine(t, e)
	e.fsck()
}

// TestConcurrentPushesManyTasks: 16 tasks of one repository pushed at once
// all land, each ref at its own commit.
func TestConcurrentPushesManyTasks(t *testing.T) {
	e := newEnv(t)
	const n = 16
	bundles := make([][]byte, n)
	commits := make([]string, n)
	for i := range bundles {
		e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "main")
		commits[i] = e.commitFile("task.txt", strings.Repeat("t", i+1))
		bundles[i] = e.bundle("HEAD", "^main")
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range bundles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.push(taskName(i), bundles[i])
		}()
	}
	wg.Wait()
	for i := range bundles {
		if errs[i] != nil {
			t.Fatalf("push %d: %v", i, errs[i])
		}
		if got := e.ref("refs/work/" + taskName(i)); got != commits[i] {
			t.Fatalf("task %d: ref %s, want %s", i, got, commits[i])
		}
	}
	var tasks []string
	for _, p := range e.auth.recorded() {
		tasks = append(tasks, p.Task)
	}
	sort.Strings(tasks)
	if len(tasks) != n {
		t.Fatalf("recorded %d pushes", len(tasks))
	}
	assertNoQuarantine(t, e)
	e.fsck()
}

func taskName(i int) string { return "t" + string(rune('a'+i)) }

// A sync whose objects moved in but whose main cannot move (here: a
// main.lock another writer holds) is undone: its objects leave the pool
// and main stays.
func TestSyncUndoneWhenMainCannotMove(t *testing.T) {
	e := newEnv(t)
	os.WriteFile(filepath.Join(e.root, "more"), []byte("more\n"), 0o644)
	e.commitAll(e.root, "more")
	lock := filepath.Join(e.repo, MainRef+".lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	before := e.snapshot()
	_, _, err := e.svc.SyncProject(context.Background(), testScope())
	if err == nil {
		t.Fatal("the sync moved main past a held main.lock")
	}
	t.Logf("refused: %v", err)
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Fatalf("a refused sync changed the store:\n%s", d)
	}
	if got := e.ref(MainRef); got != e.main {
		t.Fatalf("main = %s, want %s", got, e.main)
	}
}
