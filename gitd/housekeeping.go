package gitd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/metrics"
	"github.com/bushost/bushost/internal/names"
)

// Housekeeping (docs/git-service.md, "Housekeeping"). Every accepted push
// adds a pack (gc.auto=0: git never repacks on its own), so without it
// every object lookup scans one more index per push. After a push or a
// landing the repository is queued; a background worker reads a few cheap
// numbers (the packs and their object counts, an estimate of the loose
// objects, the loose refs, stale temporary files) and does only what they
// call for, as Gitaly's OptimizeRepository and `git maintenance` do:
//
//   - a geometric repack (`git repack --geometric=2 -d`) when the packs
//     no longer form a geometric progression; in the pool a full repack
//     with a bitmap when the geometry would roll every pack into one;
//   - `git pack-refs --all` when loose refs pile up (under the project's
//     lock, which a ref move holds: it is one);
//   - `git commit-graph write --reachable --split` in the pool;
//   - removal of quarantines and temporary files older than a grace period;
//   - unreachable objects pruned (cruft packs with an expiration) only in
//     the repository of a closed task, which takes no push any more.
//
// What may never be lost: the pool never drops an object. Task
// repositories borrow from it (their history starts on main, and a push's
// prerequisites and the links of its objects may name any object the pool
// holds, reachable from main or not), so the pool's repacks keep every
// object: a geometric repack packs every object of the packs it rolls up,
// and its full repack puts the unreachable ones in a cruft pack that never
// expires. A task's repository, whose ref only fast-forwards, is repacked
// with -l (its own objects only; what the pool also holds is read from the
// pool) and keeps its unreachable objects too while the task is open: a
// push's pack enters objects/pack before its ref moves, and a pack kept by
// an unclear commit is what `task repair` restores.

const (
	// hkStaleGrace is how old a quarantine or a temporary file must be
	// before housekeeping removes it: no push lives that long
	// (--idle-timeout cuts a silent one), and git's own temporary files of
	// a killed process are long dead by then.
	hkStaleGrace = 24 * time.Hour
	// hkPruneExpiration is how long an unreachable object of a closed
	// task's repository is kept before a repack drops it.
	hkPruneExpiration = "2.weeks.ago"
	// hkMinPacks is the pack count from which a repository is repacked
	// (geometrically) without being asked: below it, a lookup's cost is
	// flat enough and a repack would cost more than it saves.
	hkMinPacks = 6
	// hkLooseObjects is the estimated loose object count that calls for a
	// repack (bundle.LooseEstimate: the objects in objects/00 to 0f, times
	// 16).
	hkLooseObjects = 1024
	// hkLooseRefs is the loose ref count that calls for pack-refs.
	hkLooseRefs = 32
	// hkWorkers bounds the repositories housekept at once.
	hkWorkers = 1
)

// hkStaleGraceFor is hkStaleGrace, a variable only for tests.
var hkStaleGraceFor = hkStaleGrace

// HousekeepingRun is what one housekeeping run did on one repository.
type HousekeepingRun struct {
	Repository  string   // "pool" or "tasks/<task>"
	Outcome     string   // HKOptimized, HKClean or HKFailed
	Actions     []string // HKRepackGeometric, ... in order
	PacksBefore int
	PacksAfter  int
	Duration    time.Duration
	Err         error
}

// Outcomes and actions of a housekeeping run.
const (
	HKOptimized = "optimized"
	HKClean     = "clean"
	HKFailed    = "failed"

	HKRepackGeometric = "repack-geometric"
	HKRepackFull      = "repack-full"
	HKPrune           = "prune-unreachable"
	HKPackRefs        = "pack-refs"
	HKCommitGraph     = "commit-graph"
	HKRemoveStale     = "remove-stale"
)

