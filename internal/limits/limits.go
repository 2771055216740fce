// Package limits is the one table of what bushostd bounds: the transport
// (connections, calls, header bytes and time per socket, uid, connection
// and grant; a bundle's size and a push's pace), the objects a push may
// carry, the quotas on what pushes may store, and the rates at which a
// grant may record events. Each field is one flag of `bushostd serve`
// (AddFlags) and one row in docs/limits.md, its default defined here
// once. The daemon's options, gitd.Options and broker.Options embed
// Limits: the daemon's flags fill it, and the git service and the broker
// read it as it was given.
package limits

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/bushost/bushost/internal/size"
)

// Limits are every bound of a bus host. Zero fields mean their default
// (Fill), except the reserves, where zero means none.
type Limits struct {
	Transport
	Objects
	Quotas
	Rates
}

// Transport bounds what any peer of the sockets can make bushostd hold:
// connections, calls, header bytes and time; and a push's bundle and pace.
type Transport struct {
	// MaxBundleBytes bounds one pushed bundle.
	MaxBundleBytes int64
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

// Objects bound what a push may carry, checked on every pushed pack as it
// streams in, before git reads the object, and what a commit's tree may
// expand to.
type Objects struct {
	MaxObjectBytes int64 // a blob, inflated
	MaxCommitBytes int64 // a commit or a tag, inflated
	MaxTreeBytes   int64 // a tree, inflated
	MaxPackObjects int64 // the objects of one pushed pack
	// MaxPushInflated bounds the sum of a pushed pack's inflated sizes, a
	// delta counted by its result.
	MaxPushInflated int64
	// MaxTreePaths and MaxTreeDepth bound what a commit's tree expands
	// to (the paths a checkout writes, and how deep they nest) for every
	// commit a push brings, and the result of a landing and of a publish.
	MaxTreePaths int64
	MaxTreeDepth int64
}

// Quotas bound what pushes may store: a task's accepted packs, a
// project's repository. A push past one is refused before its objects
// leave quarantine.
type Quotas struct {
	MaxTaskBytes    int64
	MaxProjectBytes int64
}

// Rates bound what one grant may append through RecordEvent, per minute:
// events, and bytes of their type and data. network.egress has a bound of
// its own (per launcher grant), apart from the others: a session's
// launcher records one event per connection decision and per close.
type Rates struct {
	EventRate       int
	EventBytesRate  int64
	EgressRate      int
	EgressBytesRate int64
}

// Defaults (docs/limits.md gives the reason for each).
const (
	DefaultMaxBundleBytes     = 256 << 20
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

	DefaultMaxObjectBytes  = 100 << 20
	DefaultMaxCommitBytes  = 1 << 20
	DefaultMaxTreeBytes    = 16 << 20
	DefaultMaxPackObjects  = 1 << 20
	DefaultMaxPushInflated = 4 << 30
	DefaultMaxTreePaths    = 1_000_000
	DefaultMaxTreeDepth    = 1024

	DefaultMaxTaskBytes    = 1 << 30
	DefaultMaxProjectBytes = 10 << 30

	DefaultEventRate      = 600     // events per minute
	DefaultEventBytesRate = 1 << 20 // bytes (type and data) per minute
	// network.egress: one event per connection decision and one per
	// close, so a session making a few connections a second needs more
	// than a grant's notes.
	DefaultEgressRate      = 6000    // events per minute
	DefaultEgressBytesRate = 4 << 20 // bytes per minute
)

// Default returns the documented defaults.
func Default() Limits {
	return Limits{
		Transport: Transport{
			MaxBundleBytes: DefaultMaxBundleBytes,
			MaxConns:       DefaultMaxConns, MaxInFlight: DefaultMaxInFlight,
			MaxConnsPerUID: DefaultMaxConnsPerUID, MaxCallsPerUID: DefaultMaxCallsPerUID,
			ReservedConns: DefaultReservedConns, ReservedCalls: DefaultReservedCalls,
			MaxStreamsPerConn: DefaultMaxStreamsPerConn, MaxHeaderBytes: DefaultMaxHeaderBytes,
			MaxCallsPerGrant: DefaultMaxCallsPerGrant, MaxStreamsPerGrant: DefaultMaxStreamsPerGrant,
			RequestTimeout: DefaultRequestTimeout, IdleTimeout: DefaultIdleTimeout,
			SendTimeout: DefaultSendTimeout, ListTimeout: DefaultListTimeout,
			PushTimeout: DefaultPushTimeout, MinPushRate: DefaultMinPushRate, PushRateGrace: DefaultPushRateGrace,
		},
		Objects: Objects{
			MaxObjectBytes: DefaultMaxObjectBytes, MaxCommitBytes: DefaultMaxCommitBytes, MaxTreeBytes: DefaultMaxTreeBytes,
			MaxPackObjects: DefaultMaxPackObjects, MaxPushInflated: DefaultMaxPushInflated,
			MaxTreePaths: DefaultMaxTreePaths, MaxTreeDepth: DefaultMaxTreeDepth,
		},
		Quotas: Quotas{MaxTaskBytes: DefaultMaxTaskBytes, MaxProjectBytes: DefaultMaxProjectBytes},
		Rates: Rates{EventRate: DefaultEventRate, EventBytesRate: DefaultEventBytesRate,
			EgressRate: DefaultEgressRate, EgressBytesRate: DefaultEgressBytesRate},
	}
}

// orDefault puts def in *p if it is zero. A negative value is left for
// the caller to refuse (Check, and the daemon's own checks).
func orDefault[T int | int64 | time.Duration](p *T, def T) {
	if *p == 0 {
		*p = def
	}
}

// Fill puts the default in every zero field but the reserves.
func (l *Limits) Fill() {
	d := Default()
	t := &l.Transport
	orDefault(&t.MaxBundleBytes, d.MaxBundleBytes)
	orDefault(&t.MaxConns, d.MaxConns)
	orDefault(&t.MaxInFlight, d.MaxInFlight)
	orDefault(&t.MaxConnsPerUID, d.MaxConnsPerUID)
	orDefault(&t.MaxCallsPerUID, d.MaxCallsPerUID)
	orDefault(&t.MaxStreamsPerConn, d.MaxStreamsPerConn)
	orDefault(&t.MaxHeaderBytes, d.MaxHeaderBytes)
	orDefault(&t.MaxCallsPerGrant, d.MaxCallsPerGrant)
	orDefault(&t.MaxStreamsPerGrant, d.MaxStreamsPerGrant)
	orDefault(&t.RequestTimeout, d.RequestTimeout)
	orDefault(&t.IdleTimeout, d.IdleTimeout)
	orDefault(&t.SendTimeout, d.SendTimeout)
	orDefault(&t.ListTimeout, d.ListTimeout)
	orDefault(&t.PushTimeout, d.PushTimeout)
	orDefault(&t.MinPushRate, d.MinPushRate)
	orDefault(&t.PushRateGrace, d.PushRateGrace)
	l.Objects.Fill()
	l.Quotas.Fill()
	l.Rates.Fill()
}

// Fill puts the default in every zero field.
func (o *Objects) Fill() {
	d := Default().Objects
	orDefault(&o.MaxObjectBytes, d.MaxObjectBytes)
	orDefault(&o.MaxCommitBytes, d.MaxCommitBytes)
	orDefault(&o.MaxTreeBytes, d.MaxTreeBytes)
	orDefault(&o.MaxPackObjects, d.MaxPackObjects)
	orDefault(&o.MaxPushInflated, d.MaxPushInflated)
	orDefault(&o.MaxTreePaths, d.MaxTreePaths)
	orDefault(&o.MaxTreeDepth, d.MaxTreeDepth)
}

// Fill puts the default in every zero field.
func (q *Quotas) Fill() {
	d := Default().Quotas
	orDefault(&q.MaxTaskBytes, d.MaxTaskBytes)
	orDefault(&q.MaxProjectBytes, d.MaxProjectBytes)
}

// Fill puts the default in every zero field.
func (r *Rates) Fill() {
	d := Default().Rates
	orDefault(&r.EventRate, d.EventRate)
	orDefault(&r.EventBytesRate, d.EventBytesRate)
	orDefault(&r.EgressRate, d.EgressRate)
	orDefault(&r.EgressBytesRate, d.EgressBytesRate)
}

// MaxCount bounds every count of the transport (connections, calls,
// streams): far above what one host serves, and low enough that a count
// reaches HTTP/2's 32-bit settings whole and the memory budget of all of
// them together stays an int64. Without it, --max-streams-per-conn
// 4294967296 became 0 on the wire, which gRPC takes for no bound.
const MaxCount = 1 << 20

// Check refuses transport limits that cannot work, naming the flag.
func (l Limits) Check() error {
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
	for _, v := range []struct {
		name string
		n    int
	}{
		{"--max-conns", l.MaxConns}, {"--max-in-flight", l.MaxInFlight},
		{"--max-conns-per-uid", l.MaxConnsPerUID}, {"--max-calls-per-uid", l.MaxCallsPerUID},
		{"--reserved-conns", l.ReservedConns}, {"--reserved-calls", l.ReservedCalls},
		{"--max-streams-per-conn", l.MaxStreamsPerConn},
		{"--max-calls-per-grant", l.MaxCallsPerGrant}, {"--max-streams-per-grant", l.MaxStreamsPerGrant},
	} {
		if v.n > MaxCount {
			return fmt.Errorf("%s must be at most %d, not %d", v.name, MaxCount, v.n)
		}
	}
	if l.MaxHeaderBytes > 1<<20 {
		return errors.New("--max-header-bytes must be at most 1M")
	}
	return nil
}

// AddFlags registers one flag of `bushostd serve` per field, writing into
// l, with the defaults.
func (l *Limits) AddFlags(fs *pflag.FlagSet) {
	d := Default()
	// A size flag shows, and keeps unless given, what its field holds.
	l.MaxBundleBytes, l.MaxHeaderBytes, l.MinPushRate = d.MaxBundleBytes, d.MaxHeaderBytes, d.MinPushRate
	l.MaxObjectBytes, l.MaxCommitBytes, l.MaxTreeBytes = d.MaxObjectBytes, d.MaxCommitBytes, d.MaxTreeBytes
	l.MaxPushInflated, l.MaxTaskBytes, l.MaxProjectBytes = d.MaxPushInflated, d.MaxTaskBytes, d.MaxProjectBytes
	l.EventBytesRate, l.EgressBytesRate = d.EventBytesRate, d.EgressBytesRate

	fs.Var(size.Value{P: &l.MaxBundleBytes}, "max-bundle-bytes", "largest bundle a push may send (bytes, or 64M, 1G)")
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

	// Objects and quotas (docs/limits.md, "Objects and quotas").
	fs.Var(size.Value{P: &l.MaxObjectBytes}, "max-object-bytes", "largest blob a push may carry, inflated")
	fs.Var(size.Value{P: &l.MaxCommitBytes}, "max-commit-bytes", "largest commit or tag a push may carry, inflated")
	fs.Var(size.Value{P: &l.MaxTreeBytes}, "max-tree-bytes", "largest tree a push may carry, inflated")
	fs.Int64Var(&l.MaxPackObjects, "max-pack-objects", d.MaxPackObjects, "most objects one pushed pack may hold")
	fs.Var(size.Value{P: &l.MaxPushInflated}, "max-push-inflated", "most bytes a push's objects may inflate to together, each delta counted by its result, each base a REF_DELTA names once by its size")
	fs.Int64Var(&l.MaxTreePaths, "max-tree-paths", d.MaxTreePaths, "most paths (files, links, submodules) the tree of a pushed, landed or published commit may expand to")
	fs.Int64Var(&l.MaxTreeDepth, "max-tree-depth", d.MaxTreeDepth, "deepest the tree of a pushed, landed or published commit may nest (a file at the top is depth 1)")
	fs.Var(size.Value{P: &l.MaxTaskBytes}, "max-task-bytes", "total size of a task's accepted packs")
	fs.Var(size.Value{P: &l.MaxProjectBytes}, "max-project-bytes", "size of a project's repository that pushes may reach")
	fs.IntVar(&l.EventRate, "event-rate", d.EventRate, "events one grant may record per minute")
	fs.Var(size.Value{P: &l.EventBytesRate}, "event-bytes-rate", "bytes (type and data) one grant may record per minute")
	fs.IntVar(&l.EgressRate, "egress-event-rate", d.EgressRate, "network.egress events one launcher grant may record per minute, apart from --event-rate")
	fs.Var(size.Value{P: &l.EgressBytesRate}, "egress-event-bytes-rate", "bytes of network.egress events one launcher grant may record per minute, apart from --event-bytes-rate")
}
