package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/bushost/bushost/internal/size"
)

// Limits bound what any peer can make bushostd hold: connections, calls,
// header and message bytes, and time. Every field is a flag of `bushostd
// serve` (AddFlags) and a row in docs/limits.md, which also gives the
// memory budget that follows from them. newServer builds the gRPC server
// options and the admission of each socket from this one struct.
type Limits struct {
	// Per socket, for everybody together.
	MaxConns    int // connections; over it a connection is closed at accept
	MaxInFlight int // calls in flight; over it a call is refused when its headers arrive
	// Per peer uid (SO_PEERCRED), on top of the per-socket limits; the
	// daemon's own uid is not held to them.
	MaxConnsPerUID int
	MaxCallsPerUID int
	// Room in MaxConns and MaxInFlight only the daemon's own uid may use
	// (at most half of each), so that the host's tools always get in.
	// Unlike the other fields, zero here means none, not the default.
	ReservedConns int
	ReservedCalls int
	// Per connection.
	MaxStreamsPerConn int   // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS
	MaxHeaderBytes    int64 // HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE
	// Per grant (keyed by its token), on both sockets together; the host's
	// admin token is not held to them.
	MaxCallsPerGrant   int
	MaxStreamsPerGrant int // `events --follow` streams
	// Time.
	RequestTimeout time.Duration // a request must arrive whole within it
	IdleTimeout    time.Duration // an idle connection closes; a push sending nothing is cut
	SendTimeout    time.Duration // a stream whose reader takes nothing this long is cut
	ListTimeout    time.Duration // a listing without --follow ends within it
	PushTimeout    time.Duration // a whole push, from its first byte to its answer
	MinPushRate    int64         // bytes per second a push must average ...
	PushRateGrace  time.Duration // ... once it is this old
}

// Defaults for Limits (docs/limits.md gives the reason for each).
const (
	DefaultMaxConns           = 256
	DefaultMaxInFlight        = 64
	DefaultMaxConnsPerUID     = 32
	DefaultMaxCallsPerUID     = 16
	DefaultReservedConns      = 16
	DefaultReservedCalls      = 8
	DefaultMaxStreamsPerConn  = 16
	DefaultMaxHeaderBytes     = 16 << 10
	DefaultMaxCallsPerGrant   = 8
	DefaultMaxStreamsPerGrant = 4
	DefaultRequestTimeout     = 10 * time.Second
	DefaultIdleTimeout        = 30 * time.Second
	DefaultSendTimeout        = 30 * time.Second
	DefaultListTimeout        = 5 * time.Minute
	DefaultPushTimeout        = 10 * time.Minute
	DefaultMinPushRate        = 64 << 10
	DefaultPushRateGrace      = 10 * time.Second
)

// Fixed transport sizes, part of the budget in docs/limits.md.
const (
	// maxRecvMsg bounds one message: bundles come in chunks of at most
	// 1 MiB; nothing legitimate is bigger than that plus framing.
	maxRecvMsg = 1<<20 + 16<<10
	// streamWindow and connWindow are the HTTP/2 flow-control windows:
	// what a peer may send before the daemon reads it. Setting them turns
	// off grpc's window growth (BDP estimation), which would let a peer
	// grow them to megabytes per connection.
	streamWindow = 64 << 10
	connWindow   = 256 << 10
	// ioBuffer is each connection's read and write buffer.
	ioBuffer = 32 << 10
)

// DefaultLimits returns the documented defaults.
func DefaultLimits() Limits {
	return Limits{
		MaxConns: DefaultMaxConns, MaxInFlight: DefaultMaxInFlight,
		MaxConnsPerUID: DefaultMaxConnsPerUID, MaxCallsPerUID: DefaultMaxCallsPerUID,
		ReservedConns: DefaultReservedConns, ReservedCalls: DefaultReservedCalls,
		MaxStreamsPerConn: DefaultMaxStreamsPerConn, MaxHeaderBytes: DefaultMaxHeaderBytes,
		MaxCallsPerGrant: DefaultMaxCallsPerGrant, MaxStreamsPerGrant: DefaultMaxStreamsPerGrant,
		RequestTimeout: DefaultRequestTimeout, IdleTimeout: DefaultIdleTimeout,
		SendTimeout: DefaultSendTimeout, ListTimeout: DefaultListTimeout,
		PushTimeout: DefaultPushTimeout, MinPushRate: DefaultMinPushRate, PushRateGrace: DefaultPushRateGrace,
	}
}

// fill puts the default in every zero field but the reserves.
func (l *Limits) fill() {
	d := DefaultLimits()
	setInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	setDur := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	setInt(&l.MaxConns, d.MaxConns)
	setInt(&l.MaxInFlight, d.MaxInFlight)
	setInt(&l.MaxConnsPerUID, d.MaxConnsPerUID)
	setInt(&l.MaxCallsPerUID, d.MaxCallsPerUID)
	setInt(&l.MaxStreamsPerConn, d.MaxStreamsPerConn)
	setInt(&l.MaxCallsPerGrant, d.MaxCallsPerGrant)
	setInt(&l.MaxStreamsPerGrant, d.MaxStreamsPerGrant)
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.MinPushRate == 0 {
		l.MinPushRate = d.MinPushRate
	}
	setDur(&l.RequestTimeout, d.RequestTimeout)
	setDur(&l.IdleTimeout, d.IdleTimeout)
	setDur(&l.SendTimeout, d.SendTimeout)
	setDur(&l.ListTimeout, d.ListTimeout)
	setDur(&l.PushTimeout, d.PushTimeout)
	setDur(&l.PushRateGrace, d.PushRateGrace)
}

