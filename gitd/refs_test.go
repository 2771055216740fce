package gitd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitid"
)

// refEnv is a pool with n commits on top of main, made in the pool itself.
func refEnv(t *testing.T, n int) (*env, repo, []gitid.ObjectID) {
	t.Helper()
	e := newEnv(t)
	r, err := e.svc.store.project(testScope())
	if err != nil {
		t.Fatal(err)
	}
	tree := e.run(e.repo, "rev-parse", nil, "--", e.main+"^{tree}")
	var cs []gitid.ObjectID
	for i := 0; i < n; i++ {
		cs = append(cs, gitid.ObjectID(e.run(e.repo, "commit-tree", nil, "-p"+e.main, fmt.Sprintf("-mc%d", i), "--", tree)))
	}
	return e, r, cs
}

// Moves racing on one ref with the same old value: exactly one wins, the
// others are refused as moves from a value the ref no longer has, and the
// repository is left fsck-clean with no lock file.
func TestUpdateRefConcurrentOldValue(t *testing.T) {
	e, r, cs := refEnv(t, 16)
	ctx := context.Background()
	const ref = "refs/heads/race"
	if err := r.UpdateRef(ctx, ref, gitid.ObjectID(e.main), ""); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.UpdateRef(ctx, ref, cs[i], gitid.ObjectID(e.main))
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		switch {
		case err == nil && won >= 0:
			t.Fatalf("two moves from %s won: %d and %d", e.main, won, i)
		case err == nil:
			won = i
		case !errors.Is(err, errRefMoved):
			t.Fatalf("move %d refused for another reason: %v", i, err)
		}
	}
	if won < 0 {
		t.Fatal("no move won")
	}
	if got := e.ref(ref); got != string(cs[won]) {
		t.Fatalf("%s = %s, want the winner's %s", ref, got, cs[won])
	}
	// A new ref must not exist yet.
	if err := r.UpdateRef(ctx, ref, cs[0], ""); !errors.Is(err, errRefMoved) {
		t.Fatalf("creating an existing ref: %v", err)
	}
	noLocks(t, e.repo)
	e.fsck()
}

