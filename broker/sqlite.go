package broker

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // the embedded store: pure Go, no cgo
)

// sqliteSchema is postgresSchema in SQLite's types: INTEGER for BIGINT
// (so events.seq is the rowid: appends go to the end of the table's
// b-tree) and REAL for DOUBLE PRECISION.
var sqliteSchema = func() [][]string {
	types := strings.NewReplacer("BIGINT", "INTEGER", "DOUBLE PRECISION", "REAL")
	out := make([][]string, len(postgresSchema))
	for i, m := range postgresSchema {
		for _, stmt := range m {
			out[i] = append(out[i], types.Replace(stmt))
		}
	}
	return out
}()

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
