package broker

import (
	"context"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// Task states as listed.
const (
	StateOpen   = "open"
	StateClosed = "closed"
	StateLanded = "landed"
)

// maxListTasks bounds one listing.
const maxListTasks = 10000

// TaskInfo is one task as `task list` shows it.
type TaskInfo struct {
	Business, Project, Task string
	State                   string
	LastPushCommit          string
	LastPushSeq             int64
	LandedSeq               int64
}

// ListTasks lists the tasks matching the filters ("" for any), at most
// maxListTasks, ordered by business, project, task. A grant sees its own
// task only, whatever the filters say.
func (b *Broker) ListTasks(ctx context.Context, g authz.Grant, business, project, state string) ([]TaskInfo, error) {
	for _, n := range [][2]string{{"business", business}, {"project", project}} {
		if n[1] == "" {
			continue
		}
		if err := names.Check(n[0], n[1]); err != nil {
			return nil, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err)
		}
	}
	switch state {
	case "", StateOpen, StateClosed, StateLanded:
	default:
		return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "state %q: open, closed or landed", clip(state))
	}
	q := b.st.read()
	landed := map[string]int64{}
	rows, err := q.db.QueryContext(ctx, `SELECT business, project, task, seq FROM events WHERE type = $1`, TypeTaskLanded)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var bb, p, t string
		var seq int64
		if err := rows.Scan(&bb, &p, &t, &seq); err != nil {
			rows.Close()
			return nil, err
		}
		landed[scopeString(bb, p, t)] = seq
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = q.db.QueryContext(ctx, `SELECT business, project, task, closed_seq, last_push_seq, last_push_commit FROM tasks ORDER BY business, project, task`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []TaskInfo
	for rows.Next() {
		var t TaskInfo
		var closed int64
		if err := rows.Scan(&t.Business, &t.Project, &t.Task, &closed, &t.LastPushSeq, &t.LastPushCommit); err != nil {
			return nil, err
		}
		if !g.Host && (t.Business != g.Business || t.Project != g.Project || t.Task != g.Task) {
			continue
		}
		if business != "" && t.Business != business || project != "" && t.Project != project {
			continue
		}
		t.LandedSeq = landed[scopeString(t.Business, t.Project, t.Task)]
		switch {
		case t.LandedSeq != 0:
			t.State = StateLanded
		case closed != 0:
			t.State = StateClosed
		default:
			t.State = StateOpen
		}
		if state != "" && t.State != state {
			continue
		}
		if len(out) == maxListTasks {
			return nil, errdefs.ResourceExhausted(errdefs.TaskListTooLong, "more than %d tasks match: give --business, --project or --state", maxListTasks).With("limit", maxListTasks)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}
