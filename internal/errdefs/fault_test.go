package errdefs

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
)

// sqlStateError is an error as a PostgreSQL driver reports the server's.
type sqlStateError string

func (e sqlStateError) Error() string    { return "FATAL: server says " + string(e) }
func (e sqlStateError) SQLState() string { return string(e) }

// lostConn is a driver's connection-level error (pgx's carry SafeToRetry).
type lostConn struct{}

func (lostConn) Error() string     { return "failed to receive message: unexpected EOF" }
func (lostConn) SafeToRetry() bool { return false }

// Every fault of the store, however deep it is wrapped, is Unavailable
// STORE_UNAVAILABLE with a retry hint; an SQLSTATE of a wrong call, and an
// error that says nothing of the store, stay Internal.
func TestStoreFaultsAreUnavailable(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "unix", Err: syscall.ENOENT}
	for _, c := range []struct {
		name  string
		err   error
		fault bool
		state string
	}{
		{"admin shutdown", sqlStateError("57P01"), true, "57P01"},
		{"crash recovery", sqlStateError("57P03"), true, "57P03"},
		{"connection exception class", sqlStateError("08006"), true, "08006"},
		{"idle in transaction cut", sqlStateError("25P03"), true, "25P03"},
		{"lock timeout", sqlStateError("55P03"), true, "55P03"},
		{"statement timeout", sqlStateError("57014"), true, "57014"},
		{"lost connection", fmt.Errorf("append event: %w", lostConn{}), true, ""},
		{"refused dial", fmt.Errorf("postgres: begin: %w", dial), true, ""},
		{"bad conn", fmt.Errorf("x: %w", driver.ErrBadConn), true, ""},
		{"unique violation", sqlStateError("23505"), false, ""},
		{"syntax error", sqlStateError("42601"), false, ""},
		{"plain", errors.New("something broke"), false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := Of(c.err)
			if !c.fault {
				if e.Kind != KindInternal || e.Reason != InternalError {
					t.Fatalf("%v: %v %s, want Internal", c.err, e.Kind, e.Reason)
				}
				return
			}
			if e.Kind != KindUnavailable || e.Reason != StoreUnavailable || e.RetryAfter <= 0 || ExitCode(c.err) != ExitUnreachable {
				t.Fatalf("%v: %v %s retry %v, want Unavailable STORE_UNAVAILABLE with a retry hint", c.err, e.Kind, e.Reason, e.RetryAfter)
			}
			if e.Metadata["sqlstate"] != c.state {
				t.Fatalf("sqlstate %q, want %q", e.Metadata["sqlstate"], c.state)
			}
		})
	}
}
