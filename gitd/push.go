package gitd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/metrics"
	"github.com/bushost/bushost/internal/names"
)

// PushResult is an accepted push.
type PushResult struct {
	Commit   string // refs/work/<task> now
	Previous string // before, "" if the ref is new
	Ref      string // refs/work/<task>
}

// criticalTimeout bounds the steps after the pack entered the repository
// (record, ref move), which run even if the client went away, so that a
// push is never half done because a client hung up.
const criticalTimeout = time.Minute

// Push ingests one bundle (body, the whole bundle as sent) as the work of
// task t, g's task as the server parsed it. size is the client's announced
// size, 0 if unknown.
//
// Order, for crash safety and nothing left behind: header checks; the pack
// through index-pack --strict in quarantine (in parallel with other
// pushes); connectivity and history checks; then under the task's lock
// (lockTask: the task repository's own, and a share of the project's, so
// pushes to other tasks of the project go on side by side): re-check the
// fast-forward, check the quotas, migrate the pack, have the Authority
// record the push (removing the pack again if it refuses), and move the
// ref against its old value (prepared under <ref>.lock before the
// migration, so that its fsync joins the pack's; renamed into place after
// the record). A crash between the record and the ref move is
// repaired by Reconcile.
func (s *Service) Push(ctx context.Context, g authz.Grant, t names.Task, peer authz.Peer, size int64, body io.Reader) (PushResult, error) {
	ref := t.WorkRef()
	r, err := s.store.task(t)
	if err != nil {
		return PushResult{}, err
	}
	if err := s.o.Authority.TaskOpen(ctx, g); err != nil {
		return PushResult{}, err
	}
	if !r.pool().exists() {
		return PushResult{}, projectNotFound(t.Project())
	}
	if size > s.o.MaxBundleBytes {
		return PushResult{}, tooLarge(size, s.o.MaxBundleBytes)
	}
	lr := &limitReader{r: body, left: s.o.MaxBundleBytes, max: s.o.MaxBundleBytes}
	br := bufio.NewReaderSize(lr, 64<<10)
	h, err := bundle.ReadHeader(br)
	if err != nil {
		return PushResult{}, lr.cause(err)
	}
	if len(h.Refs) != 1 {
		return PushResult{}, errdefs.InvalidArgument(errdefs.BundleInvalid, "bundle has %d refs; a push carries exactly one", len(h.Refs)).With("refs", len(h.Refs))
	}
	commit := h.Refs[0].Commit
	// Every read from here on sees the pool and this task's repository
	// only: another task's objects are neither a prerequisite, a delta
	// base nor a tree entry here, and no answer depends on them.
	tx, err := r.beginPush()
	if err != nil {
		return PushResult{}, err
	}
	defer tx.Rollback()
	q := tx.q
	gg := r.open()
	for _, p := range h.Prerequisites {
		ok, err := r.hasObject(plumbing.NewHash(p))
		if err != nil {
			ok = gg.HasEncodedObject(plumbing.NewHash(p)) == nil
		}
		if !ok {
			return PushResult{}, errdefs.FailedPrecondition(errdefs.PrerequisiteMissing, "missing prerequisite: the bundle needs commit %s, which the bus host does not have; bundle against a main fetched from it", p).With("commit", p)
		}
	}

	if !s.skip.ObjectChecks {
		q.Limits = bundle.Limits{BlobBytes: s.o.MaxObjectBytes, CommitBytes: s.o.MaxCommitBytes,
			TreeBytes: s.o.MaxTreeBytes, Objects: s.o.MaxPackObjects, InflatedBytes: s.o.MaxPushInflated}
	}
	// index-pack does not fsync: Migrate fsyncs the pack, its index and
	// the directories in one concurrent batch (bundle.SyncAll), before
	// the record, instead of index-pack's fsyncs one after another.
	q.IndexConfig = append(indexPackConfig[:len(indexPackConfig):len(indexPackConfig)], "core.fsync=none")
	indexStart := time.Now()
	name, err := q.IndexPack(ctx, s.git, r.gitDir(), br)
	metrics.IndexPack(time.Since(indexStart))
	if err != nil || lr.err != nil {
		return PushResult{}, packJunk(lr.cause(err))
	}
	objs, err := openObjects(q.Dir, name, gg)
	if err != nil {
		return PushResult{}, err
	}
	tx.objs = objs
	if !s.skip.BeyondGit { // unless a benchmark's build turned it off
		tx.walked = tx.startBeyondGit(ctx, commit)
	}
	if err := tx.checkCommit(ctx, commit); err != nil {
		return PushResult{}, err
	}
	old, err := r.readRef(ref)
	if err != nil {
		return PushResult{}, err
	}
	if old == commit {
		return PushResult{Commit: commit, Previous: old, Ref: ref}, nil
	}
	if err := tx.checkHistory(ctx, ref, old, commit); err != nil {
		return PushResult{}, err
	}

	if err := tx.lockTask(ctx, commit); err != nil {
		return PushResult{}, err
	}
	cur, err := r.readRef(ref)
	if err != nil {
		return PushResult{}, err
	}
	if cur == commit {
		return PushResult{Commit: commit, Previous: cur, Ref: ref}, nil
	}
	if cur != old {
		if err := tx.checkHistory(ctx, ref, cur, commit); err != nil {
			return PushResult{}, err
		}
	}
	if err := tx.reserve(); err != nil {
		return PushResult{}, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), criticalTimeout)
	defer cancel()
	// The ref move is prepared (old value checked, new one written into
	// <ref>.lock) so that its fsync joins the pack's; it is put in place
	// only after the record.
	if err := tx.prepareRef(cctx, gitid.ReferenceName(ref), gitid.ObjectID(commit), gitid.ObjectID(cur)); err != nil {
		return PushResult{}, err
	}
	if err := tx.moveIn(); err != nil {
		return PushResult{}, err
	}
	if err := tx.wait(); err != nil {
		return PushResult{}, err
	}
	p := authz.Push{Business: g.Business, Project: g.Project, Task: g.Task, Commit: commit, Previous: cur, Ref: ref}
	if err := s.o.Authority.RecordPush(cctx, g, p, peer); err != nil {
		if errdefs.ReasonOf(err) != errdefs.CommitUnknown {
			return PushResult{}, err
		}
		if err := tx.settleUnclear(cctx, s.o.Authority, g, commit, err); err != nil {
			return PushResult{}, err
		}
	}
	if err := tx.Commit(cctx); err != nil {
		s.log.Error("push recorded but ref not moved; Reconcile repairs it at next start", "repo", r.Path, "ref", ref, "commit", commit, "err", err)
		return PushResult{}, fmt.Errorf("push recorded, but moving %s failed (repaired at the next start of bushostd): %w", ref, err)
	}
	s.hk.Notify(r)
	return PushResult{Commit: commit, Previous: cur, Ref: ref}, nil
}

