package broker

import (
	"context"
	"fmt"
	"time"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// Moving a project between bus hosts sharing the store (docs/scaling.md,
// "Moving a project"). Hosts share only the database, so the repositories
// travel in a file the operator carries; the store holds the move's state,
// so that every host agrees on it:
//
//	placed on A ──BeginExport (A)──▶ moving from A ──CompleteImport (B)──▶ placed on B
//	                                      │
//	                                      └──CancelExport (A)──▶ placed on A
//
// BeginExport appends project.moving, whose seq and hash are the log's
// head the export names, and sets projects.moving_id; SealExport records
// the digest of the manifest written; CompleteImport checks the file's
// claim (same export, same digest, no event of the project after the
// head) and moves the placement in the transaction that clears the state
// and appends project.moved. While a project moves, every write that
// changes its repositories (a push, a landing, a sync, a repair) is
// refused with PROJECT_MOVING, in the transaction that would record it.

var _ authz.Mover = (*Broker)(nil)

// Event types of a move, appended with actor "host".
const (
	TypeProjectMoving        = "project.moving"
	TypeProjectMoved         = "project.moved"
	TypeProjectMoveCancelled = "project.move_cancelled"
)

// projectRow is a project's placement and move state.
type projectRow struct {
	Host         string
	MovingID     string // "" when not moving
	MovingSeq    int64  // the project.moving event
	MovingDigest string // the manifest's digest, once sealed
}

func (q *queries) project(ctx context.Context, business, project string) (projectRow, bool, error) {
	var r projectRow
	ok, err := found(q.db.QueryRowContext(ctx, `SELECT host, moving_id, moving_seq, moving_digest FROM projects WHERE business = $1 AND project = $2`,
		business, project).Scan(&r.Host, &r.MovingID, &r.MovingSeq, &r.MovingDigest))
	return r, ok, err
}

// setPlacement places business/project on host, moving by the export id
// appended at event seq, or not moving (id "").
func (q *queries) setPlacement(ctx context.Context, business, project, host, id string, seq int64) error {
	return q.exec(ctx, `UPDATE projects SET host = $1, moving_id = $2, moving_seq = $3, moving_digest = '' WHERE business = $4 AND project = $5`,
		host, id, seq, business, project)
}

// ownProject is business/project's row, refused unless it exists and is
// placed on hostID (or nowhere yet).
func (q *queries) ownProject(ctx context.Context, hostID, business, project string) (projectRow, error) {
	r, ok, err := q.project(ctx, business, project)
	if err != nil {
		return r, err
	}
	if !ok {
		return r, errdefs.NotFound(errdefs.ProjectNotFound, "project %s/%s was never added", business, project)
	}
	if r.Host != "" && r.Host != hostID {
		return r, onOtherHost(business, project, r.Host)
	}
	return r, nil
}

// writable refuses a write that changes business/project's repositories
// unless the project is placed on hostID (or not placed yet) and not
// moving. Called inside the write's transaction, it decides with the
// store's state at the append, whatever a cache said before.
func writable(ctx context.Context, q *queries, hostID, business, project string) error {
	r, ok, err := q.project(ctx, business, project)
	if err != nil || !ok {
		return err
	}
	if r.Host != "" && r.Host != hostID {
		return onOtherHost(business, project, r.Host)
	}
	if r.MovingID != "" {
		return projectMoving(business, project, r)
	}
	return nil
}

func projectMoving(business, project string, r projectRow) error {
	return errdefs.Unavailable(errdefs.ProjectMoving,
		"project %s/%s is moving to another bus host (exported on %q, event %d): it takes no pushes, landings or syncs until it is imported there ('bushost project import'), then use that host; or the owner cancels the export ('bushost project export --cancel')",
		business, project, r.Host, r.MovingSeq).
		With("project", business+"/"+project).With("host", r.Host).With("export_id", r.MovingID).With("seq", r.MovingSeq).
		Retry(time.Minute)
}

// NotMoving implements authz.Mover.
func (b *Broker) NotMoving(ctx context.Context, business, project string) error {
	if _, err := names.ParseProject(business, project); err != nil {
		return err
	}
	return writable(ctx, b.st.read(), b.hostID, business, project)
}

// BeginExport implements authz.Mover: on the owner, it marks the project
// moving and appends project.moving, whose seq and hash are the head the
// export names; it returns the project's tasks as the log has them then.
// A task marked TASK_NEEDS_REPAIR is refused: the host repairs it first.
func (b *Broker) BeginExport(ctx context.Context, business, project, id string) (authz.Export, error) {
	if _, err := names.ParseProject(business, project); err != nil {
		return authz.Export{}, err
	}
	if !authz.ValidExportID(id) {
		return authz.Export{}, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "export id %q is not one authz.NewExportID makes", clip(id))
	}
	ex := authz.Export{ID: id, Host: b.hostID}
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		r, err := q.ownProject(ctx, b.hostID, business, project)
		if err != nil {
			return err
		}
		ex.Tasks, err = q.exportTasks(ctx, business, project)
		if err != nil {
			return err
		}
		data := map[string]any{"export_id": ex.ID, "from": b.hostID}
		if r.MovingID != "" {
			data["replaces"] = r.MovingID
		}
		e := Event{Business: business, Project: project, Type: TypeProjectMoving, Actor: authz.HostID, Data: mustData(data)}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		ex.HeadSeq, ex.HeadHash = e.Seq, e.Hash
		return q.setPlacement(ctx, business, project, b.hostID, ex.ID, e.Seq)
	})
	// Whatever the outcome, this host no longer answers placement from
	// its cache: a moving project may leave it.
	b.forgetPlacement(business, project)
	if err != nil {
		return authz.Export{}, err
	}
	return ex, nil
}

