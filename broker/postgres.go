package broker

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"golang.org/x/sys/unix"
)

// postgresSchema is the schema, one migration per entry; SQLite's
// (sqliteSchema) is the same in its own types. A released migration is
// never edited: a change is a new entry.
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
	// What else a launch set bounds (JSON, bounds.Launch; session.launch):
	// network modes, limit ceilings, tasks, egress.
	`ALTER TABLE grants ADD COLUMN launch_bounds TEXT NOT NULL DEFAULT ''`,
}, {
	// The per-grant quotas of RecordEvent (quota.go), kept with the log so
	// that they hold across every host sharing the store: what is left of
	// a grant's minute of events and bytes, per kind, as of at (unix ns).
	`CREATE TABLE quota_buckets (grant_id TEXT NOT NULL, kind TEXT NOT NULL,
		events DOUBLE PRECISION NOT NULL, bytes DOUBLE PRECISION NOT NULL, at BIGINT NOT NULL, PRIMARY KEY (grant_id, kind))`,
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

// PostgresOptions bound what one host's connections may hold of a
// PostgreSQL shared by several: a host frozen, partitioned or slow must not
// hold the fleet's write lock, or a snapshot, for longer than these.
// Zero means the default.
type PostgresOptions struct {
	// IdleInTransaction ends a session that sits in a transaction without
	// a statement running this long (idle_in_transaction_session_timeout):
	// the server then rolls the transaction back and frees its locks, the
	// fleet's write lock among them. A frozen host (SIGSTOP, a VM paused)
	// holds the lock at most this long.
	IdleInTransaction time.Duration
	// LockTimeout bounds a wait for a lock (lock_timeout), the write lock
	// first: longer than IdleInTransaction, so that a write waiting on a
	// frozen host outlasts it and proceeds.
	LockTimeout time.Duration
	// StatementTimeout bounds one statement (statement_timeout) of a write
	// or a read; a snapshot of the whole log (log verify) has VerifyTimeout.
	StatementTimeout time.Duration
	// VerifyTimeout bounds each statement of a whole-log snapshot (log
	// verify reads every event in one statement).
	VerifyTimeout time.Duration
	// Keepalive, when the DSN names a TCP host, starts TCP keepalive
	// probes after this much silence, both ways (the client's socket and
	// the server's tcp_keepalives_*), every Keepalive/3, three of them; a
	// peer that answers none, or a send unacknowledged for 2×Keepalive
	// (TCP_USER_TIMEOUT), ends the connection. A Unix socket needs none.
	Keepalive time.Duration
	// ConnectTimeout bounds making a connection, unless the DSN's
	// connect_timeout says otherwise.
	ConnectTimeout time.Duration
}

// Defaults of PostgresOptions.
const (
	DefaultIdleInTransaction = 5 * time.Second
	DefaultLockTimeout       = 15 * time.Second
	DefaultStatementTimeout  = 30 * time.Second
	DefaultVerifyTimeout     = 30 * time.Minute
	DefaultKeepalive         = 15 * time.Second
	DefaultConnectTimeout    = 10 * time.Second
)

func (o *PostgresOptions) fill() {
	for _, f := range []struct {
		p *time.Duration
		d time.Duration
	}{{&o.IdleInTransaction, DefaultIdleInTransaction}, {&o.LockTimeout, DefaultLockTimeout}, {&o.StatementTimeout, DefaultStatementTimeout},
		{&o.VerifyTimeout, DefaultVerifyTimeout}, {&o.Keepalive, DefaultKeepalive}, {&o.ConnectTimeout, DefaultConnectTimeout}} {
		if *f.p <= 0 {
			*f.p = f.d
		}
	}
}

func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// postgresConfig is dsn's connection config with o's bounds: sent at each
// connection's start (no statement of its own), a parameter the DSN sets
// itself wins.
func postgresConfig(dsn string, o PostgresOptions) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	params := map[string]string{
		"idle_in_transaction_session_timeout": millis(o.IdleInTransaction),
		"lock_timeout":                        millis(o.LockTimeout),
		"statement_timeout":                   millis(o.StatementTimeout),
	}
	tcp := !strings.HasPrefix(cfg.Host, "/")
	if tcp {
		secs := func(d time.Duration) string { return strconv.FormatInt(max(int64(d/time.Second), 1), 10) }
		params["tcp_keepalives_idle"] = secs(o.Keepalive)
		params["tcp_keepalives_interval"] = secs(o.Keepalive / 3)
		params["tcp_keepalives_count"] = "3"
		params["tcp_user_timeout"] = millis(2 * o.Keepalive)
	}
	for k, v := range params {
		if _, set := cfg.RuntimeParams[k]; !set {
			cfg.RuntimeParams[k] = v
		}
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = o.ConnectTimeout
	}
	d := &net.Dialer{
		Timeout:         cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: o.Keepalive, Interval: o.Keepalive / 3, Count: 3},
		Control: func(network, _ string, c syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int((2 * o.Keepalive).Milliseconds()))
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
	cfg.DialFunc = d.DialContext
	return cfg, nil
}

func openPostgres(ctx context.Context, dsn string, o PostgresOptions) (*sqlStore, error) {
	o.fill()
	cfg, err := postgresConfig(dsn, o)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
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
			// A wait past lock_timeout fails (55P03, Unavailable).
			_, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))`, writeLockKey)
			return err
		},
		// A snapshot: one view of the whole store for every statement,
		// no lock that a write waits for.
		snapshot: &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true},
		long: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `SELECT set_config('statement_timeout', $1, true)`, millis(o.VerifyTimeout))
			return err
		},
	}}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return s, nil
}
