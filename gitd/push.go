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
// g's task. size is the client's announced size, 0 if unknown.
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
func (s *Service) Push(ctx context.Context, g authz.Grant, peer authz.Peer, size int64, body io.Reader) (PushResult, error) {
	ref, err := names.WorkRef(g.Task)
	if err != nil {
		return PushResult{}, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err).Wrap(err)
	}
	r, err := s.task(g.Business, g.Project, g.Task)
	if err != nil {
		return PushResult{}, err
	}
	if err := s.o.Authority.TaskOpen(ctx, g); err != nil {
		return PushResult{}, err
	}
	if !r.pool().exists() {
		return PushResult{}, projectNotFound(g.Business, g.Project)
	}
	if size > s.o.MaxBundleBytes {
		return PushResult{}, s.tooLarge(size)
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
	// A push to the task moves its pack in under the task's lock and
	// removes it again if refused: this push's checks, which run before
	// it holds that lock, may read that pack meanwhile (its prerequisite,
	// index-pack's connectivity, the ancestry and the walk's "there
	// before"). Counted now and again under the lock, such an undo
	// refuses this push (TestAttackPushOnARefusedPushInFlight).
	undone := s.undoneCount(r)
	gg, err := s.open(r)
	if err != nil {
		return PushResult{}, err
	}
	for _, p := range h.Prerequisites {
		ok, err := r.hasObject(plumbing.NewHash(p))
		if err != nil {
			ok = gg.HasEncodedObject(plumbing.NewHash(p)) == nil
		}
		if !ok {
			return PushResult{}, errdefs.FailedPrecondition(errdefs.PrerequisiteMissing, "missing prerequisite: the bundle needs commit %s, which the bus host does not have; bundle against a main fetched from it", p).With("commit", p)
		}
	}

	q, err := r.quarantine()
	if err != nil {
		return PushResult{}, err
	}
	defer q.Remove()
	if !s.o.NoObjectChecks {
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
	defer objs.Close()
	walked := s.startBeyondGit(ctx, r, q, objs, commit)
	// Every return waits for the walk, so that it never reads a pack that
	// is gone.
	defer walked()
	if err := s.checkCommit(ctx, r, q, objs, commit); err != nil {
		return PushResult{}, err
	}
	old, err := readRef(gg, ref)
	if err != nil {
		return PushResult{}, err
	}
	if old == commit {
		return PushResult{Commit: commit, Previous: old, Ref: ref}, nil
	}
	if err := s.checkHistory(ctx, r, q, objs, gg, ref, old, commit); err != nil {
		return PushResult{}, err
	}

	unlock, err := s.lockTask(ctx, r)
	if err != nil {
		return PushResult{}, err
	}
	defer unlock()
	cur, err := readRef(gg, ref)
	if err != nil {
		return PushResult{}, err
	}
	if s.undoneCount(r) != undone {
		return PushResult{}, errdefs.Aborted(errdefs.ObjectsUndone, "while push %s was checked, another push to task %s (or a landing) was refused and its objects removed, which the checks may have read: push again", commit, g.Task).
			With("commit", commit).With("task", g.Task)
	}
	if cur == commit {
		return PushResult{Commit: commit, Previous: cur, Ref: ref}, nil
	}
	if cur != old {
		if err := s.checkHistory(ctx, r, q, objs, gg, ref, cur, commit); err != nil {
			return PushResult{}, err
		}
	}
	packBytes, err := s.checkQuotas(r, q)
	if err != nil {
		return PushResult{}, err
	}
	defer s.release(r, packBytes)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), criticalTimeout)
	defer cancel()
	made, err := s.ensure(cctx, r)
	if err != nil {
		return PushResult{}, err
	}
	if made {
		q.AlsoSync = []string{filepath.Dir(r.Path)}
	}
	// The ref move is prepared (old value checked, new one written into
	// <ref>.lock) so that its fsync joins the pack's; it is put in place
	// only after the record.
	mv, err := r.PrepareRef(cctx, gitid.ReferenceName(ref), gitid.ObjectID(commit), gitid.ObjectID(cur))
	if err != nil {
		if made {
			s.dropNew(r)
		}
		return PushResult{}, err
	}
	defer mv.Abort()
	if f := mv.Pending(); f != "" {
		q.AlsoSync = append(q.AlsoSync, f)
	}
	if err := q.Migrate(); err != nil {
		s.markUndone(r) // Migrate removed what it had moved in
		mv.Abort()
		if made {
			s.dropNew(r)
		}
		return PushResult{}, err
	}
	mv.Synced()
	// refused undoes a push refused after its pack moved in (by the walk
	// or the broker): the prepared move, the pack, a repository it made.
	refused := func(err error) (PushResult, error) {
		mv.Abort()
		if rerr := s.undo(r, q); rerr != nil {
			s.log.Error("remove refused pack", "repo", r.Path, "err", rerr)
		} else if made {
			s.dropNew(r)
		}
		return PushResult{}, err
	}
	if err := walked(); err != nil {
		return refused(err)
	}
	p := authz.Push{Business: g.Business, Project: g.Project, Task: g.Task, Commit: commit, Previous: cur, Ref: ref}
	if err := s.o.Authority.RecordPush(cctx, g, p, peer); err != nil {
		if errdefs.ReasonOf(err) != errdefs.CommitUnknown {
			return refused(err)
		}
		if err := s.settleUnclear(cctx, r, q, g, commit, err); err != nil {
			mv.Abort()
			if e, ok := errdefs.As(err); ok && e.Metadata["recorded"] == "false" && made {
				s.dropNew(r)
			}
			return PushResult{}, err
		}
	}
	s.account(r, packBytes, q)
	if err := mv.Commit(cctx); err != nil {
		s.log.Error("push recorded but ref not moved; Reconcile repairs it at next start", "repo", r.Path, "ref", ref, "commit", commit, "err", err)
		return PushResult{}, fmt.Errorf("push recorded, but moving %s failed (repaired at the next start of bushostd): %w", ref, err)
	}
	s.hk.Notify(r)
	return PushResult{Commit: commit, Previous: cur, Ref: ref}, nil
}