// exportTasks lists business/project's tasks with their latest push,
// refusing if one needs the host's repair.
func (q *queries) exportTasks(ctx context.Context, business, project string) ([]authz.ExportTask, error) {
	return all(ctx, q, func(s scanner) (t authz.ExportTask, err error) {
		var closed int64
		var repair string
		if err := s.Scan(&t.Task, &t.Commit, &closed, &repair); err != nil {
			return t, err
		}
		if repair != "" {
			return t, errdefs.FailedPrecondition(errdefs.TaskNeedsRepair,
				"task %s needs the host's repair before its project can move (%s): run 'bushost task repair --business %s --project %s --task %s'",
				scopeString(business, project, t.Task), repair, business, project, t.Task).With("task", scopeString(business, project, t.Task))
		}
		t.Closed = closed != 0
		return t, nil
	}, `SELECT task, last_push_commit, closed_seq, needs_repair FROM tasks WHERE business = $1 AND project = $2 ORDER BY task`, business, project)
}

// SealExport implements authz.Mover.
func (b *Broker) SealExport(ctx context.Context, business, project, id, digest string) error {
	if _, err := names.ParseProject(business, project); err != nil {
		return err
	}
	return b.write(ctx, func(ctx context.Context, q *writeTx) error {
		r, ok, err := q.project(ctx, business, project)
		if err != nil {
			return err
		}
		if !ok || r.Host != b.hostID || r.MovingID != id {
			return errdefs.FailedPrecondition(errdefs.ExportStale, "export %s of %s/%s was cancelled or replaced while it was written", id, business, project)
		}
		return q.exec(ctx, `UPDATE projects SET moving_digest = $1 WHERE business = $2 AND project = $3`, digest, business, project)
	})
}

// CancelExport implements authz.Mover.
func (b *Broker) CancelExport(ctx context.Context, business, project, id string) (int64, error) {
	if _, err := names.ParseProject(business, project); err != nil {
		return 0, err
	}
	var seq int64
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		r, err := q.ownProject(ctx, b.hostID, business, project)
		if err != nil {
			return err
		}
		if r.MovingID == "" || id != "" && r.MovingID != id {
			return nil
		}
		e := Event{Business: business, Project: project, Type: TypeProjectMoveCancelled, Actor: authz.HostID,
			Data: mustData(map[string]any{"export_id": r.MovingID, "host": b.hostID, "moving_seq": r.MovingSeq})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		return q.setPlacement(ctx, business, project, r.Host, "", 0)
	})
	return seq, err
}

// CheckImport implements authz.Mover.
func (b *Broker) CheckImport(ctx context.Context, c authz.ImportClaim) error {
	if _, err := names.ParseProject(c.Business, c.Project); err != nil {
		return err
	}
	_, err := b.checkClaim(ctx, b.st.read(), c)
	return err
}

