package launch

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/sock"
)

// SockLimits bound launch.sock as bushostd's sockets are bounded
// (docs/limits.md), through the same admission (internal/sock):
// connections and calls on the socket and per peer uid, with room only
// root (the launcher's own uid: the host's tools) may use, calls per
// grant, and how long a request may take to arrive and a connection may
// idle. A session wait is a call in flight for as long as it waits.
type SockLimits struct {
	sock.AdmitLimits // OwnUID and SendTimeout (IdleTimeout) set by newServer
	MaxCallsPerGrant int
	IdleTimeout      time.Duration
}

// DefaultSockLimits are bushostd's defaults, but for calls per grant:
// a lead may wait for each of its --max-sessions-per-grant sessions and
// still launch.
func DefaultSockLimits() SockLimits {
	return SockLimits{AdmitLimits: sock.AdmitLimits{MaxConns: 256, MaxCalls: 64, MaxConnsPerUID: 32, MaxCallsPerUID: 16,
		ReservedConns: 16, ReservedCalls: 8, RequestTimeout: 10 * time.Second}, MaxCallsPerGrant: 16, IdleTimeout: 30 * time.Second}
}

func (l *SockLimits) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.MaxConns, "max-conns", l.MaxConns, "connections to launch.sock; more are closed at accept")
	fs.IntVar(&l.MaxCalls, "max-in-flight", l.MaxCalls, "calls in flight on launch.sock")
	fs.IntVar(&l.MaxConnsPerUID, "max-conns-per-uid", l.MaxConnsPerUID, "connections from one peer uid (not root's)")
	fs.IntVar(&l.MaxCallsPerUID, "max-calls-per-uid", l.MaxCallsPerUID, "calls in flight from one peer uid (not root's)")
	fs.IntVar(&l.ReservedConns, "reserved-conns", l.ReservedConns, "connections only root may use (at most half of --max-conns)")
	fs.IntVar(&l.ReservedCalls, "reserved-calls", l.ReservedCalls, "calls only root may use (at most half of --max-in-flight)")
	fs.IntVar(&l.MaxCallsPerGrant, "max-calls-per-grant", l.MaxCallsPerGrant, "calls in flight per grant (its token)")
	fs.DurationVar(&l.RequestTimeout, "request-timeout", l.RequestTimeout, "a call's request must arrive whole within this")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", l.IdleTimeout, "close a connection with no call this long")
}

func (l SockLimits) check() error {
	for _, n := range []int{l.MaxConns, l.MaxCalls, l.MaxConnsPerUID, l.MaxCallsPerUID, l.MaxCallsPerGrant, int(l.RequestTimeout), int(l.IdleTimeout)} {
		if n <= 0 {
			return errors.New("--max-conns, --max-in-flight, --max-conns-per-uid, --max-calls-per-uid, --max-calls-per-grant, --request-timeout and --idle-timeout must be positive")
		}
	}
	if l.ReservedConns < 0 || l.ReservedCalls < 0 {
		return errors.New("--reserved-conns and --reserved-calls must not be negative")
	}
	for _, n := range []int{l.MaxConns, l.MaxCalls, l.MaxConnsPerUID, l.MaxCallsPerUID, l.MaxCallsPerGrant, l.ReservedConns, l.ReservedCalls} {
		if n > limits.MaxCount {
			return fmt.Errorf("--max-conns, --max-in-flight, --max-conns-per-uid, --max-calls-per-uid, --max-calls-per-grant, --reserved-conns and --reserved-calls must be at most %d, not %d", limits.MaxCount, n)
		}
	}
	return nil
}

// Transport sizes: a launch request is a command line and a few names
// (a command of 64 KiB is refused ResourceExhausted by grpc). An answer
// holds at most one session with its command (maxRecvMsg), two chunks of
// logs, or a list of sessions with their commands clipped, within
// maxAnswer. grpc keeps an answer the caller does not read for as long as
// the stream lasts, and a stream lasts until its answer is read, past the
// end of the call: a connection holds maxStreams of them at most.
const (
	maxStreams = 2
	maxAnswer  = maxRecvMsg + 4<<10
	maxRecvMsg = 64 << 10
	maxHeader  = 16 << 10
)

// Budget is the bound on the launcher's live memory: a baseline, each
// connection at its buffers, one header list and the answers its streams
// may hold unread, each call in flight at a request buffered and decoded.
func (l SockLimits) Budget() int64 {
	const baseline, perConn, perCall = 32 << 20, 3*sock.IOBuffer + maxHeader + maxStreams*maxAnswer, 2*maxRecvMsg + sock.StreamWindow
	return baseline + int64(l.MaxConns)*perConn + int64(l.MaxCalls)*perCall
}

// newServer is launch.sock's gRPC server with its bounds, and the
// admission its listener must be wrapped in.
func newServer(l SockLimits, adminToken string) (*grpc.Server, *sock.Admission) {
	a := l.AdmitLimits
	a.OwnUID, a.SendTimeout = os.Getuid(), l.IdleTimeout
	adm := sock.NewAdmission(a)
	srv := adm.Server(false, maxRecvMsg, maxStreams, maxHeader, l.IdleTimeout,
		// grpcerr runs first: every error a handler or interceptor
		// returns leaves as its status (the LaunchService has no stream).
		grpc.ChainUnaryInterceptor(grpcerr.UnaryServer, adm.Unary, grantCalls(l.MaxCallsPerGrant, adminToken)),
	)
	return srv, adm
}

// grantCalls refuses the calls in flight of one grant past
// --max-calls-per-grant (sock.GrantSlots: the host's admin token is not
// counted).
func grantCalls(max int, adminToken string) grpc.UnaryServerInterceptor {
	return sock.NewGrantSlots(adminToken).Unary(max, func(n int) error {
		return errdefs.ResourceExhausted(errdefs.TooManyCallsPerGrant, "this grant already has %d calls in flight on launch.sock (limit %d, sandbox serve --max-calls-per-grant); end some and retry", n, max).
			With("limit", max).Retry(time.Second)
	})
}