// checkCommit requires the bundle's ref to name a commit. Its history is
// complete without a walk: index-pack --strict refuses a pack with an
// object whose links (tree entries, parents, tree of a commit, a tag's
// target) are neither in the pack nor in the repository, and every object in
// the repository entered it the same way (or by a fetch, which checks
// connectivity), so the links of what is already there are complete too.
func (s *Service) checkCommit(ctx context.Context, r repo, q *bundle.Quarantine, objs *objectReader, commit string) error {
	typ := ""
	if t, err := objs.objectType(commit); err == nil {
		typ = t.String()
	} else {
		c := gitcmd.Cmd{GitDir: r.gitDir(), Sub: "cat-file", Flags: []string{"-t"}, Args: []string{commit}, Env: q.Env()}
		if typ, err = s.git.Line(ctx, c, gitcmd.MaxLine); err != nil {
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
func (s *Service) checkHistory(ctx context.Context, r repo, q *bundle.Quarantine, objs *objectReader, gg *view, ref, old, commit string) error {
	if old != "" {
		ok, err := objs.isAncestor(old, commit)
		if err != nil {
			ok, err = s.isAncestor(ctx, r, q, old, commit)
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
	main, err := readRef(gg.poolView(), MainRef)
	if err != nil {
		return err
	}
	if main == "" {
		return errdefs.FailedPrecondition(errdefs.MainNotFound, "project %s/%s has no main", r.Business, r.Project)
	}
	if ok, err := objs.isAncestor(main, commit); err == nil && ok {
		return nil
	}
	_, err = s.mergeBase(ctx, r, q, main, commit)
	if errors.Is(err, errNoMergeBase) {
		return errdefs.FailedPrecondition(errdefs.UnrelatedHistory, "%s shares no history with main; start from a main fetched from the bus host", commit).With("commit", commit)
	}
	return err
}

func (s *Service) tooLarge(n int64) error {
	return errdefs.ResourceExhausted(errdefs.BundleTooLarge, "bundle too large: %d bytes is over the limit of %d bytes (bushostd --max-bundle-bytes)", n, s.o.MaxBundleBytes).
		With("limit", s.o.MaxBundleBytes).With("size", n)
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
