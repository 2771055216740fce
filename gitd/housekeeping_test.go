package gitd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/gitcmd"
)

// The split is git's: the packs that do not form a progression of factor
// 2, and any heavier ones the rolled-up pack would then break it with.
func TestGeometricSplit(t *testing.T) {
	for _, c := range []struct {
		packs []uint32
		want  int
	}{
		{nil, 0},
		{[]uint32{5}, 0},
		{[]uint32{1, 2, 4, 8}, 0},
		{[]uint32{3, 3}, 2},
		{[]uint32{1, 1, 8}, 2},
		{[]uint32{1, 1, 3}, 3},
		{[]uint32{3, 3, 3, 3, 100}, 4},
		{[]uint32{1, 1, 1, 1, 1, 1, 1, 1}, 8},
	} {
		if got := geometricSplit(c.packs); got != c.want {
			t.Errorf("geometricSplit(%v) = %d, want %d", c.packs, got, c.want)
		}
	}
}

func TestDecide(t *testing.T) {
	many := []uint32{3, 3, 3, 3, 3, 3, 3}
	old, now := time.Unix(1000, 0), time.Unix(2000, 0)
	for _, c := range []struct {
		name         string
		pool         bool
		st           hkStats
		force, prune bool
		want         hkPlan
	}{
		{"few packs: nothing", false, hkStats{packs: []uint32{3, 3}}, false, false, hkPlan{}},
		{"few packs, forced: geometric", false, hkStats{packs: []uint32{3, 3}}, true, false, hkPlan{repack: HKRepackGeometric}},
		{"progression: nothing", false, hkStats{packs: []uint32{1, 2, 4, 8, 16, 32, 64}}, false, false, hkPlan{}},
		{"many packs: geometric", false, hkStats{packs: many}, false, false, hkPlan{repack: HKRepackGeometric}},
		{"many packs, closed task: prune", false, hkStats{packs: many}, false, true, hkPlan{repack: HKRepackGeometric, prune: true}},
		{"loose objects: geometric", false, hkStats{loose: 2048}, false, false, hkPlan{repack: HKRepackGeometric}},
		{"pool, all roll up: full", true, hkStats{packs: many, bitmap: true, graph: now, newest: old}, false, false,
			hkPlan{repack: HKRepackFull, commitGraph: true}},
		{"pool, part rolls up: geometric", true, hkStats{packs: []uint32{3, 3, 3, 3, 3, 3, 1000}, bitmap: true, graph: now, newest: old}, false, false,
			hkPlan{repack: HKRepackGeometric, commitGraph: true}},
		{"pool, main moved: commit-graph", true, hkStats{packs: []uint32{9}, bitmap: true, graph: old, newest: now}, false, false,
			hkPlan{commitGraph: true}},
		{"pool, up to date: nothing", true, hkStats{packs: []uint32{9}, bitmap: true, graph: now, newest: old}, false, false, hkPlan{}},
		{"loose refs: pack-refs", false, hkStats{looseRefs: 40}, false, false, hkPlan{packRefs: true}},
		{"stale files: remove", false, hkStats{stale: []string{"x"}}, false, false, hkPlan{clean: []string{"x"}}},
	} {
		got := decide(c.pool, c.st, c.force, c.prune)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: decide = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// packCount counts the packs of a repository.
func packCount(t *testing.T, dir string) int {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "objects", "pack", "*.pack"))
	return len(m)
}

// pushChain pushes n one-commit fast-forwards to task and returns the last
// commit.
func (e *env) pushChain(task string, n int) string {
	e.t.Helper()
	var c string
	for i := range n {
		c = e.commitFile(task+".txt", fmt.Sprintf("%s %d\n", task, i))
		if _, err := e.push(task, e.bundle("HEAD", "^main")); err != nil {
			e.t.Fatal(err)
		}
	}
	return c
}

