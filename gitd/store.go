package gitd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"log/slog"

	"github.com/gofrs/flock"
	"golang.org/x/sync/semaphore"

	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/safepath"
)

// project is the one owner of what the repositories of one project share
// in this process: every repo of the project reaches the same *project
// (repo.state), and nothing else keeps state by project.
type project struct {
	dir      string // the project's directory (repo.Dir)
	lockPath string // <project>.flock, which other processes take too
	sem      *semaphore.Weighted

	mu sync.Mutex
	// tasks are the task repositories' locks, by task; runs hold each
	// repository ("" the pool) for a housekeeping run or an archive.
	tasks, runs map[string]chan struct{}
	// reserved is the bytes of pushes past the project quota check and
	// not yet accounted: pushes to two tasks check the quota side by side.
	reserved int64
	// usage caches the project's object bytes (known says it is read),
	// so that a push's project quota check does not walk the objects.
	usage int64
	known bool
	// undone counts, by task ("" for the pool), the objects moved in and
	// removed again (a refused push or landing): a push whose checks ran
	// meanwhile may have read them (undoneCount).
	undone map[string]uint64
}

// store is the repositories under ReposDir (their layout is in
// repository.go): the one maker of a repo, and, by project directory, the
// *project its repos share in this process.
type store struct {
	dir string // ReposDir
	git *gitcmd.Runner
	log *slog.Logger
	// limits are the Service's Options.Limits, filled: a view reads no
	// object over MaxObjectBytes, a push stores no more than the quotas.
	limits *limits.Limits
	// treeSizes remembers what the trees walked expand to (treesize.go).
	treeSizes treeSizes

	mu       sync.Mutex
	projects map[string]*project
}

// treeBounds are the tree bounds of the limits, and the store's memory of
// tree sizes.
func (st *store) treeBounds() treeBounds {
	return treeBounds{maxPaths: st.limits.MaxTreePaths, maxDepth: st.limits.MaxTreeDepth, known: &st.treeSizes}
}

// state returns the project at dir, made on first use.
func (st *store) state(dir, lockPath string) *project {
	st.mu.Lock()
	defer st.mu.Unlock()
	p, ok := st.projects[dir]
	if !ok {
		p = &project{dir: dir, lockPath: lockPath, sem: semaphore.NewWeighted(projectShares), tasks: map[string]chan struct{}{},
			runs: map[string]chan struct{}{}, undone: map[string]uint64{}}
		st.projects[dir] = p
	}
	return p
}

// project returns p's pool, its directories checked to be the daemon's.
func (st *store) project(p names.Project) (repo, error) {
	if p.IsZero() {
		return repo{}, errors.New("gitd: a repository of no project")
	}
	business, project := p.Business(), p.Name()
	dir := filepath.Join(st.dir, business, project)
	r := repo{Business: business, Project: project, Dir: dir, Path: filepath.Join(dir, poolName),
		LockPath: filepath.Join(st.dir, business, project+".flock"), git: st.git, proj: p, st: st}
	// The directories, as they are opened, must be the daemon's (not
	// links, writable by nobody else).
	for _, d := range []string{filepath.Dir(dir), dir, r.Path, filepath.Join(dir, tasksDir)} {
		if err := safepath.IfExists(d, os.Geteuid(), safepath.Dir); err != nil {
			return repo{}, err
		}
	}
	return r, nil
}

// existingProject is project for a call that needs the pool made:
// PROJECT_NOT_FOUND when it never was.
func (st *store) existingProject(p names.Project) (repo, error) {
	r, err := st.project(p)
	if err == nil && !r.exists() {
		err = projectNotFound(p)
	}
	return r, err
}

// task returns t's repository (it may not exist yet: ensure makes it).
func (st *store) task(t names.Task) (repo, error) {
	if t.IsZero() {
		return repo{}, errors.New("gitd: a repository of no task")
	}
	p, err := st.project(t.Project())
	if err != nil {
		return repo{}, err
	}
	r := p
	r.Task, r.task, r.Path = t.Name(), t, filepath.Join(p.Dir, tasksDir, t.Name()+".git")
	if err := safepath.IfExists(r.Path, os.Geteuid(), safepath.Dir); err != nil {
		return repo{}, err
	}
	return r, nil
}

