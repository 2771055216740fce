package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// A push's record whose commit failed in flight (the store's connection
// cut while the commit was on its way) may or may not be in the log. gitd
// keeps the pack and asks PushRecorded; at start, a recorded push whose
// commit is not in the repository marks its task (MarkNeedsRepair) instead
// of stopping the host, and the host resolves it with 'bushost task repair'
// (Repaired). A marked task refuses pushes, reviews, verdicts, grants and
// its close with reason TASK_NEEDS_REPAIR; the log says why.

// recordPushKey tags the context of a push's record, so that a test's
// failpoint (failpoint_on.go) cuts only that commit.
type recordPushKey struct{}

func needsRepair(t taskRow) error {
	scope := scopeString(t.Business, t.Project, t.Task)
	return errdefs.FailedPrecondition(errdefs.TaskNeedsRepair,
		"task %s needs repair by the host (event %d: %s): the host runs 'bushost task repair --business %s --project %s --task %s'",
		scope, t.RepairSeq, t.NeedsRepair, t.Business, t.Project, t.Task).
		With("task", scope).With("repair_seq", t.RepairSeq)
}

// PushRecorded implements authz.Authority: it reads the log (the task's
// latest push) afresh to learn whether a push of commit committed. A store
// that cannot be read is retried a few times over a few seconds (a cut
// connection is replaced by the pool) before the error is returned.
func (b *Broker) PushRecorded(ctx context.Context, business, project, task, commit string) (bool, error) {
	if _, err := names.ParseTask(business, project, task); err != nil {
		return false, err
	}
	var lastErr error
	for i := 0; i < 5; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return false, ctx.Err()
			case <-time.After(time.Duration(i) * 200 * time.Millisecond):
			}
		}
		if err := failOutcomeRead(); err != nil {
			lastErr = err
			continue
		}
		t, ok, err := b.st.read().task(ctx, business, project, task)
		if err != nil {
			lastErr = err
			continue
		}
		return ok && t.LastPushSeq != 0 && t.LastPushCommit == commit, nil
	}
	return false, fmt.Errorf("read the log to learn whether the push of %s committed: %w", commit, lastErr)
}

// MarkNeedsRepair implements authz.Authority: it appends task.needs_repair
// (actor host) with why and the commit the log has, and marks the task.
// A task already marked is left as it is.
func (b *Broker) MarkNeedsRepair(ctx context.Context, business, project, task, why, commit string) error {
	if _, err := names.ParseTask(business, project, task); err != nil {
		return err
	}
	return b.write(ctx, func(ctx context.Context, q *writeTx) error {
		t, ok, err := q.task(ctx, business, project, task)
		if err != nil || !ok || t.NeedsRepair != "" {
			return err
		}
		e := Event{Business: business, Project: project, Task: task, Type: TypeTaskNeedsRepair, Actor: authz.HostID,
			Data: mustData(map[string]any{"reason": why, "commit": commit, "push_seq": t.LastPushSeq})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		return q.exec(ctx, `UPDATE tasks SET needs_repair = $1, repair_seq = $2 WHERE business = $3 AND project = $4 AND task = $5`,
			why, e.Seq, business, project, task)
	})
}

// Repaired implements authz.Authority: it resolves a marked task. With
// restored, the ref was set to the logged push's commit; else that push is
// lost and the task's latest push becomes refCommit, what its ref holds
// ("" for none), which needs a review of its own before the task closes.
func (b *Broker) Repaired(ctx context.Context, business, project, task string, restored bool, commit, refCommit string) (int64, error) {
	if _, err := names.ParseTask(business, project, task); err != nil {
		return 0, err
	}
	var seq int64
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if err := writable(ctx, &q.queries, b.hostID, business, project); err != nil {
			return err
		}
		t, err := q.knownTask(ctx, business, project, task)
		if err != nil {
			return err
		}
		if t.NeedsRepair == "" {
			return errdefs.FailedPrecondition(errdefs.TaskNeedsNoRepair, "task %s does not need repair", scopeString(business, project, task))
		}
		if t.LastPushCommit != commit {
			return errdefs.FailedPrecondition(errdefs.RepairStale, "task %s's latest push is %s, not %s: run the repair again", scopeString(business, project, task), t.LastPushCommit, commit)
		}
		outcome := "restored"
		if !restored {
			outcome = "push_lost"
		}
		e := Event{Business: business, Project: project, Task: task, Type: TypeTaskRepaired, Actor: authz.HostID,
			Data: mustData(map[string]any{"outcome": outcome, "commit": commit, "ref_commit": refCommit, "repair_seq": t.RepairSeq})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		if _, err := q.db.ExecContext(ctx, `UPDATE tasks SET needs_repair = '', repair_seq = 0 WHERE business = $1 AND project = $2 AND task = $3`,
			business, project, task); err != nil {
			return err
		}
		if restored {
			return nil
		}
		pushSeq := e.Seq
		if refCommit == "" {
			pushSeq = 0
		}
		return q.setLastPush(ctx, t, pushSeq, refCommit, t.LastPushActor)
	})
	return seq, err
}

// LastPush returns the commit of the task's latest recorded push ("" for
// none) and why the task needs repair ("" if it does not).
func (b *Broker) LastPush(ctx context.Context, business, project, task string) (commit, needsRepair string, err error) {
	if _, err := names.ParseTask(business, project, task); err != nil {
		return "", "", err
	}
	t, err := b.st.read().knownTask(ctx, business, project, task)
	if err != nil {
		return "", "", err
	}
	return t.LastPushCommit, t.NeedsRepair, nil
}
