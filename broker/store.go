package broker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/metrics"
)

// sqlStore is where the broker keeps its state: the event log and the
// tables derived from it (tasks, grants, review requests, idempotency
// keys), which let every rule decide with a few indexed reads, whatever
// the log's length.
//
// A write transaction holds the store's write lock, which is exclusive
// across every process sharing the database: every rule is checked and its
// event appended inside one, so nothing can interleave between the check and
// the append. The rules live in the broker and only speak to queries; the
// two stores differ only in how they open, lock and migrate (dialect).
type sqlStore struct {
	db *sql.DB
	d  dialect
}

// dialect is what differs between SQLite and PostgreSQL.
type dialect struct {
	name string
	// migrations are applied in order, each once; version = index+1.
	migrations [][]string
	// lock takes the write lock inside tx (a no-op where BEGIN already did).
	lock func(ctx context.Context, tx *sql.Tx) error
	// snapshot are the options of a snapshot's transaction.
	snapshot *sql.TxOptions
	// long, when set, lifts a snapshot's statement bound to the one for a
	// read of the whole log.
	long func(ctx context.Context, tx *sql.Tx) error
}

// read returns queries outside any transaction, for reads that need no
// lock (each statement sees one consistent snapshot).
func (s *sqlStore) read() *queries { return &queries{db: s.db} }

func (s *sqlStore) close() error { return s.db.Close() }

// begin starts a write transaction holding the write lock.
func (s *sqlStore) begin(ctx context.Context) (*writeTx, error) {
	start := time.Now()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: begin: %w", s.d.name, err)
	}
	if err := s.d.lock(ctx, tx); err != nil {
		tx.Rollback()
		return nil, fmt.Errorf("%s: take write lock: %w", s.d.name, err)
	}
	return &writeTx{queries: queries{db: tx}, tx: tx, began: start, locked: time.Now()}, nil
}

// snapshot starts a read-only transaction whose statements all see one
// state of the store, taking no lock a write waits for; whole is for a
// read of the whole log (log verify), whose statements may run long.
func (s *sqlStore) snapshot(ctx context.Context, whole bool) (*readTx, error) {
	tx, err := s.db.BeginTx(ctx, s.d.snapshot)
	if err != nil {
		return nil, fmt.Errorf("%s: begin snapshot: %w", s.d.name, err)
	}
	if whole && s.d.long != nil {
		if err := s.d.long(ctx, tx); err != nil {
			tx.Rollback()
			return nil, fmt.Errorf("%s: begin snapshot: %w", s.d.name, err)
		}
	}
	return &readTx{queries: queries{db: tx}, tx: tx}, nil
}

// readTx is a snapshot: read-only, ended by done (nothing to commit).
type readTx struct {
	queries
	tx *sql.Tx
}

func (r *readTx) done() { r.tx.Rollback() }