// Pushes add a pack each; a run repacks them, fsck stays clean, the ref
// stays, and a second run finds nothing to do.
func TestHousekeepingRepacksPushes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	last := e.pushChain("t1", 8)
	task := e.taskRepo("t1")
	if n := packCount(t, task); n != 8 {
		t.Fatalf("%d packs after 8 pushes", n)
	}
	r := e.svc.mustTask(t, "t1")
	run := e.svc.hk.housekeep(ctx, r, false)
	if run.Err != nil || run.Outcome != HKOptimized || !slices.Contains(run.Actions, HKRepackGeometric) {
		t.Fatalf("run: %+v", run)
	}
	if run.PacksBefore != 8 || run.PacksAfter != 1 || packCount(t, task) != 1 {
		t.Fatalf("packs %d -> %d (%d on disk)", run.PacksBefore, run.PacksAfter, packCount(t, task))
	}
	if run.Duration <= 0 {
		t.Fatalf("a repack of 8 packs reported a duration of %v", run.Duration)
	}
	if e.ref("refs/work/t1") != last {
		t.Fatal("the ref moved")
	}
	e.fsck()
	if run := e.svc.hk.housekeep(ctx, r, false); run.Outcome != HKClean || run.Err != nil {
		t.Fatalf("second run: %+v", run)
	}
	// The pool: a forced run leaves one pack with a bitmap and a
	// commit-graph.
	runs, err := e.svc.OptimizeProject(ctx, testScope())
	if err != nil {
		t.Fatal(err)
	}
	if runs[0].Repository != "pool" || runs[0].Err != nil || !slices.Contains(runs[0].Actions, HKCommitGraph) {
		t.Fatalf("pool run: %+v", runs[0])
	}
	if m, _ := filepath.Glob(filepath.Join(e.repo, "objects", "pack", "*.bitmap")); len(m) != 1 {
		t.Fatalf("pool bitmaps: %v", m)
	}
	if _, err := os.Stat(filepath.Join(e.repo, "objects", "info", "commit-graphs", "commit-graph-chain")); err != nil {
		t.Fatal(err)
	}
	e.fsck()
}

// A quarantine or temporary file past the grace is removed; a fresh one
// (a push in flight) is left alone.
func TestHousekeepingStaleFiles(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.pushChain("t1", 1)
	r := e.svc.mustTask(t, "t1")
	old := time.Now().Add(-hkStaleGrace - time.Hour)
	mk := func(dir string, age time.Time) string {
		q, err := bundle.NewQuarantineFor(dir, dir, dir)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(q.Dir, "pack", "tmp_pack_x")
		os.WriteFile(f, []byte("x"), 0o644)
		for _, p := range []string{f, filepath.Join(q.Dir, "pack"), q.Dir} {
			os.Chtimes(p, age, age)
		}
		return q.Dir
	}
	stale, fresh := mk(r.objects(), old), mk(r.objects(), time.Now())
	tmp := filepath.Join(r.objects(), "pack", "tmp_idx_y")
	os.WriteFile(tmp, nil, 0o644)
	os.Chtimes(tmp, old, old)
	run := e.svc.hk.housekeep(ctx, r, false)
	if run.Err != nil || !slices.Contains(run.Actions, HKRemoveStale) {
		t.Fatalf("run: %+v", run)
	}
	for _, p := range []string{stale, tmp} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s kept: %v", p, err)
		}
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("fresh quarantine removed: %v", err)
	}
	os.RemoveAll(fresh)
	e.fsck()
}

// intoPoolUnreachable fetches the work branch's objects into the pool
// and leaves them without a ref.
func (e *env) intoPoolUnreachable() {
	e.t.Helper()
	ctx := context.Background()
	if err := e.git.Run(ctx, gitcmd.Cmd{GitDir: e.repo, Sub: "fetch", Flags: []string{"--quiet", "--no-tags", "--no-write-fetch-head"},
		Config: []string{"fetch.unpackLimit=1"}, Args: []string{e.work, "refs/heads/work:refs/keep/x"}}); err != nil {
		e.t.Fatal(err)
	}
	if err := e.git.Run(ctx, gitcmd.Cmd{GitDir: e.repo, Sub: "update-ref", Flags: []string{"-d"}, Args: []string{"refs/keep/x"}}); err != nil {
		e.t.Fatal(err)
	}
}

// The pool never drops an object a task borrows: a task's push may build
// on any commit the pool holds, reachable from main or not (here one
// fetched into the pool and left without a ref, as a landing's
// copy of a task's work beyond its approved commit is). However often the
// pool is repacked, the task's history stays whole.
func TestHousekeepingPoolKeepsBorrowed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	x := e.commitFile("x.txt", "in the pool, unreachable\n")
	e.intoPoolUnreachable()
	y := e.commitFile("y.txt", "the task's\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^"+x)); err != nil {
		t.Fatal(err)
	}
	if e.ref("refs/work/t1") != y {
		t.Fatal("push not taken")
	}
	p, _ := e.svc.store.project(testScope())
	for i := range 3 {
		run := e.svc.hk.housekeep(ctx, p, true)
		if run.Err != nil {
			t.Fatalf("run %d: %+v", i, run)
		}
		e.fsck()
		if _, err := e.git.Line(ctx, gitcmd.Cmd{GitDir: e.repo, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{x}}, gitcmd.MaxLine); err != nil {
			t.Fatalf("run %d dropped the borrowed commit %s: %v", i, x, err)
		}
		// New packs for the next run to roll up.
		e.commitFile("z.txt", fmt.Sprint(i))
		e.intoPoolUnreachable()
	}
}

