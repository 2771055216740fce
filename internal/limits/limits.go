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
	"reflect"
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

// Defaults that code outside this package names (docs/limits.md gives
// the reason for each, and Default all of them).
const (
	DefaultMaxBundleBytes = 256 << 20
	DefaultIdleTimeout    = 30 * time.Second
	DefaultMaxTreePaths   = 1_000_000
	DefaultMaxTreeDepth   = 1024

	DefaultEventRate      = 600     // events per minute
	DefaultEventBytesRate = 1 << 20 // bytes (type and data) per minute
	// network.egress: one event per connection decision and one per
	// close, so a session making a few connections a second needs more
	// than a grant's notes.
	DefaultEgressRate      = 6000    // events per minute
	DefaultEgressBytesRate = 4 << 20 // bytes per minute
)

// Default returns the documented defaults (docs/limits.md gives the
// reason for each).
func Default() Limits {
	return Limits{
		Transport: Transport{
			MaxBundleBytes: DefaultMaxBundleBytes,
			MaxConns:       256, MaxInFlight: 64,
			MaxConnsPerUID: 32, MaxCallsPerUID: 16,
			ReservedConns: 16, ReservedCalls: 8,
			MaxStreamsPerConn: 16, MaxHeaderBytes: 16 << 10,
			MaxCallsPerGrant: 8, MaxStreamsPerGrant: 4,
			RequestTimeout: 10 * time.Second, IdleTimeout: DefaultIdleTimeout,
			SendTimeout: 30 * time.Second, ListTimeout: 5 * time.Minute,
			PushTimeout: 10 * time.Minute, MinPushRate: 64 << 10, PushRateGrace: 10 * time.Second,
		},
		Objects: Objects{
			MaxObjectBytes: 100 << 20, MaxCommitBytes: 1 << 20, MaxTreeBytes: 16 << 20,
			MaxPackObjects: 1 << 20, MaxPushInflated: 4 << 30,
			MaxTreePaths: DefaultMaxTreePaths, MaxTreeDepth: DefaultMaxTreeDepth,
		},
		Quotas: Quotas{MaxTaskBytes: 1 << 30, MaxProjectBytes: 10 << 30},
		Rates: Rates{EventRate: DefaultEventRate, EventBytesRate: DefaultEventBytesRate,
			EgressRate: DefaultEgressRate, EgressBytesRate: DefaultEgressBytesRate},
	}
}

// fill puts def's value in every zero field of *p, and of the structs
// *p embeds (every field here is a number). A negative value is left for
// the caller to refuse (Check, and the daemon's own checks).
func fill[T any](p *T, def T) { fillValue(reflect.ValueOf(p).Elem(), reflect.ValueOf(def)) }

func fillValue(v, def reflect.Value) {
	for i := range v.NumField() {
		switch f := v.Field(i); {
		case f.Kind() == reflect.Struct:
			fillValue(f, def.Field(i))
		case f.IsZero():
			f.Set(def.Field(i))
		}
	}
}

// Fill puts the default in every zero field but the reserves.
func (l *Limits) Fill() {
	conns, calls := l.ReservedConns, l.ReservedCalls
	fill(l, Default())
	l.ReservedConns, l.ReservedCalls = conns, calls
}

// Fill puts the default in every zero field.
func (o *Objects) Fill() { fill(o, Default().Objects) }

// Fill puts the default in every zero field.
func (q *Quotas) Fill() { fill(q, Default().Quotas) }

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
