package broker

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
)

// Landing a task puts its approved work on main (gitd/land.go moves the
// ref). The broker's part: the same gate as close, decided from the log
// (gate.go), and, in one transaction with a second look at the gate, the
// events task.landed {commit, main_old, main_new, merge} and task.closed
// {commit, landed_seq}. A landed task is closed; the landed event says why.

var _ authz.Lander = (*Broker)(nil)

// landingFields are the fields of a task.landed event.
type landingFields struct {
	Commit  string `json:"commit"`
	MainOld string `json:"main_old"`
	MainNew string `json:"main_new"`
	Merge   string `json:"merge"`
}

// mayLand refuses a grant that is not the host's and lacks task.land for
// its own task.
func mayLand(g authz.Grant, business, project, task string) error {
	if g.Host {
		return nil
	}
	if !g.Has(authz.CapTaskLand) {
		return errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant %s lacks capability %s", g.ID, authz.CapTaskLand)
	}
	if business != g.Business || project != g.Project || task != g.Task {
		return errdefs.PermissionDenied(errdefs.OtherTask, "grant %s is for task %s, not %s", g.ID, scopeString(g.Business, g.Project, g.Task), scopeString(business, project, task))
	}
	return nil
}

// landable returns the commit the task may land: its latest push, approved.
func landable(ctx context.Context, q *queries, keys *Keyring, business, project, task string) (taskRow, string, error) {
	if _, err := names.ParseTask(business, project, task); err != nil {
		return taskRow{}, "", err
	}
	e, ok, err := q.latestEvent(ctx, business, project, task, TypeTaskLanded, 0)
	if err != nil {
		return taskRow{}, "", err
	}
	if ok {
		if err := proven(keys, taskRow{Business: business, Project: project, Task: task}, e); err != nil {
			return taskRow{}, "", err
		}
		var f landingFields
		_ = json.Unmarshal([]byte(e.Data), &f)
		return taskRow{}, "", errdefs.FailedPrecondition(errdefs.TaskLanded, "task %s already landed %s on main (event %d)", scopeString(business, project, task), f.Commit, e.Seq).
			With("seq", e.Seq).With("commit", f.Commit)
	}
	t, err := openTask(ctx, q, business, project, task, "landings")
	if err != nil {
		return t, "", err
	}
	commit, err := gate(ctx, q, keys, t)
	if err != nil {
		return t, "", err
	}
	if commit == "" {
		return t, "", errdefs.FailedPrecondition(errdefs.NothingToLand, "task %s has no push: nothing to land", scopeString(business, project, task))
	}
	return t, commit, nil
}

// LandApproved implements authz.Lander.
func (b *Broker) LandApproved(ctx context.Context, g authz.Grant, business, project, task string, force bool) (string, error) {
	if err := b.Halted(); err != nil {
		return "", err
	}
	if err := mayLand(g, business, project, task); err != nil {
		return "", err
	}
	q := b.st.read()
	t, commit, err := landable(ctx, q, b.keys, business, project, task)
	if err != nil || force {
		return commit, err
	}
	// A push whose landing was refused (its merge conflicted or ran out
	// of time) is not tried again by itself: a loop of landings would
	// hold a CPU. A new push is a new commit; --force says try anyway.
	e, ok, err := q.latestEvent(ctx, t.Business, t.Project, t.Task, TypeTaskLandRefused, t.LastPushSeq)
	if err != nil {
		return "", err
	}
	if ok {
		var f landRefusalFields
		_ = json.Unmarshal([]byte(e.Data), &f)
		if f.Commit == commit {
			return "", errdefs.FailedPrecondition(errdefs.LandRefused,
				"landing %s of task %s was refused before (event %d: %s): push a new commit (rebased onto main) and get it approved, or land again with --force",
				commit, scopeString(business, project, task), e.Seq, f.Reason).
				With("seq", e.Seq).With("commit", commit).With("cause", f.Reason)
		}
	}
	return commit, nil
}

// landRefusalFields are the fields of a task.land_refused event.
type landRefusalFields struct {
	Commit string `json:"commit"`
	Main   string `json:"main"`
	Reason string `json:"reason"`
}

// landWrite records a landing's outcome. It checks what the record needs
// before its transaction (g may land l's task; commits are object ids),
// then runs fn in a write transaction, after rechecking that a grant (not
// the host) still holds task.land, with the actor of its events.
func (b *Broker) landWrite(ctx context.Context, g authz.Grant, l authz.Landing, commits []string, fn func(ctx context.Context, q *writeTx, actor string) error) error {
	if err := mayLand(g, l.Business, l.Project, l.Task); err != nil {
		return err
	}
	for _, c := range commits {
		if !gitid.Valid(c) {
			return errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "commit %q is not a full hex object id", clip(c))
		}
	}
	actor := g.ID
	if g.Host {
		actor = authz.HostID
	}
	return b.write(ctx, func(ctx context.Context, q *writeTx) error {
		if !g.Host {
			if err := recheck(ctx, q, g, authz.CapTaskLand); err != nil {
				return err
			}
		}
		return fn(ctx, q, actor)
	})
}