// CompleteImport implements authz.Mover.
func (b *Broker) CompleteImport(ctx context.Context, c authz.ImportClaim) (int64, error) {
	if _, err := names.ParseProject(c.Business, c.Project); err != nil {
		return 0, err
	}
	var seq int64
	err := b.write(ctx, func(ctx context.Context, q *writeTx) error {
		r, err := b.checkClaim(ctx, &q.queries, c)
		if err != nil {
			return err
		}
		e := Event{Business: c.Business, Project: c.Project, Type: TypeProjectMoved, Actor: authz.HostID,
			Data: mustData(map[string]any{"export_id": c.ID, "from": r.Host, "to": b.hostID, "moving_seq": r.MovingSeq})}
		if err := appendEvent(ctx, q, &e); err != nil {
			return err
		}
		seq = e.Seq
		return q.setPlacement(ctx, c.Business, c.Project, b.hostID, "", 0)
	})
	b.forgetPlacement(c.Business, c.Project)
	return seq, err
}

// checkClaim refuses an import of c unless the store says c's project is
// moving from c.From by export c.ID, with c's head and manifest digest,
// and nothing was appended for the project since: EXPORT_STALE when the
// store moved on (the file is not the current export), EXPORT_ALTERED when
// the file disagrees with what its own export recorded.
func (b *Broker) checkClaim(ctx context.Context, q *queries, c authz.ImportClaim) (projectRow, error) {
	scope := c.Business + "/" + c.Project
	stale := func(format string, a ...any) *errdefs.Error {
		return errdefs.FailedPrecondition(errdefs.ExportStale, "import of %s: "+format, append([]any{scope}, a...)...).
			With("project", scope).With("export_id", c.ID)
	}
	altered := func(format string, a ...any) *errdefs.Error {
		return errdefs.InvalidArgument(errdefs.ExportAltered, "import of %s: "+format, append([]any{scope}, a...)...).
			With("project", scope).With("export_id", c.ID)
	}
	if c.From == b.hostID {
		return projectRow{}, stale("the file was exported by this host (%q): a project is imported on another host; to keep it here, cancel the export with 'bushost project export --cancel'", c.From)
	}
	r, ok, err := q.project(ctx, c.Business, c.Project)
	if err != nil {
		return r, err
	}
	switch {
	case !ok:
		return r, stale("the store has no such project: the file comes from another fleet's log")
	case r.Host == b.hostID && r.MovingID == "":
		return r, stale("the project is already placed on this host (imported before?)")
	case r.Host != c.From:
		return r, stale("the project is placed on %q, not on %q, which exported the file", r.Host, c.From).With("host", r.Host)
	case r.MovingID == "":
		return r, stale("the project is not moving: its export was cancelled, or it was imported and moved back")
	case r.MovingID != c.ID:
		return r, stale("the project was exported again since this file (its current export is the project.moving event %d): import the newer file", r.MovingSeq).With("seq", r.MovingSeq)
	case r.MovingSeq != c.HeadSeq:
		return r, altered("the file names the log's head %d, but its export was recorded at event %d", c.HeadSeq, r.MovingSeq)
	case r.MovingDigest == "":
		return r, stale("its export did not finish writing the file: export again")
	case r.MovingDigest != c.Digest:
		return r, altered("the manifest's sha256 %s is not the %s recorded at export", c.Digest, r.MovingDigest)
	}
	e, ok, err := q.event(ctx, c.HeadSeq)
	if err != nil {
		return r, err
	}
	if !ok || e.Hash != c.HeadHash || e.Type != TypeProjectMoving {
		return r, altered("the log's event %d is not the head the file names (hash %.12s)", c.HeadSeq, c.HeadHash)
	}
	var next int64
	var typ string
	ok, err = found(q.db.QueryRowContext(ctx, `SELECT seq, type FROM events WHERE seq > $1 AND business = $2 AND project = $3 ORDER BY seq LIMIT 1`,
		c.HeadSeq, c.Business, c.Project).Scan(&next, &typ))
	if err != nil {
		return r, fmt.Errorf("read the project's events after %d: %w", c.HeadSeq, err)
	}
	if ok {
		return r, stale("the log moved past the file's head (event %d): event %d (%s) was recorded for the project since; export again", c.HeadSeq, next, typ).
			With("seq", next).With("type", typ)
	}
	return r, nil
}