// migrate applies the dialect's migrations not yet applied, under the write
// lock, so that several processes starting at once migrate exactly once.
func (s *sqlStore) migrate(ctx context.Context) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.tx.Rollback()
	if _, err := tx.tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var cur int
	if err := tx.tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&cur); err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	if cur > len(s.d.migrations) {
		return fmt.Errorf("migrate: the database is at schema version %d, newer than this broker knows (%d)", cur, len(s.d.migrations))
	}
	for v := cur + 1; v <= len(s.d.migrations); v++ {
		for _, stmt := range s.d.migrations[v-1] {
			if _, err := tx.tx.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migrate to version %d: %w", v, err)
			}
		}
		if _, err := tx.tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)`, v, now()); err != nil {
			return fmt.Errorf("migrate to version %d: %w", v, err)
		}
	}
	return tx.commit()
}

// writeTx is a write transaction. Savepoints let one batch of independent
// operations share a commit (and its fsync) while each still stands or
// falls alone.
type writeTx struct {
	queries
	tx *sql.Tx
	// signer signs each event appended (signing.go); nil in a
	// transaction that appends nothing.
	signer *Signer
	// The log's head as this transaction last appended it: it holds the
	// write lock, so nobody else can move it. Forgotten at a rollback.
	headSeq   int64
	headHash  string
	headKnown bool
	// began and locked time the wait for the write lock and its hold
	// (metrics.WriteLock, once the transaction ends).
	began, locked time.Time
	ended         bool
}

// head is queries.head, remembered across appends of one transaction.
func (w *writeTx) head(ctx context.Context) (int64, string, error) {
	if !w.headKnown {
		seq, hash, err := w.queries.head(ctx)
		if err != nil {
			return 0, "", err
		}
		w.headSeq, w.headHash, w.headKnown = seq, hash, true
	}
	return w.headSeq, w.headHash, nil
}

// insertEvent appends e, which must follow the head.
func (w *writeTx) insertEvent(ctx context.Context, e Event) error {
	w.headKnown = false
	if err := w.queries.insertEvent(ctx, e); err != nil {
		return err
	}
	w.headSeq, w.headHash, w.headKnown = e.Seq, e.Hash, true
	return nil
}

func (w *writeTx) savepoint(ctx context.Context) error {
	return w.exec(ctx, `SAVEPOINT op`)
}

func (w *writeTx) rollbackTo(ctx context.Context) error {
	w.headKnown = false
	return w.exec(ctx, `ROLLBACK TO SAVEPOINT op`)
}

func (w *writeTx) release(ctx context.Context) error {
	return w.exec(ctx, `RELEASE SAVEPOINT op`)
}

func (w *writeTx) commit() error {
	err := w.tx.Commit()
	w.end()
	return err
}

func (w *writeTx) rollback() error {
	err := w.tx.Rollback()
	w.end()
	return err
}

func (w *writeTx) end() {
	if !w.ended {
		w.ended = true
		metrics.WriteLock(w.locked.Sub(w.began), time.Since(w.locked))
	}
}

// dbtx is what a *sql.DB and a *sql.Tx have in common.
type dbtx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// queries is the whole SQL of the broker, written in the subset SQLite and
// PostgreSQL share ($N placeholders, ON CONFLICT DO NOTHING).
type queries struct {
	db dbtx
}

func (q *queries) exec(ctx context.Context, query string, args ...any) error {
	_, err := q.db.ExecContext(ctx, query, args...)
	return err
}

type taskRow struct {
	Business, Project, Task string
	ClosedSeq               int64
	LastPushSeq             int64
	LastPushCommit          string
	LastPushActor           string
	NeedsRepair             string // why the host must repair the task's ref; "" if not
	RepairSeq               int64
}

type grantRow struct {
	ID                      string
	TokenHash               string
	Business, Project, Task string
	Role                    string
	Caps                    []string
	ExpiresAt               int64 // unix nanoseconds
	RevokedSeq              int64
	// Launch is the launch set (JSON, role to capabilities), LaunchedBy
	// and LaunchDepth where the grant stands in a chain of launches.
	Launch      string
	LaunchedBy  string
	LaunchDepth int
	// LaunchBounds is the rest of the launch set (JSON, bounds.Launch;
	// "" for none), read beside Launch.
	LaunchBounds string
}

type requestRow struct {
	ID                      string
	Business, Project, Task string
	PushSeq                 int64
	Commit                  string
	PushActor               string
	RequestSeq              int64
	Verdict                 string
	VerdictSeq              int64
	Reviewer                string
}

func found(err error) (bool, error) {
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// one is a single row as scanned, whether it was found, and the error.
func one[T any](v T, err error) (T, bool, error) {
	ok, err := found(err)
	return v, ok, err
}

func (q *queries) projectExists(ctx context.Context, business, project string) (bool, error) {
	var one int
	return found(q.db.QueryRowContext(ctx, `SELECT 1 FROM projects WHERE business = $1 AND project = $2`, business, project).Scan(&one))
}

func affected(r sql.Result, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	n, err := r.RowsAffected()
	return n > 0, err
}

func (q *queries) task(ctx context.Context, business, project, task string) (taskRow, bool, error) {
	t := taskRow{Business: business, Project: project, Task: task}
	ok, err := found(q.db.QueryRowContext(ctx, `SELECT closed_seq, last_push_seq, last_push_commit, last_push_actor, needs_repair, repair_seq FROM tasks WHERE business = $1 AND project = $2 AND task = $3`,
		business, project, task).Scan(&t.ClosedSeq, &t.LastPushSeq, &t.LastPushCommit, &t.LastPushActor, &t.NeedsRepair, &t.RepairSeq))
	return t, ok, err
}

// knownTask returns the task, refusing an unknown one (TASK_NOT_FOUND).
func (q *queries) knownTask(ctx context.Context, business, project, task string) (taskRow, error) {
	t, ok, err := q.task(ctx, business, project, task)
	if err == nil && !ok {
		err = errdefs.NotFound(errdefs.TaskNotFound, "no task %s", scopeString(business, project, task))
	}
	return t, err
}

func (q *queries) insertTask(ctx context.Context, business, project, task string) (bool, error) {
	r, err := q.db.ExecContext(ctx, `INSERT INTO tasks (business, project, task) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, business, project, task)
	return affected(r, err)
}

func (q *queries) setLastPush(ctx context.Context, t taskRow, seq int64, commit, actor string) error {
	return q.exec(ctx, `UPDATE tasks SET last_push_seq = $1, last_push_commit = $2, last_push_actor = $3 WHERE business = $4 AND project = $5 AND task = $6`,
		seq, commit, actor, t.Business, t.Project, t.Task)
}

