package broker

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // the embedded store: pure Go, no cgo
)

// sqliteSchema is the schema, one migration per entry. A released
// migration is never edited: a change is a new entry.
var sqliteSchema = [][]string{{
	`CREATE TABLE projects (business TEXT NOT NULL, project TEXT NOT NULL, PRIMARY KEY (business, project))`,
	`CREATE TABLE tasks (business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL,
		closed_seq INTEGER NOT NULL DEFAULT 0,
		last_push_seq INTEGER NOT NULL DEFAULT 0, last_push_commit TEXT NOT NULL DEFAULT '', last_push_actor TEXT NOT NULL DEFAULT '',
		PRIMARY KEY (business, project, task))`,
	`CREATE TABLE grants (id TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE,
		business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL, role TEXT NOT NULL, caps TEXT NOT NULL,
		expires_at INTEGER NOT NULL, revoked_seq INTEGER NOT NULL DEFAULT 0)`,
	// seq is the rowid: appends go to the end of the table's b-tree.
	`CREATE TABLE events (seq INTEGER PRIMARY KEY, business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL,
		type TEXT NOT NULL, actor TEXT NOT NULL, data TEXT NOT NULL, time TEXT NOT NULL, peer TEXT NOT NULL,
		prev_hash TEXT NOT NULL, hash TEXT NOT NULL)`,
	`CREATE INDEX events_by_task ON events (business, project, task, seq)`,
	`CREATE TABLE review_requests (id TEXT PRIMARY KEY, business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL,
		push_seq INTEGER NOT NULL, commit_id TEXT NOT NULL, push_actor TEXT NOT NULL, request_seq INTEGER NOT NULL,
		verdict TEXT NOT NULL, verdict_seq INTEGER NOT NULL, reviewer TEXT NOT NULL,
		UNIQUE (business, project, task, push_seq))`,
	`CREATE TABLE idempotency (actor TEXT NOT NULL, key TEXT NOT NULL, body_hash TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (actor, key))`,
}, {
	// A task whose ref the host must repair (repair.go): why, and the event.
	`ALTER TABLE tasks ADD COLUMN needs_repair TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE tasks ADD COLUMN repair_seq INTEGER NOT NULL DEFAULT 0`,
}, {
	// The host a project is placed on (placement.go); '' for a project
	// added before placement, claimed by the first host that serves it.
	`ALTER TABLE projects ADD COLUMN host TEXT NOT NULL DEFAULT ''`,
}, {
	// A grant's launch set (JSON, role to capabilities; session.launch),
	// the grant that launched it, and how many launches deep it is.
	`ALTER TABLE grants ADD COLUMN launch TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE grants ADD COLUMN launched_by TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE grants ADD COLUMN launch_depth INTEGER NOT NULL DEFAULT 0`,
}, {
	// A project being moved to another host (move.go): the export's id
	// ('' when not moving), its project.moving event, and the digest of
	// the manifest it wrote, which an import must present.
	`ALTER TABLE projects ADD COLUMN moving_id TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE projects ADD COLUMN moving_seq INTEGER NOT NULL DEFAULT 0`,
	`ALTER TABLE projects ADD COLUMN moving_digest TEXT NOT NULL DEFAULT ''`,
}, {
	// What else a launch set bounds (JSON, bounds.Launch; session.launch):
	// network modes, limit ceilings, tasks, egress.
	`ALTER TABLE grants ADD COLUMN launch_bounds TEXT NOT NULL DEFAULT ''`,
}, {
	// The per-grant quotas of RecordEvent (quota.go), kept with the log so
	// that they hold across every host sharing the store: what is left of
	// a grant's minute of events and bytes, per kind, as of at (unix ns).
	`CREATE TABLE quota_buckets (grant_id TEXT NOT NULL, kind TEXT NOT NULL,
		events REAL NOT NULL, bytes REAL NOT NULL, at INTEGER NOT NULL, PRIMARY KEY (grant_id, kind))`,
}, {
	// The appending host's signature of each event's hash (signing.go):
	// "KEYID:BASE64"; '' in a log written before signing.
	`ALTER TABLE events ADD COLUMN sig TEXT NOT NULL DEFAULT ''`,
}}

// sqliteDSN is the driver's DSN for the database file at path: WAL so
// readers never block the writer, synchronous=FULL so a commit is on disk
// when it returns, a busy timeout for a second process (or a test) holding
// the lock, and BEGIN IMMEDIATE so that every write transaction takes the
// write lock before its first read (its checks see the state it appends to).
func sqliteDSN(path string) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "foreign_keys(ON)")
	q.Set("_txlock", "immediate")
	return "file:" + path + "?" + q.Encode()
}

func openSQLite(ctx context.Context, path string) (*sqlStore, error) {
	if dir := filepath.Dir(path); dir != "" {
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("sqlite %s: %w", path, err)
		}
	}
	db, err := sql.Open("sqlite", sqliteDSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	s := &sqlStore{db: db, d: dialect{
		name:       "sqlite",
		migrations: sqliteSchema,
		lock:       func(context.Context, *sql.Tx) error { return nil },
		// A deferred BEGIN (not the DSN's IMMEDIATE): under WAL, its first
		// read fixes the snapshot, and it never takes the write lock.
		snapshot: &sql.TxOptions{ReadOnly: true},
	}}
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	if mode != "wal" {
		db.Close()
		return nil, fmt.Errorf("sqlite %s: journal mode is %q, want wal", path, mode)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite %s: %w", path, err)
	}
	// The database holds token hashes: keep it to its owner.
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(f, 0o600); err != nil && !os.IsNotExist(err) {
			db.Close()
			return nil, fmt.Errorf("sqlite %s: %w", f, err)
		}
	}
	return s, nil
}