// A closed task's unreachable objects expire after the grace; an open
// task keeps them.
func TestHousekeepingPrunesOnlyClosed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.pushChain("t1", 2)
	r := e.svc.mustTask(t, "t1")
	run := e.svc.hk.housekeep(ctx, r, true)
	if run.Err != nil || slices.Contains(run.Actions, HKPrune) {
		t.Fatalf("open task: %+v", run)
	}
	e.auth.mu.Lock()
	e.auth.closed["t1"] = true
	e.auth.mu.Unlock()
	run = e.svc.hk.housekeep(ctx, r, true)
	if run.Err != nil || !slices.Contains(run.Actions, HKPrune) {
		t.Fatalf("closed task: %+v", run)
	}
	e.fsck()
}

// Pushes to 16 tasks at once while housekeeping runs in a loop on every
// repository: every push is taken, every ref is its task's last commit, and
// fsck is clean after.
func TestHousekeepingRacesPushes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const tasks, pushes = 16, 6
	// Each task's commits, made up front in the one work repository.
	chains := make([][][]byte, tasks)
	lasts := make([]string, tasks)
	for i := range tasks {
		name := fmt.Sprintf("t%d", i)
		e.run(e.work, "checkout", nil, "--quiet", "-B", "--", name, "main")
		prev := "main"
		for j := range pushes {
			lasts[i] = e.commitFile(name+".txt", fmt.Sprint(j))
			b := e.bundle("HEAD", "^"+prev)
			if j == 0 {
				b = e.bundle("HEAD", "^main")
			}
			chains[i] = append(chains[i], b)
			prev = lasts[i]
		}
	}
	stop := make(chan struct{})
	var hk sync.WaitGroup
	hk.Add(1)
	runs := 0
	go func() {
		defer hk.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			rs, err := e.svc.OptimizeProject(ctx, testScope())
			if err != nil {
				t.Error(err)
				return
			}
			for _, r := range rs {
				if r.Err != nil {
					t.Errorf("housekeeping %s: %v", r.Repository, r.Err)
				}
			}
			runs++
		}
	}()
	var wg sync.WaitGroup
	for i := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, b := range chains[i] {
				if _, err := e.push(fmt.Sprintf("t%d", i), b); err != nil {
					t.Errorf("push t%d: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	hk.Wait()
	for i := range tasks {
		if got := e.ref(fmt.Sprintf("refs/work/t%d", i)); got != lasts[i] {
			t.Errorf("t%d at %s, want %s", i, got, lasts[i])
		}
	}
	if got := len(e.auth.recorded()); got != tasks*pushes {
		t.Errorf("%d pushes recorded, want %d", got, tasks*pushes)
	}
	e.fsck()
	t.Logf("%d housekeeping rounds raced the pushes", runs)
}

// A view opened before a repack replaced its packs still reads every
// object after it (it reopens its handles once); without that, go-git
// would look for the objects in packs that are gone.
func TestViewAfterRepack(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first := e.pushChain("t1", 1)
	last := e.pushChain("t1", 3)
	r := e.svc.mustTask(t, "t1")
	v := r.open()
	// The view lists the packs (go-git does so on its first read).
	if err := v.HasEncodedObject(plumbing.NewHash(first)); err != nil {
		t.Fatal(err)
	}
	if run := e.svc.hk.housekeep(ctx, r, true); run.Err != nil || run.PacksAfter != 1 {
		t.Fatalf("run: %+v", run)
	}
	for _, id := range []string{last, e.main} {
		h := plumbing.NewHash(id)
		if err := v.HasEncodedObject(h); err != nil {
			t.Fatalf("HasEncodedObject(%s) after the repack: %v", id, err)
		}
		if _, err := v.EncodedObject(plumbing.AnyObject, h); err != nil {
			t.Fatalf("EncodedObject(%s) after the repack: %v", id, err)
		}
	}
}

// Lock files under refs/ are ref moves in flight, not loose refs: they
// call for no pack-refs.
func TestHousekeepingLocksAreNotRefs(t *testing.T) {
	e := newEnv(t)
	r, err := e.svc.store.project(testScope())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(r.Path, "refs", "work")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2*hkLooseRefs; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("t%d.lock", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := readStats(r, time.Now(), false)
	if err != nil {
		t.Fatal(err)
	}
	if st.looseRefs >= hkLooseRefs {
		t.Fatalf("%d loose refs counted among %d lock files", st.looseRefs, 2*hkLooseRefs)
	}
}