// check refuses limits that cannot work.
func (l Limits) check() error {
	for _, v := range []struct {
		name string
		n    int64
	}{
		{"--max-conns", int64(l.MaxConns)}, {"--max-in-flight", int64(l.MaxInFlight)},
		{"--max-conns-per-uid", int64(l.MaxConnsPerUID)}, {"--max-calls-per-uid", int64(l.MaxCallsPerUID)},
		{"--max-streams-per-conn", int64(l.MaxStreamsPerConn)}, {"--max-header-bytes", l.MaxHeaderBytes},
		{"--max-calls-per-grant", int64(l.MaxCallsPerGrant)}, {"--max-streams-per-grant", int64(l.MaxStreamsPerGrant)},
		{"--request-timeout", int64(l.RequestTimeout)}, {"--idle-timeout", int64(l.IdleTimeout)},
		{"--send-timeout", int64(l.SendTimeout)}, {"--list-timeout", int64(l.ListTimeout)},
		{"--push-timeout", int64(l.PushTimeout)}, {"--min-push-rate", l.MinPushRate},
		{"--push-rate-grace", int64(l.PushRateGrace)},
	} {
		if v.n <= 0 {
			return fmt.Errorf("%s must be positive", v.name)
		}
	}
	if l.ReservedConns < 0 || l.ReservedCalls < 0 {
		return errors.New("--reserved-conns and --reserved-calls must not be negative")
	}
	if l.MaxHeaderBytes > 1<<20 {
		return errors.New("--max-header-bytes must be at most 1M")
	}
	return nil
}

// addFlags registers one flag per field, writing into l.
func (l *Limits) addFlags(fs *pflag.FlagSet) {
	d := DefaultLimits()
	l.MaxHeaderBytes, l.MinPushRate = d.MaxHeaderBytes, d.MinPushRate
	fs.IntVar(&l.MaxConns, "max-conns", d.MaxConns, "connections per socket; more are closed at accept")
	fs.IntVar(&l.MaxInFlight, "max-in-flight", d.MaxInFlight, "calls in flight per socket")
	fs.IntVar(&l.MaxConnsPerUID, "max-conns-per-uid", d.MaxConnsPerUID, "connections per socket from one peer uid (not the daemon's own)")
	fs.IntVar(&l.MaxCallsPerUID, "max-calls-per-uid", d.MaxCallsPerUID, "calls in flight per socket from one peer uid (not the daemon's own)")
	fs.IntVar(&l.ReservedConns, "reserved-conns", d.ReservedConns, "connections per socket only the daemon's own uid may use (at most half of --max-conns)")
	fs.IntVar(&l.ReservedCalls, "reserved-calls", d.ReservedCalls, "calls per socket only the daemon's own uid may use (at most half of --max-in-flight)")
	fs.IntVar(&l.MaxStreamsPerConn, "max-streams-per-conn", d.MaxStreamsPerConn, "concurrent HTTP/2 streams per connection")
	fs.Var(size.Value{P: &l.MaxHeaderBytes}, "max-header-bytes", "largest header list of a call (16K; a token is under 100 bytes)")
	fs.IntVar(&l.MaxCallsPerGrant, "max-calls-per-grant", d.MaxCallsPerGrant, "calls in flight per grant, both sockets together")
	fs.IntVar(&l.MaxStreamsPerGrant, "max-streams-per-grant", d.MaxStreamsPerGrant, "'events --follow' streams per grant")
	fs.DurationVar(&l.RequestTimeout, "request-timeout", d.RequestTimeout, "a call's request (a stream's first message) must arrive whole within this")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", d.IdleTimeout, "close a connection with no call this long; cut a push stream that sends nothing this long")
	fs.DurationVar(&l.SendTimeout, "send-timeout", d.SendTimeout, "cut a stream whose reader takes nothing this long")
	fs.DurationVar(&l.ListTimeout, "list-timeout", d.ListTimeout, "a listing of events without --follow ends within this")
	fs.DurationVar(&l.PushTimeout, "push-timeout", d.PushTimeout, "a whole push, from its first byte to its answer")
	fs.Var(size.Value{P: &l.MinPushRate}, "min-push-rate", "bytes per second a push must average after --push-rate-grace (64K)")
	fs.DurationVar(&l.PushRateGrace, "push-rate-grace", d.PushRateGrace, "how long a push may run before --min-push-rate applies")
}

// Memory budget (docs/limits.md). What a peer can make the daemon hold
// live is bounded by the limits: per connection a fixed cost (its buffers,
// one header list, its goroutines; a stream refused at its headers holds
// nothing), per call in flight at most one message buffered and decoded
// (or, for a listing, one page and the event being sent).
const (
	budgetBaseline = 32 << 20
	budgetPerConn  = 2*ioBuffer + 32<<10 // + the header list, below
	budgetPerCall  = 2*maxRecvMsg + streamWindow
)

// ConnBudget is what one connection may hold.
func (l Limits) ConnBudget() int64 { return budgetPerConn + l.MaxHeaderBytes }

// UIDBudget is what one peer uid may make the daemon hold, both sockets.
func (l Limits) UIDBudget() int64 {
	return 2 * (int64(l.MaxConnsPerUID)*l.ConnBudget() + int64(l.MaxCallsPerUID)*budgetPerCall)
}

// Budget is the bound on the daemon's live memory: the baseline plus, on
// each of the two sockets, every connection and every call in flight at
// their cost. Serve sets Go's soft memory limit a quarter above it.
func (l Limits) Budget() int64 {
	return budgetBaseline + 2*(int64(l.MaxConns)*l.ConnBudget()+int64(l.MaxInFlight)*budgetPerCall)
}