// hkStats are the numbers housekeeping decides by; reading them costs a
// few directory reads and 1 KiB of each pack index (mapped, and kept in
// the daemon's cache of indexes, packindex.go).
type hkStats struct {
	packs     []uint32 // object counts of the non-cruft packs, ascending
	cruft     int      // cruft packs (.mtimes)
	loose     int      // estimated loose objects
	looseRefs int
	bitmap    bool
	graph     time.Time // the commit-graph's (chain's) mtime, zero if none
	newest    time.Time // the newest pack's or main's mtime
	stale     []string  // temporary files and directories past the grace
}

// hkPlan is what a run will do.
type hkPlan struct {
	repack      string // "", HKRepackGeometric or HKRepackFull
	prune       bool
	packRefs    bool
	commitGraph bool
	clean       []string
}

func (p hkPlan) empty() bool {
	return p.repack == "" && !p.prune && !p.packRefs && !p.commitGraph && len(p.clean) == 0
}

// readStats reads r's numbers; exact counts the loose objects one by one
// instead of estimating them.
func readStats(r repo, now time.Time, exact bool) (hkStats, error) {
	var st hkStats
	packDir := filepath.Join(r.objects(), "pack")
	ents, err := os.ReadDir(packDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return st, err
	}
	names := map[string]bool{}
	for _, e := range ents {
		names[e.Name()] = true
	}
	for _, e := range ents {
		base, ok := strings.CutSuffix(e.Name(), ".pack")
		if !ok || !strings.HasPrefix(base, "pack-") || !names[base+".idx"] {
			continue
		}
		if names[base+".mtimes"] {
			st.cruft++
			continue
		}
		if names[base+".bitmap"] {
			st.bitmap = true
		}
		ix, err := indexes.get(filepath.Join(packDir, base+".idx"))
		if err != nil {
			continue // being written or removed: the next run sees it
		}
		st.packs = append(st.packs, uint32(ix.Len()))
		if fi, err := e.Info(); err == nil && fi.ModTime().After(st.newest) {
			st.newest = fi.ModTime()
		}
	}
	sort.Slice(st.packs, func(i, j int) bool { return st.packs[i] < st.packs[j] })
	st.loose = bundle.LooseEstimate(r.objects())
	if exact {
		st.loose = 0
		for i := range 256 {
			l, _ := os.ReadDir(filepath.Join(r.objects(), fmt.Sprintf("%02x", i)))
			st.loose += len(l)
		}
	}
	filepath.WalkDir(filepath.Join(r.Path, "refs"), func(_ string, d fs.DirEntry, err error) error {
		// A lock file is a ref move in flight, not a loose ref.
		if err == nil && !d.IsDir() && !strings.HasSuffix(d.Name(), ".lock") {
			st.looseRefs++
		}
		return nil
	})
	if r.isPool() {
		for _, g := range []string{"info/commit-graphs/commit-graph-chain", "info/commit-graph"} {
			if fi, err := os.Stat(filepath.Join(r.objects(), g)); err == nil {
				st.graph = fi.ModTime()
				break
			}
		}
		if fi, err := os.Stat(filepath.Join(r.Path, MainRef)); err == nil && fi.ModTime().After(st.newest) {
			st.newest = fi.ModTime()
		}
	}
	st.stale = staleFiles(r, now)
	return st, nil
}

// staleFiles lists r's quarantines and git's temporary files whose newest
// entry is older than the grace: in the objects directory (bushost's and
// git's quarantines, tmp_obj_*) and in objects/pack (tmp_pack_*,
// tmp_idx_*, .tmp-*). A quarantine in use is written to, so it is never
// past the grace.
func staleFiles(r repo, now time.Time) []string {
	var out []string
	for _, dir := range []string{r.objects(), filepath.Join(r.objects(), "pack")} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			n := e.Name()
			if !(strings.HasPrefix(n, bundle.QuarantinePrefix) || strings.HasPrefix(n, "incoming-") ||
				strings.HasPrefix(n, "tmp_") || strings.HasPrefix(n, ".tmp-")) {
				continue
			}
			p := filepath.Join(dir, n)
			if now.Sub(newestIn(p)) > hkStaleGraceFor {
				out = append(out, p)
			}
		}
	}
	return out
}