func (q *queries) setClosed(ctx context.Context, t taskRow, seq int64) error {
	return q.exec(ctx, `UPDATE tasks SET closed_seq = $1 WHERE business = $2 AND project = $3 AND task = $4`, seq, t.Business, t.Project, t.Task)
}

func (q *queries) lastPushes(ctx context.Context, business, project string) (map[string]string, error) {
	m := map[string]string{}
	err := each(ctx, q, func(s scanner) error {
		var t, c string
		err := s.Scan(&t, &c)
		m[t] = c
		return err
	}, `SELECT task, last_push_commit FROM tasks WHERE business = $1 AND project = $2 AND last_push_seq > 0`, business, project)
	return m, err
}

const grantCols = `id, token_hash, business, project, task, role, caps, expires_at, revoked_seq, launch, launched_by, launch_depth, launch_bounds`

func scanGrant(s scanner) (grantRow, error) {
	var g grantRow
	var caps string
	err := s.Scan(&g.ID, &g.TokenHash, &g.Business, &g.Project, &g.Task, &g.Role, &caps, &g.ExpiresAt, &g.RevokedSeq, &g.Launch, &g.LaunchedBy, &g.LaunchDepth, &g.LaunchBounds)
	if caps != "" {
		g.Caps = strings.Split(caps, ",")
	}
	return g, err
}

func (q *queries) grantByHash(ctx context.Context, hash string) (grantRow, bool, error) {
	return one(scanGrant(q.db.QueryRowContext(ctx, `SELECT `+grantCols+` FROM grants WHERE token_hash = $1`, hash)))
}

func (q *queries) grantByID(ctx context.Context, id string) (grantRow, bool, error) {
	return one(scanGrant(q.db.QueryRowContext(ctx, `SELECT `+grantCols+` FROM grants WHERE id = $1`, id)))
}

func (q *queries) insertGrant(ctx context.Context, g grantRow) error {
	return q.exec(ctx, `INSERT INTO grants (`+grantCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, $9, $10, $11, $12)`,
		g.ID, g.TokenHash, g.Business, g.Project, g.Task, g.Role, strings.Join(g.Caps, ","), g.ExpiresAt, g.Launch, g.LaunchedBy, g.LaunchDepth, g.LaunchBounds)
}

func (q *queries) revokeGrant(ctx context.Context, id string, seq int64) error {
	return q.exec(ctx, `UPDATE grants SET revoked_seq = $1 WHERE id = $2`, seq, id)
}

// head returns the last event's seq and hash (0, "" for an empty log).
func (q *queries) head(ctx context.Context) (int64, string, error) {
	var seq int64
	var hash string
	_, err := found(q.db.QueryRowContext(ctx, `SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1`).Scan(&seq, &hash))
	return seq, hash, err
}

func (q *queries) insertEvent(ctx context.Context, e Event) error {
	return q.exec(ctx, `INSERT INTO events (`+eventCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`,
		e.Seq, e.Business, e.Project, e.Task, e.Type, e.Actor, e.Data, e.Time, e.Peer, e.PrevHash, e.Hash, e.Sig)
}

const eventCols = `seq, business, project, task, type, actor, data, time, peer, prev_hash, hash, sig`

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(...any) error }

