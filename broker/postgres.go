package broker

import (
	"context"
	"database/sql"
	"fmt"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// postgresSchema is the schema, one migration per entry. A released
// migration is never edited: a change is a new entry.
var postgresSchema = [][]string{{
	`CREATE TABLE projects (business TEXT NOT NULL, project TEXT NOT NULL, PRIMARY KEY (business, project))`,
	`CREATE TABLE tasks (business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL,
		closed_seq BIGINT NOT NULL DEFAULT 0,
		last_push_seq BIGINT NOT NULL DEFAULT 0, last_push_commit TEXT NOT NULL DEFAULT '', last_push_actor TEXT NOT NULL DEFAULT '',
		PRIMARY KEY (business, project, task))`,
	`CREATE TABLE grants (id TEXT PRIMARY KEY, token_hash TEXT NOT NULL UNIQUE,
		business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL, role TEXT NOT NULL, caps TEXT NOT NULL,
		expires_at BIGINT NOT NULL, revoked_seq BIGINT NOT NULL DEFAULT 0)`,
	`CREATE TABLE events (seq BIGINT PRIMARY KEY, business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL,
		type TEXT NOT NULL, actor TEXT NOT NULL, data TEXT NOT NULL, time TEXT NOT NULL, peer TEXT NOT NULL,
		prev_hash TEXT NOT NULL, hash TEXT NOT NULL)`,
	`CREATE INDEX events_by_task ON events (business, project, task, seq)`,
	`CREATE TABLE review_requests (id TEXT PRIMARY KEY, business TEXT NOT NULL, project TEXT NOT NULL, task TEXT NOT NULL,
		push_seq BIGINT NOT NULL, commit_id TEXT NOT NULL, push_actor TEXT NOT NULL, request_seq BIGINT NOT NULL,
		verdict TEXT NOT NULL, verdict_seq BIGINT NOT NULL, reviewer TEXT NOT NULL,
		UNIQUE (business, project, task, push_seq))`,
	`CREATE TABLE idempotency (actor TEXT NOT NULL, key TEXT NOT NULL, body_hash TEXT NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (actor, key))`,
}, {
	// A task whose ref the host must repair (repair.go): why, and the event.
	`ALTER TABLE tasks ADD COLUMN needs_repair TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE tasks ADD COLUMN repair_seq BIGINT NOT NULL DEFAULT 0`,
}, {
	// The host a project is placed on (placement.go); '' for a project
	// added before placement, claimed by the first host that serves it.
	`ALTER TABLE projects ADD COLUMN host TEXT NOT NULL DEFAULT ''`,
}, {
	// A grant's launch set (JSON, role to capabilities; session.launch),
	// the grant that launched it, and how many launches deep it is.
	`ALTER TABLE grants ADD COLUMN launch TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE grants ADD COLUMN launched_by TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE grants ADD COLUMN launch_depth BIGINT NOT NULL DEFAULT 0`,
}, {
	// A project being moved to another host (move.go): the export's id
	// ('' when not moving), its project.moving event, and the digest of
	// the manifest it wrote, which an import must present.
	`ALTER TABLE projects ADD COLUMN moving_id TEXT NOT NULL DEFAULT ''`,
	`ALTER TABLE projects ADD COLUMN moving_seq BIGINT NOT NULL DEFAULT 0`,
	`ALTER TABLE projects ADD COLUMN moving_digest TEXT NOT NULL DEFAULT ''`,
}, {
	// The appending host's signature of each event's hash (signing.go):
	// "KEYID:BASE64"; '' in a log written before signing.
	`ALTER TABLE events ADD COLUMN sig TEXT NOT NULL DEFAULT ''`,
}}

// writeLockKey, with the schema's name, is the advisory lock every write
// transaction takes: the hash chain is one sequence for the whole log, so
// appends are serialized across all bushostd sharing the schema, and with
// them every rule's check and append. ("bush" in ASCII.)
const writeLockKey int32 = 0x62757368

func openPostgres(ctx context.Context, dsn string) (*sqlStore, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	db.SetMaxOpenConns(16)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := &sqlStore{db: db, d: dialect{
		name:       "postgres",
		migrations: postgresSchema,
		lock: func(ctx context.Context, tx *sql.Tx) error {
			// Released at commit or rollback; READ COMMITTED then shows each
			// statement everything committed before the lock was granted.
			_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))`, writeLockKey)
			return err
		},
	}}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return s, nil
}