// newestIn is the newest mtime of p and, for a directory, of anything in
// it.
func newestIn(p string) time.Time {
	var t time.Time
	filepath.WalkDir(p, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().After(t) {
			t = fi.ModTime()
		}
		return nil
	})
	return t
}

// geometricSplit is how many of packs (object counts, ascending) a
// geometric repack with factor 2 rolls into one: git's own computation
// (builtin/repack.c, split_pack_geometry).
func geometricSplit(packs []uint32) int {
	const factor = 2
	n := len(packs)
	if n == 0 {
		return 0
	}
	i := n - 1
	for ; i > 0; i-- {
		if uint64(packs[i]) < factor*uint64(packs[i-1]) {
			break
		}
	}
	split := i
	if split > 0 {
		split++
	}
	var total uint64
	for _, p := range packs[:split] {
		total += uint64(p)
	}
	for j := split; j < n; j++ {
		if uint64(packs[j]) < factor*total {
			split++
			total += uint64(packs[j])
		} else {
			break
		}
	}
	return split
}

// decide plans a run on a repository (pool or not) from its numbers. force
// (`bushost repo optimize`) repacks whatever more than one pack or any
// loose object calls for, where the automatic run waits for hkMinPacks.
// prune is whether its unreachable objects may expire (a closed task's).
func decide(pool bool, st hkStats, force, prune bool) hkPlan {
	var p hkPlan
	split := geometricSplit(st.packs)
	packs := len(st.packs)
	needPacks := packs >= hkMinPacks || (force && packs > 1)
	needLoose := st.loose >= hkLooseObjects || (force && st.loose > 0)
	switch {
	case needPacks && split >= 2 || needLoose:
		p.repack = HKRepackGeometric
		if pool && (split == packs || !st.bitmap) {
			p.repack = HKRepackFull
		}
	case force && pool && packs == 1 && !st.bitmap:
		p.repack = HKRepackFull
	}
	if prune && (force || p.repack != "") {
		p.prune = true
	}
	p.packRefs = st.looseRefs >= hkLooseRefs || (force && st.looseRefs > 1)
	if pool {
		p.commitGraph = p.repack != "" || st.graph.IsZero() || st.newest.After(st.graph)
	}
	p.clean = st.stale
	return p
}

// housekeeper queues repositories and runs their housekeeping, one job per
// repository at a time (project.hold) and hkWorkers at once.
type housekeeper struct {
	s    *Service
	auto bool

	mu      sync.Mutex
	queue   []repo
	queued  map[string]bool
	wake    chan struct{}
	running bool
	wg      sync.WaitGroup
}

// Notify queues r (after a push or a landing changed it) for an automatic
// run, unless housekeeping is off or r is queued already. It never blocks.
func (h *housekeeper) Notify(r repo) {
	if h == nil || !h.auto {
		return
	}
	h.mu.Lock()
	if !h.running || h.queued[r.Path] {
		h.mu.Unlock()
		return
	}
	h.queued[r.Path] = true
	h.queue = append(h.queue, r)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// StartHousekeeping starts the background workers that run the
// housekeeping Notify queues (when Options.Housekeeping is on); stop ends
// them, cancelling a run in progress, and waits.
func (s *Service) StartHousekeeping(ctx context.Context) (stop func()) {
	h := s.hk
	ctx, cancel := context.WithCancel(ctx)
	h.mu.Lock()
	h.running = true
	h.mu.Unlock()
	for range hkWorkers {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for {
				h.mu.Lock()
				var r repo
				ok := len(h.queue) > 0
				if ok {
					r, h.queue = h.queue[0], h.queue[1:]
					delete(h.queued, r.Path)
				}
				h.mu.Unlock()
				if !ok {
					select {
					case <-h.wake:
						continue
					case <-ctx.Done():
						return
					}
				}
				run := h.housekeep(ctx, r, false)
				if run.Err != nil && ctx.Err() == nil {
					s.log.Error("housekeeping failed", "repo", r.Path, "err", run.Err)
				}
			}
		}()
	}
	return func() {
		h.mu.Lock()
		h.running = false
		h.queue, h.queued = nil, map[string]bool{}
		h.mu.Unlock()
		cancel()
		h.wg.Wait()
	}
}

