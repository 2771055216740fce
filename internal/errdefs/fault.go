package errdefs

import (
	"database/sql/driver"
	"errors"
	"net"
	"strings"
	"syscall"
	"time"
)

// storeRetry is the retry hint of a store fault: a restart, a failover or
// a frozen peer's session cut by the server is over within seconds.
const storeRetry = 2 * time.Second

// storeStates are the SQLSTATEs (and classes, two characters) that say
// the database cannot serve now, not that the call was wrong: each is
// retryable as it stands.
var storeStates = map[string]string{
	"08":    "the connection to it failed or was lost",
	"57P01": "it is shutting down",
	"57P02": "it is recovering from a crash",
	"57P03": "it is starting or in recovery, not yet accepting connections",
	"57P04": "its database was dropped",
	"57P05": "it ended an idle session",
	"25P03": "it ended a transaction left idle past --broker-idle-in-transaction-timeout",
	"55P03": "a lock was not granted within --broker-lock-timeout (another host holds the log's write lock)",
	"57014": "a statement ran past its timeout (--broker-statement-timeout)",
	"53300": "it has no free connection",
}

// storeFault names err as a fault of the database the server depends on,
// or returns nil: a stopped or restarting server, a lost connection, a
// session the server ended. It reads only what drivers expose through
// interfaces, so this package links no driver: an SQLSTATE (an error with
// a SQLState method, as pgx's PgError), a driver's connection-level error
// (one with a SafeToRetry method, as pgx's), database/sql's ErrBadConn, and
// a network error (a refused or reset connection, a socket that is gone).
func storeFault(err error) *Error {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		st := coded.SQLState()
		why, ok := storeStates[st]
		if !ok && len(st) == 5 {
			why, ok = storeStates[st[:2]]
		}
		if !ok {
			return nil
		}
		return Unavailable(StoreUnavailable, "the broker's store is unavailable: %s (SQLSTATE %s); retry in %s", why, st, storeRetry).
			With("sqlstate", st).Retry(storeRetry).Wrap(err)
	}
	var conn interface{ SafeToRetry() bool }
	var netErr *net.OpError
	if errors.As(err, &conn) || errors.As(err, &netErr) || errors.Is(err, driver.ErrBadConn) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		why := "the connection to it failed or was lost"
		if strings.Contains(err.Error(), "timeout") {
			why = "the connection to it timed out"
		}
		return Unavailable(StoreUnavailable, "the broker's store is unavailable: %s; retry in %s", why, storeRetry).
			Retry(storeRetry).Wrap(err)
	}
	return nil
}
