package gitd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gofrs/flock"
	"golang.org/x/sync/semaphore"

	"github.com/bushost/bushost/gitd/bundle"
)

// project is what the repositories of one project share in this process,
// and its one owner: the project's lock (shared by pushes, whole for
// everything else), its task repositories' locks, the bytes reserved by
// pushes past the project quota check, the cached size of its objects
// and the count of objects moved in and removed again. Every repo of the
// project reaches the same *project (repo.state); nothing else keeps
// state by project.
type project struct {
	lockPath string // <project>.flock, which other processes take too
	sem      *semaphore.Weighted

	mu sync.Mutex
	// tasks are the task repositories' locks, by task.
	tasks map[string]chan struct{}
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

// projects holds the state of each project this process has touched, by
// its directory.
type projects struct {
	mu sync.Mutex
	m  map[string]*project
}

// get returns the project at dir, made on first use.
func (ps *projects) get(dir, lockPath string) *project {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, ok := ps.m[dir]
	if !ok {
		if ps.m == nil {
			ps.m = map[string]*project{}
		}
		p = &project{lockPath: lockPath, sem: semaphore.NewWeighted(projectShares), tasks: map[string]chan struct{}{}, undone: map[string]uint64{}}
		ps.m[dir] = p
	}
	return p
}

// projectShares is the weight of a project's lock: lock takes all of it,
// share and lockTask one share, so that pushes to the project's tasks run
// side by side and everything else runs alone.
const projectShares = 1 << 30

// lock takes the project's lock whole (for its pool and all its task
// repositories): first among this process's goroutines, then the flock on
// <project>.flock that other processes (a second host on shared storage, a
// backup) take too. Everything but a push to a task takes it: seeding,
// syncing and landing main, publishing, archiving, repair, Reconcile.
func (p *project) lock(ctx context.Context) (func(), error) { return p.take(ctx, projectShares) }

// share takes one share of the project's lock (LOCK_SH on its flock): what
// a push holds, and a repack of the pool.
func (p *project) share(ctx context.Context) (func(), error) { return p.take(ctx, 1) }

// lockTask takes what a push's ref move needs: one share of the
// project's lock, then the task repository's own lock. Pushes to
// different tasks of one project hold theirs at once; anything holding
// the whole project's lock waits for them and stops new ones. Across
// processes the task's lock is the project's flock (shared) and, for the
// ref itself, <ref>.lock (refs.go): one host serves a project (its
// placement), so nothing else moves a task's ref.
func (p *project) lockTask(ctx context.Context, task string) (func(), error) {
	unlock, err := p.share(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	ch, ok := p.tasks[task]
	if !ok {
		ch = make(chan struct{}, 1)
		p.tasks[task] = ch
	}
	p.mu.Unlock()
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		unlock()
		return nil, ctx.Err()
	}
	return func() {
		<-ch
		unlock()
	}, nil
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

// undo removes what q moved into task's repository ("": the pool's) (a
// refused push or landing, or a migration that failed half way) and counts
// it for undoneCount.
func (p *project) undo(task string, q *bundle.Quarantine) error {
	err := q.Rollback()
	p.markUndone(task)
	return err
}

// markUndone counts objects of task's repository moved in and removed
// again (after the removal: a push that reads the count later cannot have
// read them).
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
// beside the project's size (read by size when not cached) and what other
// pushes reserved; else it returns false and the figure n did not fit.
func (p *project) reserve(n, limit int64, size func() (int64, error)) (used int64, ok bool, err error) {
	p.mu.Lock()
	used, known := p.usage, p.known
	p.mu.Unlock()
	if !known {
		if used, err = size(); err != nil {
			return 0, false, err
		}
		p.mu.Lock()
		p.usage, p.known = used, true
		p.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	used += p.reserved
	if used+n > limit {
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