// repos lists every project's pool in the store.
func (st *store) repos() ([]repo, error) {
	var out []repo
	bs, err := os.ReadDir(st.dir)
	if err != nil {
		return nil, err
	}
	for _, b := range bs {
		if !b.IsDir() || names.Check("business", b.Name()) != nil {
			continue
		}
		ps, err := os.ReadDir(filepath.Join(st.dir, b.Name()))
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			if !p.IsDir() {
				continue
			}
			scope, err := names.ParseProject(b.Name(), p.Name())
			if err != nil {
				continue
			}
			r, err := st.project(scope)
			if err != nil || !r.exists() {
				continue
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// projectShares is the weight of a project's lock: lock takes all of it,
// lockShared and lockTask one share, so that pushes to the project's tasks run
// side by side and everything else runs alone.
const projectShares = 1 << 30

// lock takes the project's lock whole (for its pool and all its task
// repositories): first among this process's goroutines, then the flock on
// <project>.flock that other processes (a second host on shared storage, a
// backup) take too. Everything but a push to a task takes it: seeding,
// syncing and landing main, publishing, archiving, repair, Reconcile.
func (p *project) lock(ctx context.Context) (func(), error) { return p.take(ctx, projectShares) }

// lockShared takes one share of the project's lock (LOCK_SH on its flock): what
// a push holds, and a repack of the pool.
func (p *project) lockShared(ctx context.Context) (func(), error) { return p.take(ctx, 1) }

// lockTask takes what a push's ref move needs: one share of the
// project's lock, then the task repository's own lock. Pushes to
// different tasks of one project hold theirs at once; anything holding
// the whole project's lock waits for them and stops new ones. Across
// processes the task's lock is the project's flock (shared) and, for the
// ref itself, <ref>.lock (refs.go): one host serves a project (its
// placement), so nothing else moves a task's ref.
func (p *project) lockTask(ctx context.Context, task string) (func(), error) {
	unlock, err := p.lockShared(ctx)
	if err != nil {
		return nil, err
	}
	release, err := p.one(ctx, p.tasks, task)
	if err != nil {
		unlock()
		return nil, err
	}
	return func() {
		release()
		unlock()
	}, nil
}

// hold waits until no housekeeping run is in progress on task's
// repository ("": the pool) and keeps others off it until release is
// called: a run, or ArchiveTask, which removes the repository.
func (p *project) hold(ctx context.Context, task string) (release func(), err error) {
	return p.one(ctx, p.runs, task)
}

// one takes the lock of key in locks (a channel of one, made on first
// use), or gives up when ctx ends.
func (p *project) one(ctx context.Context, locks map[string]chan struct{}, key string) (func(), error) {
	p.mu.Lock()
	ch, ok := locks[key]
	if !ok {
		ch = make(chan struct{}, 1)
		locks[key] = ch
	}
	p.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// take takes n shares of the project's lock, and the flock: shared for
// less than all of it.
func (p *project) take(ctx context.Context, n int64) (func(), error) {
	if err := p.sem.Acquire(ctx, n); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(p.lockPath), 0o700); err != nil {
		p.sem.Release(n)
		return nil, err
	}
	fl := flock.New(p.lockPath)
	take := fl.TryLockContext
	if n < projectShares {
		take = fl.TryRLockContext
	}
	ok, err := take(ctx, 10*time.Millisecond)
	if err != nil || !ok {
		p.sem.Release(n)
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("lock %s: %w", p.lockPath, err)
	}
	return func() {
		fl.Unlock()
		p.sem.Release(n)
	}, nil
}

// markUndone counts objects of task's repository ("": the pool's) moved
// in and removed again (a refused push or landing), after the removal: a
// push that reads the count later cannot have read them.
func (p *project) markUndone(task string) {
	p.mu.Lock()
	p.undone[task]++
	p.mu.Unlock()
}

// undoneCount is how many times objects task's repository sees (its own
// and its pool's) were moved in and removed again. A push reads it before
// its checks and again under its task's lock: every undo of its task's
// repository (under that lock) or of the pool (under the whole project's
// lock) that could have shown the checks what is gone is counted by then.
func (p *project) undoneCount(task string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.undone[task]
	if task != "" {
		n += p.undone[""]
	}
	return n
}

// reserve adds n bytes to the project's reservations if they fit limit
// beside the project's size (read from disk when not cached) and what
// other pushes reserved; else it returns false and the figure n did not
// fit.
func (p *project) reserve(n, limit int64) (used int64, ok bool, err error) {
	p.mu.Lock()
	known := p.known
	p.mu.Unlock()
	if !known {
		v, err := dirBytes(p.dir)
		if err != nil {
			return 0, false, err
		}
		p.mu.Lock()
		p.usage, p.known = v, true
		p.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if used = p.usage + p.reserved; used+n > limit {
		return used, false, nil
	}
	p.reserved += n
	return used, true, nil
}

// release drops a reservation of n bytes, once the push is accounted or
// refused.
func (p *project) release(n int64) {
	p.mu.Lock()
	p.reserved = max(p.reserved-n, 0)
	p.mu.Unlock()
}

// grow adds delta (an accepted push's or landing's files, a housekeeping
// run's change) to the project's cached size, if it has one.
func (p *project) grow(delta int64) {
	p.mu.Lock()
	if p.known {
		p.usage = max(p.usage+delta, 0)
	}
	p.mu.Unlock()
}

// forget drops the project's cached size after a write that did not go
// through a push (an import, an archive), to be read again.
func (p *project) forget() {
	p.mu.Lock()
	p.known = false
	p.mu.Unlock()
}
