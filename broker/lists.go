package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/bounds"
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
	if err := names.CheckFilter("business", business, "project", project); err != nil {
		return nil, err
	}
	switch state {
	case "", StateOpen, StateClosed, StateLanded:
	default:
		return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "state %q: open, closed or landed", clip(state))
	}
	// A grant's listing reads its own task's rows only, whatever the
	// store holds: what it costs does not grow with other tasks.
	task := ""
	if !g.Host {
		if business != "" && business != g.Business || project != "" && project != g.Project {
			return nil, nil
		}
		business, project, task = g.Business, g.Project, g.Task
	}
	tx, err := b.st.snapshot(ctx, false)
	if err != nil {
		return nil, err
	}
	defer tx.done()
	q := &tx.queries
	landed := map[string]int64{}
	lwhere, largs := scopeWhere([]string{"type = $1"}, []any{TypeTaskLanded}, business, project, task)
	err = each(ctx, q, func(s scanner) error {
		var bb, p, t string
		var seq int64
		err := s.Scan(&bb, &p, &t, &seq)
		landed[scopeString(bb, p, t)] = seq
		return err
	}, `SELECT business, project, task, seq FROM events`+lwhere, largs...)
	if err != nil {
		return nil, err
	}
	where, args := scopeWhere(nil, nil, business, project, task)
	var out []TaskInfo
	err = each(ctx, q, func(s scanner) error {
		var t TaskInfo
		var closed int64
		if err := s.Scan(&t.Business, &t.Project, &t.Task, &closed, &t.LastPushSeq, &t.LastPushCommit); err != nil {
			return err
		}
		if !g.Host && (t.Business != g.Business || t.Project != g.Project || t.Task != g.Task) {
			return nil
		}
		if business != "" && t.Business != business || project != "" && t.Project != project {
			return nil
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
			return nil
		}
		if len(out) == maxListTasks {
			return errdefs.ResourceExhausted(errdefs.TaskListTooLong, "more than %d tasks match: give --business, --project or --state", maxListTasks).With("limit", maxListTasks)
		}
		out = append(out, t)
		return nil
	}, `SELECT business, project, task, closed_seq, last_push_seq, last_push_commit FROM tasks`+where+` ORDER BY business, project, task`, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// scopeWhere is the SQL WHERE clause ("" for none) of conds, whose
// arguments are args, and of the conditions selecting the rows of
// business, project and task ("" for any); and args with theirs appended.
func scopeWhere(conds []string, args []any, business, project, task string) (string, []any) {
	for _, c := range []struct{ col, val string }{{"business", business}, {"project", project}, {"task", task}} {
		if c.val != "" {
			args = append(args, c.val)
			conds = append(conds, fmt.Sprintf("%s = $%d", c.col, len(args)))
		}
	}
	if len(conds) == 0 {
		return "", args
	}
	return ` WHERE ` + strings.Join(conds, " AND "), args
}

// maxListProjects and maxListGrants bound one listing.
const (
	maxListProjects = 10000
	// A grant's listing carries its launch set (up to maxLaunchRoles
	// roles): 1000 of the largest fit the client's 4 MiB
	// (TestAttackListsAtTheirBoundsFitTheClient).
	maxListGrants = 1000
)

// ProjectInfo is one project as `project list` shows it.
type ProjectInfo struct {
	Business, Project string
	// Host is the bus host the project is placed on (placement.go), ""
	// for a project registered before placement that no host claimed yet.
	Host string
	// Moving says the project was exported from Host and awaits its
	// import on another host (move.go).
	Moving bool
	// Here says whether the answering host's ReposDir holds the project's
	// repositories; SizeBytes is their size there (0 when not Here, and
	// for a grant: the size would tell it of its project's other tasks).
	Here      bool
	SizeBytes int64
	Tasks     int64
	// The project's latest push over all its tasks (zero values for none).
	LastPushCommit, LastPushTask, LastPushTime string
	LastPushSeq                                int64
}

// ListProjects lists the projects of business ("" for every business),
// ordered by business and project, with their placement, the size of
// their repositories on this host and their latest push. A grant sees its
// own project only, with its own task's count and latest push and no size.
func (b *Broker) ListProjects(ctx context.Context, g authz.Grant, business string) ([]ProjectInfo, error) {
	if err := names.CheckFilter("business", business); err != nil {
		return nil, err
	}
	out, err := b.listProjects(ctx, g, business)
	if err != nil {
		return nil, err
	}
	// The sizes are walked after the snapshot ended: a walk of a large
	// project must not hold a transaction open.
	for i := range out {
		p := &out[i]
		// A session is told where its project is but not its size: the
		// size sums every task's repository, so it would show the
		// project's other tasks' pushes and their sizes, and the walk
		// costs the daemon the project's whole tree at each call.
		size, here, err := projectSize(b.reposDir, p.Business, p.Project, g.Host)
		if err != nil {
			return nil, fmt.Errorf("size of %s/%s: %w", p.Business, p.Project, err)
		}
		p.Here, p.SizeBytes = here, size
	}
	return out, nil
}

// listProjects reads ListProjects' rows from one snapshot of the store.
func (b *Broker) listProjects(ctx context.Context, g authz.Grant, business string) ([]ProjectInfo, error) {
	tx, err := b.st.snapshot(ctx, false)
	if err != nil {
		return nil, err
	}
	defer tx.done()
	q := &tx.queries
	type pushOf struct {
		tasks  int64
		seq    int64
		commit string
		task   string
	}
	pushes := map[string]*pushOf{}
	// A grant reads its own task's and project's rows only.
	var taskWhere, projWhere string
	var taskArgs, projArgs []any
	if !g.Host {
		if business != "" && business != g.Business {
			return nil, nil
		}
		taskWhere, taskArgs = scopeWhere(nil, nil, g.Business, g.Project, g.Task)
		projWhere, projArgs = scopeWhere(nil, nil, g.Business, g.Project, "")
	} else {
		taskWhere, taskArgs = scopeWhere(nil, nil, business, "", "")
		projWhere, projArgs = taskWhere, taskArgs
	}
	err = each(ctx, q, func(s scanner) error {
		var bb, p, t, c string
		var seq int64
		if err := s.Scan(&bb, &p, &t, &seq, &c); err != nil {
			return err
		}
		if !g.Host && (bb != g.Business || p != g.Project || t != g.Task) {
			// A session learns nothing of its project's other tasks.
			return nil
		}
		k := bb + "/" + p
		po := pushes[k]
		if po == nil {
			po = &pushOf{}
			pushes[k] = po
		}
		po.tasks++
		if seq > po.seq {
			po.seq, po.commit, po.task = seq, c, t
		}
		return nil
	}, `SELECT business, project, task, last_push_seq, last_push_commit FROM tasks`+taskWhere, taskArgs...)
	if err != nil {
		return nil, err
	}
	var out []ProjectInfo
	err = each(ctx, q, func(s scanner) error {
		var p ProjectInfo
		var moving string
		if err := s.Scan(&p.Business, &p.Project, &p.Host, &moving); err != nil {
			return err
		}
		p.Moving = moving != ""
		if !g.Host && (p.Business != g.Business || p.Project != g.Project) || business != "" && p.Business != business {
			return nil
		}
		if len(out) == maxListProjects {
			return errdefs.ResourceExhausted(errdefs.ProjectListTooLong, "more than %d projects match: give --business", maxListProjects).With("limit", maxListProjects)
		}
		if po := pushes[p.Business+"/"+p.Project]; po != nil {
			p.Tasks, p.LastPushSeq, p.LastPushCommit, p.LastPushTask = po.tasks, po.seq, po.commit, po.task
		}
		out = append(out, p)
		return nil
	}, `SELECT business, project, host, moving_id FROM projects`+projWhere+` ORDER BY business, project`, projArgs...)
	if err != nil {
		return nil, err
	}
	for i := range out {
		p := &out[i]
		if p.LastPushSeq != 0 {
			if _, err := found(q.db.QueryRowContext(ctx, `SELECT time FROM events WHERE seq = $1`, p.LastPushSeq).Scan(&p.LastPushTime)); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// projectSize sums the regular files under a project's repositories in
// reposDir: the single repository <business>/<project>.git and the
// directory <business>/<project>/ (its pool and task repositories), both
// when both are there (a home between layouts). Links are not followed;
// a file removed while it is read (a repack) counts as gone. here says
// whether either exists; without sum, only that is looked at (size 0).
func projectSize(reposDir, business, project string, sum bool) (size int64, here bool, err error) {
	if reposDir == "" {
		return 0, false, nil
	}
	for _, root := range []string{
		filepath.Join(reposDir, business, project+".git"),
		filepath.Join(reposDir, business, project),
	} {
		if fi, err := os.Lstat(root); err != nil || !fi.IsDir() {
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return 0, false, err
			}
			continue
		}
		here = true
		if !sum {
			continue
		}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				var fi fs.FileInfo
				if fi, err = d.Info(); err == nil {
					size += fi.Size()
				}
			}
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		})
		if err != nil {
			return 0, false, err
		}
	}
	return size, here, nil
}