// OptimizeProject runs housekeeping now on business/project's pool and on
// every task repository (`bushost repo optimize`), waiting for a run in
// progress on each first. A failed repository does not stop the others;
// its run says why.
func (s *Service) OptimizeProject(ctx context.Context, scope names.Project) ([]HousekeepingRun, error) {
	p, err := s.store.existingProject(scope)
	if err != nil {
		return nil, err
	}
	ts, err := p.tasks()
	if err != nil {
		return nil, err
	}
	runs := []HousekeepingRun{s.hk.housekeep(ctx, p, true)}
	for _, t := range ts {
		if err := ctx.Err(); err != nil {
			return runs, err
		}
		runs = append(runs, s.hk.housekeep(ctx, t, true))
	}
	return runs, nil
}

// housekeep runs r's housekeeping: its numbers, the plan, the work. It
// holds r (no other run, no archive) throughout, and the project's lock
// only for pack-refs. The run is a named result so that its duration,
// taken when it returns, is in what the caller gets.
func (h *housekeeper) housekeep(ctx context.Context, r repo, force bool) (run HousekeepingRun) {
	s := h.s
	run = HousekeepingRun{Repository: "pool", Outcome: HKClean}
	kind := "pool"
	if !r.isPool() {
		run.Repository, kind = tasksDir+"/"+r.Task, "task"
	}
	start := time.Now()
	defer func() {
		run.Duration = time.Since(start)
		metrics.Housekeeping(kind, run.Outcome, run.Duration, run.PacksAfter)
	}()
	release, err := r.state().hold(ctx, r.Task)
	if err != nil {
		run.Outcome, run.Err = HKFailed, err
		return run
	}
	defer release()
	if !r.exists() {
		return run // archived meanwhile
	}
	st, err := readStats(r, time.Now(), force)
	if err != nil {
		run.Outcome, run.Err = HKFailed, err
		return run
	}
	run.PacksBefore = len(st.packs) + st.cruft
	run.PacksAfter = run.PacksBefore
	prune := false
	if !r.isPool() {
		// Only a closed task's repository loses unreachable objects: no push
		// can enter it any more (RecordPush refuses a closed task), so none
		// in flight needs one; an open one, or one the log marked for repair
		// (its kept pack may be what `task repair` restores), keeps them.
		open := s.o.Authority.TaskOpen(ctx, authz.Grant{Business: r.Business, Project: r.Project, Task: r.Task})
		if e, ok := errdefs.As(open); ok && (e.Reason == errdefs.TaskClosed || e.Reason == errdefs.TaskLanded) {
			_, why, err := s.o.Authority.LastPush(ctx, r.Business, r.Project, r.Task)
			prune = err == nil && why == ""
		}
	}
	plan := decide(r.isPool(), st, force, prune)
	if plan.empty() {
		return run
	}
	// The project's cached size (store.go) follows the run: a repack
	// changes the repository's bytes, and forgetting the figure would make
	// the next push read the whole project again.
	before, berr := dirBytes(r.objects())
	defer func() {
		if after, err := dirBytes(r.objects()); err == nil && berr == nil {
			r.state().grow(after - before)
		} else {
			r.state().forget()
		}
	}()
	if err := r.execute(ctx, plan, &run); err != nil {
		run.Outcome, run.Err = HKFailed, err
	} else if len(run.Actions) > 0 {
		run.Outcome = HKOptimized
	}
	if after, err := readStats(r, time.Now(), false); err == nil {
		run.PacksAfter = len(after.packs) + after.cruft
	}
	if run.Outcome == HKOptimized {
		s.log.Info("housekept a repository", "repo", r.Path, "actions", strings.Join(run.Actions, ","),
			"packs_before", run.PacksBefore, "packs_after", run.PacksAfter, "duration", time.Since(start))
	}
	return run
}

