package gitd

import (
	"context"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
)

// An unclear commit: the Authority's commit of a push's record failed in
// flight (reason COMMIT_UNKNOWN), so the record may be in the log or not.
// The pack stays where Migrate put it until the log says: recorded, the
// push goes on to its ref move; not recorded, the pack is removed and the
// client told to push again; not learned, the pack is kept (Reconcile moves
// the ref at the next start if the record did commit) and the client gets
// a retryable Unavailable.
func (tx *writeTx) settleUnclear(ctx context.Context, a authz.Authority, g authz.Grant, commit string, cause error) error {
	r, log := tx.r, tx.r.st.log
	recorded, err := a.PushRecorded(ctx, g.Business, g.Project, g.Task, commit)
	switch {
	case err != nil:
		tx.keep()
		log.Warn("a push's record may or may not have committed and the log could not be read back; its pack is kept, and the next start settles the ref by the log",
			"repo", r.Path, "task", g.Task, "commit", commit, "cause", cause, "err", err)
		return errdefs.Unavailable(errdefs.CommitUnknown,
			"the record of push %s may or may not have committed, and the log could not be read back: push again (its pack is kept)", commit).
			With("commit", commit).Retry(time.Second).Wrap(err)
	case !recorded:
		// The caller's Rollback removes the pack.
		log.Warn("a push's record did not commit (the log has no such push); its pack is removed", "repo", r.Path, "task", g.Task, "commit", commit, "cause", cause)
		return errdefs.Unavailable(errdefs.CommitUnknown,
			"the record of push %s did not commit (the store's connection failed; the log has no such push): push again", commit).
			With("commit", commit).With("recorded", false).Retry(time.Second).Wrap(cause)
	}
	log.Warn("a push's record committed although its commit reported an error; the ref moves as usual", "repo", r.Path, "task", g.Task, "commit", commit, "cause", cause)
	return nil
}

// notMarked refuses a task marked for repair: its ref disagrees with the
// log, so there is nothing trustworthy to fetch for review.
func (s *Service) notMarked(ctx context.Context, g authz.Grant) error {
	_, why, err := s.o.Authority.LastPush(ctx, g.Business, g.Project, g.Task)
	if err != nil || why == "" {
		return err
	}
	return errdefs.FailedPrecondition(errdefs.TaskNeedsRepair,
		"task %s/%s/%s needs repair by the host (%s): the host runs 'bushost task repair --business %s --project %s --task %s'",
		g.Business, g.Project, g.Task, why, g.Business, g.Project, g.Task).With("task", g.Business+"/"+g.Project+"/"+g.Task)
}

// RepairResult is what RepairTask did.
type RepairResult struct {
	Outcome   string // "restored" or "push_lost"
	Commit    string // the push the log had
	RefCommit string // what refs/work/<task> holds now, "" if nothing
	Seq       int64  // the task.repaired event
}

// RepairTask resolves a task marked TASK_NEEDS_REPAIR by the log: when the
// logged push's commit is in the repository (its pack was kept, or put
// back), the ref is set to it; else the push is recorded as lost and the
// task's latest push becomes what its ref holds.
func (s *Service) RepairTask(ctx context.Context, t names.Task) (RepairResult, error) {
	business, project, task, ref := t.Business(), t.Project().Name(), t.Name(), t.WorkRef()
	r, err := s.store.task(t)
	if err != nil {
		return RepairResult{}, err
	}
	if !r.pool().exists() {
		return RepairResult{}, errdefs.NotFound(errdefs.ProjectNotFound, "project %s/%s was never added", business, project)
	}
	unlock, err := r.state().lock(ctx)
	if err != nil {
		return RepairResult{}, err
	}
	defer unlock()
	commit, why, err := s.o.Authority.LastPush(ctx, business, project, task)
	if err != nil {
		return RepairResult{}, err
	}
	if why == "" {
		return RepairResult{}, errdefs.FailedPrecondition(errdefs.TaskNeedsRepair, "task %s/%s/%s does not need repair", business, project, task).With("needs_repair", false)
	}
	gg := r.open()
	cur, err := r.readRef(ref)
	if err != nil {
		return RepairResult{}, err
	}
	res := RepairResult{Outcome: "push_lost", Commit: commit, RefCommit: cur}
	if commit != "" && r.exists() && gg.HasEncodedObject(plumbing.NewHash(commit)) == nil {
		if cur != commit {
			if err := r.UpdateRef(ctx, gitid.ReferenceName(ref), gitid.ObjectID(commit), gitid.ObjectID(cur)); err != nil {
				return RepairResult{}, err
			}
		}
		res.Outcome, res.RefCommit = "restored", commit
	}
	seq, err := s.o.Authority.Repaired(ctx, business, project, task, res.Outcome == "restored", commit, res.RefCommit)
	if err != nil {
		return RepairResult{}, err
	}
	res.Seq = seq
	s.log.Info("repaired a task by the log", "repo", r.Path, "ref", ref, "outcome", res.Outcome, "commit", commit, "ref_commit", res.RefCommit)
	return res, nil
}