// GrantInfo is one grant as `grant list` shows it: never its token or the
// token's hash.
type GrantInfo struct {
	ID                      string
	Business, Project, Task string
	Role                    string
	Caps                    []string
	ExpiresAt               time.Time
	Expired                 bool
	RevokedSeq              int64
	// Launch is what a grant with session.launch may launch (role to
	// capabilities); LaunchedBy and LaunchDepth place it in a chain of
	// launches.
	Launch       map[string][]string
	LaunchedBy   string
	LaunchDepth  int
	LaunchBounds bounds.Launch
}

// ListGrants lists the grants matching the filters ("" for any), ordered
// by business, project, task and id. A grant sees the grants of its own
// task only: a filter naming another is refused (OTHER_TASK).
func (b *Broker) ListGrants(ctx context.Context, g authz.Grant, business, project, task string) ([]GrantInfo, error) {
	if err := names.CheckFilter("business", business, "project", project, "task", task); err != nil {
		return nil, err
	}
	if !g.Host {
		for _, c := range [][2]string{{business, g.Business}, {project, g.Project}, {task, g.Task}} {
			if c[0] != "" && c[0] != c[1] {
				return nil, errdefs.PermissionDenied(errdefs.OtherTask, "grant %s sees only the grants of task %s", g.ID, scopeString(g.Business, g.Project, g.Task))
			}
		}
		business, project, task = g.Business, g.Project, g.Task
	}
	where, args := scopeWhere(nil, nil, business, project, task)
	args = append(args, maxListGrants+1)
	tx, err := b.st.snapshot(ctx, false)
	if err != nil {
		return nil, err
	}
	defer tx.done()
	rows, err := all(ctx, &tx.queries, scanGrant, `SELECT `+grantCols+` FROM grants`+where+fmt.Sprintf(` ORDER BY business, project, task, id LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var out []GrantInfo
	for _, r := range rows {
		gi := GrantInfo{ID: r.ID, Business: r.Business, Project: r.Project, Task: r.Task, Role: r.Role, Caps: r.Caps,
			ExpiresAt: time.Unix(0, r.ExpiresAt).UTC(), Expired: now.UnixNano() >= r.ExpiresAt, RevokedSeq: r.RevokedSeq,
			LaunchedBy: r.LaunchedBy, LaunchDepth: r.LaunchDepth, LaunchBounds: ParseLaunchBounds(r.LaunchBounds)}
		if r.Launch != "" {
			if err := json.Unmarshal([]byte(r.Launch), &gi.Launch); err != nil {
				return nil, fmt.Errorf("grant %s: launch set: %w", gi.ID, err)
			}
		}
		if len(out) == maxListGrants {
			return nil, errdefs.ResourceExhausted(errdefs.GrantListTooLong, "more than %d grants match: give --business, --project or --task", maxListGrants).With("limit", maxListGrants)
		}
		out = append(out, gi)
	}
	return out, nil
}