// writeTx is one write into a repository, a push (beginPush) or a
// landing or sync of main (beginLand), and everything it holds while it writes: the
// quarantine (for a push with the pack's reader and the beyond-git walk
// reading it), the task's or the project's lock, the bytes reserved
// against the project's quota, a repository made for a first push, the
// prepared ref move and, once moved in, the objects in the repository.
// Commit accounts the objects and puts a prepared ref in place; Rollback,
// deferred right after begin, undoes whatever Commit did not make final,
// in order, and only releases after a Commit.
type writeTx struct {
	r repo
	q *bundle.Quarantine
	// objs reads a push's quarantined pack; walked waits for the
	// beyond-git walk over it (both set once the pack is indexed).
	objs   *objectReader
	walked func() error
	// undone is the repository's undoneCount when the push began: a
	// push whose checks may have read objects removed since is refused
	// (lockTask).
	undone   uint64
	unlock   func()
	reserved int64
	made     bool // ensure made the task's repository
	mv       *RefMove
	migrated bool // the pack is in the repository
	kept     bool // leave the migrated pack (its record's fate is unknown)
	done     bool // committed
}

// beginPush starts a push into r: its quarantine, and the count of undone
// objects its checks are read against. A push to the task moves its pack
// in under the task's lock and removes it again if refused: this push's
// checks, which run before it holds that lock, may read that pack
// meanwhile (its prerequisite, index-pack's connectivity, the ancestry
// and the walk's "there before"). Counted now and again under the lock,
// such an undo refuses this push (TestAttackPushOnARefusedPushInFlight).
func (r repo) beginPush() (*writeTx, error) {
	tx := &writeTx{r: r, undone: r.state().undoneCount(r.Task)}
	q, err := r.quarantine()
	if err != nil {
		return nil, err
	}
	tx.q = q
	return tx, nil
}