// each calls fn with every row query selects, in one statement, until
// fn fails.
func each(ctx context.Context, q *queries, fn func(scanner) error, query string, args ...any) error {
	rows, err := q.db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// all returns every row query selects, each read by scan.
func all[T any](ctx context.Context, q *queries, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	var out []T
	err := each(ctx, q, func(s scanner) error {
		v, err := scan(s)
		out = append(out, v)
		return err
	}, query, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eventsWhere returns the events that where selects, in order.
func (q *queries) eventsWhere(ctx context.Context, where string, args ...any) ([]Event, error) {
	return all(ctx, q, scanEvent, `SELECT `+eventCols+` FROM events WHERE `+where+` ORDER BY seq`, args...)
}

func scanEvent(s scanner) (Event, error) {
	var e Event
	sel := [4]textColumn{{s: &e.Business}, {s: &e.Project}, {s: &e.Task}, {s: &e.Type}}
	if err := s.Scan(&e.Seq, &sel[0], &sel[1], &sel[2], &sel[3], &e.Actor, &e.Data, &e.Time, &e.Peer, &e.PrevHash, &e.Hash, &e.Sig); err != nil {
		return e, err
	}
	for i, c := range sel {
		if c.bytes {
			return e, fmt.Errorf("event %d: its %s is stored as bytes, not text: written straight into the database, it hides the event from every query that selects by it (the gate's); restore the store from a backup, see docs/broker.md, \"Who wrote an event\"",
				e.Seq, [...]string{"business", "project", "task", "type"}[i])
		}
	}
	return e, nil
}

// textColumn scans a column the gate selects events by. SQLite keeps a
// BLOB as written, whatever the column's type, and a BLOB is never equal
// to a TEXT: an event whose type was rewritten as the same bytes in a
// BLOB reads the same (its hash and signature hold) but is hidden from
// the gate's queries (type = ...), as if deleted. So each reader of
// events refuses such a row; log verify, which reads them all, names it.
type textColumn struct {
	s     *string
	bytes bool
}

func (c *textColumn) Scan(v any) error {
	switch v := v.(type) {
	case string:
		*c.s = v
	case []byte:
		*c.s, c.bytes = string(v), true
	default:
		return fmt.Errorf("not text: %T", v)
	}
	return nil
}

func (q *queries) event(ctx context.Context, seq int64) (Event, bool, error) {
	return one(scanEvent(q.db.QueryRowContext(ctx, `SELECT `+eventCols+` FROM events WHERE seq = $1`, seq)))
}

// Filter selects events of one business, project or task ("" matches all).
type Filter struct {
	Business, Project, Task string
	// Still, when set, is asked before every page and every wake-up of
	// Events; its error ends the stream (a grant revoked or expired).
	Still func(ctx context.Context) error
}

// events reads at most limit events after seq after that f selects, and
// stops early once their data passed maxBytes (at least one is read);
// full reports a page cut by either bound, so more may follow.
func (q *queries) events(ctx context.Context, f Filter, after int64, limit int, maxBytes int) (out []Event, full bool, err error) {
	where, args := scopeWhere([]string{`seq > $1`}, []any{after}, f.Business, f.Project, f.Task)
	args = append(args, limit)
	rows, err := q.db.QueryContext(ctx, `SELECT `+eventCols+` FROM events`+where+fmt.Sprintf(` ORDER BY seq LIMIT $%d`, len(args)), args...)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	bytes := 0
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, false, err
		}
		out = append(out, e)
		if bytes += len(e.Data); bytes >= maxBytes {
			return out, true, nil
		}
	}
	return out, len(out) == limit, rows.Err()
}

// eachEvent calls fn for every event in seq order, in one statement (one
// snapshot).
func (q *queries) eachEvent(ctx context.Context, fn func(Event) error) error {
	return each(ctx, q, func(s scanner) error {
		e, err := scanEvent(s)
		if err != nil {
			return err
		}
		return fn(e)
	}, `SELECT `+eventCols+` FROM events ORDER BY seq`)
}

const requestCols = `id, business, project, task, push_seq, commit_id, push_actor, request_seq, verdict, verdict_seq, reviewer`

func scanRequest(s scanner) (r requestRow, err error) {
	err = s.Scan(&r.ID, &r.Business, &r.Project, &r.Task, &r.PushSeq, &r.Commit, &r.PushActor, &r.RequestSeq, &r.Verdict, &r.VerdictSeq, &r.Reviewer)
	return r, err
}

func (q *queries) request(ctx context.Context, id string) (requestRow, bool, error) {
	return one(scanRequest(q.db.QueryRowContext(ctx, `SELECT `+requestCols+` FROM review_requests WHERE id = $1`, id)))
}

func (q *queries) requestForPush(ctx context.Context, t taskRow, pushSeq int64) (requestRow, bool, error) {
	return one(scanRequest(q.db.QueryRowContext(ctx, `SELECT `+requestCols+` FROM review_requests WHERE business = $1 AND project = $2 AND task = $3 AND push_seq = $4`,
		t.Business, t.Project, t.Task, pushSeq)))
}

func (q *queries) insertRequest(ctx context.Context, r requestRow) error {
	return q.exec(ctx, `INSERT INTO review_requests (`+requestCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, '', 0, '')`,
		r.ID, r.Business, r.Project, r.Task, r.PushSeq, r.Commit, r.PushActor, r.RequestSeq)
}

func (q *queries) setVerdict(ctx context.Context, id, verdict string, seq int64, reviewer string) error {
	return q.exec(ctx, `UPDATE review_requests SET verdict = $1, verdict_seq = $2, reviewer = $3 WHERE id = $4`, verdict, seq, reviewer, id)
}

func (q *queries) idempotent(ctx context.Context, actor, key string) (bodyHash string, seq int64, ok bool, err error) {
	ok, err = found(q.db.QueryRowContext(ctx, `SELECT body_hash, seq FROM idempotency WHERE actor = $1 AND key = $2`, actor, key).Scan(&bodyHash, &seq))
	return bodyHash, seq, ok, err
}

func (q *queries) insertIdempotent(ctx context.Context, actor, key, bodyHash string, seq int64) error {
	return q.exec(ctx, `INSERT INTO idempotency (actor, key, body_hash, seq) VALUES ($1, $2, $3, $4)`, actor, key, bodyHash, seq)
}
