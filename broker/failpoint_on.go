//go:build bushost_failpoints

package broker

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// Failpoints for tests of an unclear commit, built only with the tag
// bushost_failpoints. $BUSHOST_FAILPOINT chooses, once per process, what
// happens to the first commit of a push's record:
//
//	record-push:before  the connection is cut before the commit (PostgreSQL:
//	                    pg_terminate_backend from another connection; SQLite:
//	                    the write fails): the record did not commit
//	record-push:after   the commit reaches the store, then the connection is
//	                    cut and the commit reports an error
//	record-push:blind   as after, and the log cannot be read back either
//	record-push:hold    with the write lock held, before the commit, the
//	                    file $BUSHOST_FAILPOINT_FILE is written, and the
//	                    commit waits until it is removed: a test freezes
//	                    the process (SIGSTOP) while it holds the lock
var (
	failMode  = os.Getenv("BUSHOST_FAILPOINT")
	failFired atomic.Bool
	failPID   atomic.Int64
	failBlind atomic.Bool
)

func failArmed(batch []*op) bool {
	if failMode == "" {
		return false
	}
	for _, o := range batch {
		if o.ctx.Value(recordPushKey{}) != nil {
			return !failFired.Load()
		}
	}
	return false
}

// terminate cuts the PostgreSQL backend pid from another connection (if
// the pool hands out pid's own connection, it is held while a second one
// does the cut).
func terminate(ctx context.Context, s *sqlStore, pid int) error {
	if s.d.name != "postgres" {
		return nil
	}
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 3 {
		c, err := s.db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		var own int
		if err := c.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&own); err != nil {
			continue
		}
		if own == pid {
			continue
		}
		var done bool
		if err := c.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&done); err != nil || !done {
			return fmt.Errorf("failpoint: terminate backend %d: %v %v", pid, done, err)
		}
		return nil
	}
	return fmt.Errorf("failpoint: no other connection to terminate backend %d from", pid)
}

func failBeforeCommit(ctx context.Context, st *sqlStore, tx *writeTx, batch []*op) error {
	if !failArmed(batch) {
		return nil
	}
	pg := st.d.name == "postgres"
	pid := 0
	if pg {
		if err := tx.tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
	}
	failPID.Store(int64(pid))
	if failMode == "record-push:hold" {
		failFired.Store(true)
		return hold(ctx, os.Getenv("BUSHOST_FAILPOINT_FILE"))
	}
	if failMode != "record-push:before" {
		return nil
	}
	failFired.Store(true)
	if pg {
		// The real commit that follows fails on the cut connection.
		return terminate(ctx, st, pid)
	}
	return errors.New("failpoint: the write failed before it reached the file")
}

// hold writes file and waits until it is removed.
func hold(ctx context.Context, file string) error {
	if file == "" {
		return errors.New("failpoint: record-push:hold needs $BUSHOST_FAILPOINT_FILE")
	}
	if err := os.WriteFile(file, []byte("holding the write lock\n"), 0o644); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func failAfterCommit(ctx context.Context, st *sqlStore, batch []*op) error {
	if (failMode != "record-push:after" && failMode != "record-push:blind") || !failArmed(batch) {
		return nil
	}
	failFired.Store(true)
	if pid := int(failPID.Load()); pid != 0 {
		if err := terminate(ctx, st, pid); err != nil {
			return err
		}
	}
	if failMode == "record-push:blind" {
		failBlind.Store(true)
	}
	return errors.New("failpoint: conn closed while the commit was in flight")
}

func failOutcomeRead() error {
	if failBlind.Load() {
		return errors.New("failpoint: the log cannot be read")
	}
	return nil
}