// beginLand starts a landing's or a sync's write into the pool r: a
// quarantine of its objects.
func (r repo) beginLand() (*writeTx, error) {
	q, err := bundle.NewQuarantine(r.objects())
	if err != nil {
		return nil, err
	}
	return &writeTx{r: r, q: q}, nil
}

// lockProject takes the whole project's lock, as a landing does.
func (tx *writeTx) lockProject(ctx context.Context) error {
	unlock, err := tx.r.state().lock(ctx)
	if err != nil {
		return err
	}
	tx.unlock = unlock
	return nil
}

// lockTask takes the task's lock (project.lockTask) and refuses the push
// if objects its checks may have read were removed since it began.
func (tx *writeTx) lockTask(ctx context.Context, commit string) error {
	unlock, err := tx.r.state().lockTask(ctx, tx.r.Task)
	if err != nil {
		return err
	}
	tx.unlock = unlock
	if tx.r.state().undoneCount(tx.r.Task) != tx.undone {
		return errdefs.Aborted(errdefs.ObjectsUndone, "while push %s was checked, another push to task %s (or a landing) was refused and its objects removed, which the checks may have read: push again", commit, tx.r.Task).
			With("commit", commit).With("task", tx.r.Task)
	}
	return nil
}

// prepareRef makes the task's repository on its first push and prepares
// the ref move from old to newID, for moveIn to fsync with the objects.
func (tx *writeTx) prepareRef(ctx context.Context, ref gitid.ReferenceName, newID, old gitid.ObjectID) error {
	made, err := tx.r.ensure()
	if err != nil {
		return err
	}
	tx.made = made
	if made {
		tx.q.AlsoSync = []string{filepath.Dir(tx.r.Path)}
	}
	if tx.mv, err = tx.r.PrepareRef(ctx, ref, newID, old); err != nil {
		return err
	}
	if f := tx.mv.Pending(); f != "" {
		tx.q.AlsoSync = append(tx.q.AlsoSync, f)
	}
	return nil
}

// moveIn moves the quarantined objects into the repository, their fsyncs
// (and a prepared ref lock's) in one batch.
func (tx *writeTx) moveIn() error {
	if err := tx.q.Migrate(); err != nil {
		tx.r.state().markUndone(tx.r.Task) // Migrate removed what it had moved in
		return err
	}
	tx.migrated = true
	if tx.mv != nil {
		tx.mv.Synced()
	}
	return nil
}

// wait waits for the beyond-git walk and returns its verdict.
func (tx *writeTx) wait() error {
	if tx.walked == nil {
		return nil
	}
	return tx.walked()
}

// keep leaves the migrated pack in the repository on Rollback: the
// record's fate is unknown, and Reconcile moves the ref at the next start
// if it did commit.
func (tx *writeTx) keep() { tx.kept = true }

// Commit accounts the objects moved in to the project and puts a prepared
// ref in place. After it, Rollback only releases.
func (tx *writeTx) Commit(ctx context.Context) error {
	tx.done = true
	tx.r.state().grow(addedBytes(tx.q))
	if tx.mv == nil {
		return nil
	}
	return tx.mv.Commit(ctx)
}

// Rollback undoes what Commit did not make final: the prepared ref move,
// the migrated pack (counted for undoneCount), a repository made for
// this push; then releases the reservation and the task's lock, waits for
// the walk and removes the quarantine. It may be called more than once.
func (tx *writeTx) Rollback() {
	if tx.mv != nil {
		tx.mv.Abort()
	}
	if !tx.done {
		removed := !tx.migrated
		if tx.migrated && !tx.kept {
			err := tx.q.Rollback()
			tx.r.state().markUndone(tx.r.Task)
			if err != nil {
				tx.r.st.log.Error("remove the objects of a refused write", "repo", tx.r.Path, "err", err)
			} else {
				removed = true
			}
		}
		if tx.made && removed {
			if err := tx.r.dropNew(); err != nil {
				tx.r.st.log.Error("remove the repository of a refused first push", "repo", tx.r.Path, "err", err)
			}
		}
	}
	tx.done = true
	if tx.reserved != 0 {
		tx.r.state().release(tx.reserved)
		tx.reserved = 0
	}
	if tx.unlock != nil {
		tx.unlock()
		tx.unlock = nil
	}
	// Every return waits for the walk, so that it never reads a pack
	// that is gone.
	tx.wait()
	if tx.objs != nil {
		tx.objs.Close()
		tx.objs = nil
	}
	tx.q.Remove()
}