// RecordLandRefusal implements authz.Lander.
func (b *Broker) RecordLandRefusal(ctx context.Context, g authz.Grant, l authz.Landing, reason string, peer authz.Peer) (int64, error) {
	var seq int64
	err := b.landWrite(ctx, g, l, []string{l.Approved, l.Old}, func(ctx context.Context, q *writeTx, actor string) error {
		t, err := openTask(ctx, &q.queries, l.Business, l.Project, l.Task, "landings")
		if err != nil {
			return err
		}
		e := Event{Business: t.Business, Project: t.Project, Task: t.Task, Type: TypeTaskLandRefused, Actor: actor, Peer: PeerString(peer, peer != authz.Peer{}),
			Data: mustData(map[string]any{"commit": l.Approved, "main": l.Old, "reason": clip(reason)})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		return nil
	})
	return seq, err
}

// RecordLanding implements authz.Lander.
func (b *Broker) RecordLanding(ctx context.Context, g authz.Grant, l authz.Landing, peer authz.Peer) (int64, error) {
	var seq int64
	err := b.landWrite(ctx, g, l, []string{l.Approved, l.Old, l.New}, func(ctx context.Context, q *writeTx, actor string) error {
		if err := writable(ctx, &q.queries, b.hostID, l.Business, l.Project); err != nil {
			return err
		}
		t, commit, err := landable(ctx, &q.queries, b.keys, l.Business, l.Project, l.Task)
		if err != nil {
			return err
		}
		if commit != l.Approved {
			return errdefs.Aborted(errdefs.RefChanged, "task %s's approved push is now %s, not %s: land again", scopeString(l.Business, l.Project, l.Task), commit, l.Approved).
				With("commit", commit)
		}
		ps := PeerString(peer, peer != authz.Peer{})
		e := Event{Business: t.Business, Project: t.Project, Task: t.Task, Type: TypeTaskLanded, Actor: actor, Peer: ps,
			Data: mustData(map[string]any{"commit": l.Approved, "main_old": l.Old, "main_new": l.New, "merge": l.Merge})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		c := Event{Business: t.Business, Project: t.Project, Task: t.Task, Type: TypeTaskClosed, Actor: actor, Peer: ps,
			Data: mustData(map[string]any{"commit": l.Approved, "landed_seq": e.Seq})}
		if err := appendEvent(ctx, q, &c); err != nil {
			return err
		}
		return q.setClosed(ctx, t, c.Seq)
	})
	return seq, err
}

// Landings implements authz.Lander.
func (b *Broker) Landings(ctx context.Context, business, project string) ([]authz.Landing, error) {
	if _, err := names.ParseProject(business, project); err != nil {
		return nil, err
	}
	evs, err := b.st.read().eventsWhere(ctx, `business = $1 AND project = $2 AND type = $3`, business, project, TypeTaskLanded)
	if err != nil {
		return nil, err
	}
	var out []authz.Landing
	for _, e := range evs {
		var f landingFields
		if err := json.Unmarshal([]byte(e.Data), &f); err != nil {
			return nil, fmt.Errorf("event %d: %w", e.Seq, err)
		}
		out = append(out, authz.Landing{Business: e.Business, Project: e.Project, Task: e.Task, Approved: f.Commit, Old: f.MainOld, New: f.MainNew, Merge: f.Merge})
	}
	return out, nil
}

// ReopenTask (host) reopens a closed task: task.reopened, and it takes
// pushes, reviews and a close or a landing again. A landed task stays
// closed (TASK_LANDED): its work is on main.
func (b *Broker) ReopenTask(ctx context.Context, peer, business, project, task string) (int64, error) {
	if _, err := names.ParseTask(business, project, task); err != nil {
		return 0, err
	}
	var seq int64
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		t, err := q.knownTask(ctx, business, project, task)
		if err != nil {
			return err
		}
		if e, landed, err := q.latestEvent(ctx, business, project, task, TypeTaskLanded, 0); err != nil {
			return err
		} else if landed {
			return errdefs.FailedPrecondition(errdefs.TaskLanded, "task %s landed on main (event %d) and is not reopened: start a new task", scopeString(business, project, task), e.Seq).
				With("seq", e.Seq)
		}
		if t.ClosedSeq == 0 {
			return errdefs.FailedPrecondition(errdefs.TaskNotClosed, "task %s is open: nothing to reopen", scopeString(business, project, task))
		}
		e := Event{Business: business, Project: project, Task: task, Type: TypeTaskReopened, Actor: authz.HostID, Peer: peer,
			Data: mustData(map[string]any{"closed_seq": t.ClosedSeq})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		return q.setClosed(ctx, t, 0)
	})
	return seq, err
}