// hkRepackConfig leaves half the CPUs to the pushes and fetches a repack
// runs beside: git's delta search would take every one (pack.threads
// defaults to the CPU count), and the fetch that follows a push then
// waited on the repack that push queued.
func hkRepackConfig() []string {
	return []string{"pack.threads=" + strconv.Itoa(max(1, runtime.NumCPU()/2))}
}

func (r repo) execute(ctx context.Context, p hkPlan, run *HousekeepingRun) error {
	for _, path := range p.clean {
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("remove stale %s: %w", path, err)
		}
	}
	if len(p.clean) > 0 {
		run.Actions = append(run.Actions, HKRemoveStale)
	}
	repack := func(action string, flags ...string) error {
		// A repack runs under the lock of what moves packs into r: a
		// task's lock for its repository (a push holds it from before its
		// pack moves in until the push is recorded or undone), a share of
		// the project's for the pool (a landing holds all of it). A pack
		// that a refused push or landing is about to remove must not be
		// rolled into a new one meanwhile: the removal would miss, the
		// refused objects would stay, and the beyond-git walk trusts what a
		// repository holds ("entered before"), so a next push could name
		// a refused tree without carrying it
		// (TestAttackRepackKeepsRefusedPush).
		var unlock func()
		var err error
		if r.isPool() {
			unlock, err = r.state().lockShared(ctx)
		} else {
			unlock, err = r.state().lockTask(ctx, r.Task)
		}
		if err != nil {
			return err
		}
		defer unlock()
		if err := r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "repack", Flags: append(flags, "-q"), Config: hkRepackConfig()}); err != nil {
			return err
		}
		run.Actions = append(run.Actions, action)
		return nil
	}
	switch {
	case r.isPool() && p.repack == HKRepackFull:
		// Every object stays: the unreachable ones go to a cruft pack that
		// never expires (no --cruft-expiration).
		if err := repack(HKRepackFull, "-d", "--cruft", "--write-bitmap-index"); err != nil {
			return err
		}
	case r.isPool() && p.repack == HKRepackGeometric:
		if err := repack(HKRepackGeometric, "--geometric=2", "-d", "--write-midx"); err != nil {
			return err
		}
	case p.prune:
		// A closed task's repository: its own reachable objects in one
		// pack, the unreachable ones in a cruft pack until they expire.
		if err := repack(HKRepackFull, "-d", "-l", "--cruft", "--cruft-expiration="+hkPruneExpiration); err != nil {
			return err
		}
		run.Actions = append(run.Actions, HKPrune)
	case p.repack != "":
		// A task's repository: its own objects only (-l; what the pool
		// holds too is read from there), no bitmap (none is possible with
		// an alternate), nothing dropped.
		if err := repack(HKRepackGeometric, "--geometric=2", "-d", "-l", "--write-midx"); err != nil {
			return err
		}
	}
	if p.packRefs {
		// pack-refs rewrites packed-refs and removes loose refs: under the
		// project's lock, as a ref move.
		unlock, err := r.state().lock(ctx)
		if err != nil {
			return err
		}
		err = r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "pack-refs", Flags: []string{"--all"}})
		unlock()
		if err != nil {
			return err
		}
		run.Actions = append(run.Actions, HKPackRefs)
	}
	if p.commitGraph {
		// Only the pool has a commit-graph: a task's git reads the pool's
		// (a split chain in a task would name the pool's layers, which the
		// pool's next write may merge away).
		if err := r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "commit-graph",
			Flags: []string{"write", "--reachable", "--split", "--no-progress"}}); err != nil {
			return err
		}
		run.Actions = append(run.Actions, HKCommitGraph)
	}
	return nil
}