// checkCommit requires the bundle's ref to name a commit. Its history is
// complete without a walk: index-pack --strict refuses a pack with an
// object whose links (tree entries, parents, tree of a commit, a tag's
// target) are neither in the pack nor in the repository, and every object in
// the repository entered it the same way (or by a fetch, which checks
// connectivity), so the links of what is already there are complete too.
func (tx *writeTx) checkCommit(ctx context.Context, commit string) error {
	typ := ""
	if t, err := tx.objs.objectType(commit); err == nil {
		typ = t.String()
	} else {
		c := gitcmd.Cmd{GitDir: tx.r.gitDir(), Sub: "cat-file", Flags: []string{"-t"}, Args: []string{commit}, Env: tx.q.Env()}
		if typ, err = tx.r.git.Line(ctx, c, gitcmd.MaxLine); err != nil {
			return errdefs.InvalidArgument(errdefs.BundleInvalid, "the bundle's ref names %s, which neither the bundle nor the repository holds", commit).With("commit", commit)
		}
	}
	if typ != "commit" {
		return refNotCommit(commit, typ)
	}
	return nil
}

// checkHistory requires commit to fast-forward old (the task's ref), or,
// for a new ref, to share history with main. A short walk in process
// answers the usual case (commit descends from old, or from main); git
// answers the rest.
func (tx *writeTx) checkHistory(ctx context.Context, ref, old, commit string) error {
	r, q, objs := tx.r, tx.q, tx.objs
	if old != "" {
		ok, err := objs.isAncestor(old, commit)
		if err != nil {
			ok, err = r.isAncestor(ctx, q, old, commit)
		}
		if err != nil {
			return err
		}
		if !ok {
			return errdefs.FailedPrecondition(errdefs.NonFastForward, "non-fast-forward: %s does not descend from %s at %s; fetch it with 'bushost fetch-work --repo DIR', rebase onto it and push again", commit, ref, old).
				With("commit", commit).With("ref", ref).With("current", old)
		}
		return nil
	}
	main, err := r.pool().readRef(MainRef)
	if err != nil {
		return err
	}
	if main == "" {
		return errdefs.FailedPrecondition(errdefs.MainNotFound, "project %s/%s has no main", r.Business, r.Project)
	}
	if ok, err := objs.isAncestor(main, commit); err == nil && ok {
		return nil
	}
	_, err = r.mergeBase(ctx, q, main, commit)
	if errors.Is(err, errNoMergeBase) {
		return errdefs.FailedPrecondition(errdefs.UnrelatedHistory, "%s shares no history with main; start from a main fetched from the bus host", commit).With("commit", commit)
	}
	return err
}

func tooLarge(n, limit int64) error {
	return errdefs.ResourceExhausted(errdefs.BundleTooLarge, "bundle too large: %d bytes is over the limit of %d bytes (bushostd --max-bundle-bytes)", n, limit).
		With("limit", limit).With("size", n)
}

// limitReader counts a push's bytes and fails past the limit, remembering
// why it failed so that the caller reports the cause rather than the short
// pack git saw.
type limitReader struct {
	r         io.Reader
	left, max int64
	err       error
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		l.err = errdefs.ResourceExhausted(errdefs.BundleTooLarge, "bundle too large: the bundle is over the limit of %d bytes (bushostd --max-bundle-bytes)", l.max).With("limit", l.max)
		return 0, l.err
	}
	if err != nil && !errors.Is(err, io.EOF) {
		l.err = err
	}
	return n, err
}

// cause prefers the reader's own failure over what it caused downstream.
func (l *limitReader) cause(err error) error {
	if l.err != nil {
		return l.err
	}
	return err
}