// A ref lock another process holds is waited for; one left behind by a
// killed process refuses the move (never overwritten nor removed here:
// Reconcile removes it at start), and the ref stays where it was.
func TestUpdateRefLockLeftBehind(t *testing.T) {
	e, r, cs := refEnv(t, 2)
	ctx := context.Background()
	lock := filepath.Join(e.repo, "refs", "heads", "main.lock")
	if err := os.WriteFile(lock, []byte(cs[1]+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := r.UpdateRef(ctx, MainRef, cs[0], gitid.ObjectID(e.main))
	if err == nil || !strings.Contains(err.Error(), "main.lock exists") {
		t.Fatalf("move under a stale lock: %v", err)
	}
	if time.Since(start) < refLockWait {
		t.Fatalf("gave up after %v, before refLockWait", time.Since(start))
	}
	if got := e.ref(MainRef); got != e.main {
		t.Fatalf("main moved to %s under a lock it did not hold", got)
	}
	if _, err := os.Stat(lock); err != nil {
		t.Fatalf("another's lock removed: %v", err)
	}
	// A holder that lets go within the wait (before or after the move's
	// first try): the move goes through.
	released := make(chan struct{})
	go func() {
		defer close(released)
		os.Remove(lock)
	}()
	if err := r.UpdateRef(ctx, MainRef, cs[0], gitid.ObjectID(e.main)); err != nil {
		t.Fatal(err)
	}
	<-released
	if got := e.ref(MainRef); got != string(cs[0]) {
		t.Fatalf("main = %s, want %s", got, cs[0])
	}
	// What a SIGKILL leaves is removed at the next start.
	os.WriteFile(lock, []byte(cs[1]+"\n"), 0o644)
	if err := e.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateRef(ctx, MainRef, cs[1], cs[0]); err != nil {
		t.Fatal(err)
	}
	noLocks(t, e.repo)
	e.fsck()
}

// A packed ref is read from packed-refs for its old value and shadowed by
// the loose one written; a ref with a reflog is moved by git, which keeps
// the reflog.
func TestUpdateRefPackedAndReflog(t *testing.T) {
	e, r, cs := refEnv(t, 3)
	ctx := context.Background()
	packRefs(t, e.repo, MainRef)
	if err := r.UpdateRef(ctx, MainRef, cs[0], cs[1]); !errors.Is(err, errRefMoved) {
		t.Fatalf("move of a packed ref from a wrong old value: %v", err)
	}
	if err := r.UpdateRef(ctx, MainRef, cs[0], gitid.ObjectID(e.main)); err != nil {
		t.Fatal(err)
	}
	if got := e.ref(MainRef); got != string(cs[0]) {
		t.Fatalf("main = %s, want %s", got, cs[0])
	}
	packRefs(t, e.repo, MainRef)
	if err := r.UpdateRef(ctx, MainRef, cs[1], cs[0]); err != nil {
		t.Fatal(err)
	}
	// A reflog: git moves the ref and appends to it.
	logs := filepath.Join(e.repo, "logs", "refs", "heads", "main")
	os.MkdirAll(filepath.Dir(logs), 0o755)
	os.WriteFile(logs, nil, 0o644)
	if err := r.UpdateRef(ctx, MainRef, cs[2], cs[1]); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(logs); !strings.Contains(string(b), string(cs[1])+" "+string(cs[2])) {
		t.Fatalf("reflog not kept: %q", b)
	}
	if err := r.UpdateRef(ctx, MainRef, cs[0], cs[1]); err == nil {
		t.Fatal("git's move from a wrong old value went through")
	}
	if got := e.ref(MainRef); got != string(cs[2]) {
		t.Fatalf("main = %s, want %s", got, cs[2])
	}
	noLocks(t, e.repo)
	e.fsck()
}

// packRefs does what `git pack-refs --all --prune` does to the loose ref
// (gitcmd runs no pack-refs): its value moves to packed-refs.
func packRefs(t *testing.T, dir string, ref string) {
	t.Helper()
	loose := filepath.Join(dir, filepath.FromSlash(ref))
	v, err := os.ReadFile(loose)
	if err != nil {
		t.Fatal(err)
	}
	body := "# pack-refs with: peeled fully-peeled sorted \n" + strings.TrimSpace(string(v)) + " " + ref + "\n"
	if err := os.WriteFile(filepath.Join(dir, "packed-refs"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(loose); err != nil {
		t.Fatal(err)
	}
}

// noLocks fails if a *.lock file is left in the repository.
func noLocks(t *testing.T, dir string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".lock") {
			t.Errorf("lock file left: %s", p)
		}
		return nil
	})
}

// Pushes to two tasks of one project hold their locks at once; a second
// push to one task waits for the first; the project's whole lock (land,
// sync, repair...) waits for every push and holds off new ones.
func TestLockTaskSharesTheProject(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	t1, err := e.svc.store.task(testTask("t1"))
	if err != nil {
		t.Fatal(err)
	}
	t2, _ := e.svc.store.task(testTask("t2"))
	un1, err := t1.state().lockTask(ctx, t1.Task)
	if err != nil {
		t.Fatal(err)
	}
	// A second task's lock is had while the first is held (a deadlock
	// here would be the project serializing pushes).
	un2, err := t2.state().lockTask(ctx, t2.Task)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []string
	note := func(s string) { mu.Lock(); got = append(got, s); mu.Unlock() }
	whole := make(chan struct{})
	go func() {
		defer close(whole)
		un, err := t1.state().lock(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		note("project")
		un()
	}()
	again := make(chan struct{})
	go func() {
		defer close(again)
		un, err := t1.state().lockTask(ctx, t1.Task)
		if err != nil {
			t.Error(err)
			return
		}
		note("t1 again")
		un()
	}()
	mu.Lock()
	early := append([]string(nil), got...)
	mu.Unlock()
	note("released")
	un1()
	un2()
	<-whole
	<-again
	if len(early) > 0 {
		t.Fatalf("%v held while both task locks were", early)
	}
	if got[0] != "released" {
		t.Fatalf("order %v: a lock was had before the task locks were released", got)
	}
}

// A prepared move holds <ref>.lock until it is committed or aborted: a
// move racing it from the same old value waits, then is refused; an
// aborted one leaves the ref and no lock; one a crash cut between prepare
// and commit leaves a lock that Reconcile removes.
func TestPrepareRef(t *testing.T) {
	e, r, cs := refEnv(t, 3)
	ctx := context.Background()
	mv, err := r.PrepareRef(ctx, MainRef, cs[0], gitid.ObjectID(e.main))
	if err != nil {
		t.Fatal(err)
	}
	raced := make(chan error, 1)
	go func() { raced <- r.UpdateRef(ctx, MainRef, cs[1], gitid.ObjectID(e.main)) }()
	if err := mv.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-raced; !errors.Is(err, errRefMoved) && (err == nil || !strings.Contains(err.Error(), "lock exists")) {
		t.Fatalf("a move racing a prepared one: %v", err)
	}
	if got := e.ref(MainRef); got != string(cs[0]) {
		t.Fatalf("main = %s, want %s", got, cs[0])
	}
	mv, err = r.PrepareRef(ctx, MainRef, cs[1], cs[0])
	if err != nil {
		t.Fatal(err)
	}
	mv.Abort()
	if err := mv.Commit(ctx); err == nil {
		t.Fatal("an aborted move was committed")
	}
	if got := e.ref(MainRef); got != string(cs[0]) {
		t.Fatalf("main moved by an aborted move: %s", got)
	}
	noLocks(t, e.repo)
	if _, err := r.PrepareRef(ctx, MainRef, cs[2], cs[0]); err != nil { // then "killed"
		t.Fatal(err)
	}
	if err := e.svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	noLocks(t, e.repo)
	if err := r.UpdateRef(ctx, MainRef, cs[2], cs[0]); err != nil {
		t.Fatal(err)
	}
	e.fsck()
}

// Pushes to different tasks check the project quota side by side: with
// room for one pack of the size they bring, of 8 pushes at once exactly one
// is accepted and the others are refused PROJECT_QUOTA, never two in room
// for one; the reservation is gone afterwards.
func TestProjectQuotaSideBySide(t *testing.T) {
	e := newEnv(t)
	const n = 8
	bundles := make([][]byte, n)
	for i := range bundles {
		e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "main")
		e.commitFile("task.txt", noise(30<<10))
		bundles[i] = e.bundle("HEAD", "^main")
	}
	base, err := dirBytes(filepath.Dir(e.repo))
	if err != nil {
		t.Fatal(err)
	}
	// Each pack is a little over 30 KiB of noise: room for one and a half.
	e.svc.o.MaxProjectBytes = base + 48<<10
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
	ok := 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case errdefs.ReasonOf(err) != errdefs.ProjectQuota:
			t.Fatalf("push %d: %v", i, err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d pushes accepted in room for one", ok)
	}
	if n := e.reserved(t); n != 0 {
		t.Fatalf("reservations left: %d bytes", n)
	}
	assertNoQuarantine(t, e)
	e.fsck()
}
