// Package metrics is what bushostd tells an operator about itself: the
// Prometheus collectors (served only on the opt-in --metrics-addr), and the
// per-call record that the daemon's interceptor logs. gitd and the broker
// feed it through a few hooks (NoteGrant, IndexPack, Write) that cost a
// map-free atomic add or two; everything else is observed from the gRPC
// interceptor. It never sees a token. NewRegistry is the part every bushost
// process shares (build info, Go and process collectors): the supervisor's
// /metrics starts from it too.
package metrics

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/bushost/bushost/internal/version"
)

// Namespace prefixes every metric of bushost's own.
const Namespace = "bushost"

// Registry holds bushostd's collectors. It is process-wide: one daemon per
// process, and the hooks in gitd and the broker need no handle to reach it.
var Registry = NewRegistry()

// NewRegistry returns a registry holding what every bushost process
// exposes: bushost_build_info and the standard Go and process collectors.
// bushostd adds its own to Registry; the supervisor makes one per run.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	buildInfo := gaugeVec("build_info", "Always 1; the labels say which build of bushost is running.", "version", "revision", "goversion")
	in := version.Read()
	buildInfo.WithLabelValues(in.Module, in.Revision, in.Go).Set(1)
	r.MustRegister(buildInfo,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return r
}

// The constructors of bushost's own collectors: each is in Namespace.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets})
}

func histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}, labels)
}

// Durations from a millisecond to a few minutes: a push of a small change
// takes milliseconds, one of a 256 MiB bundle tens of seconds.
var durationBuckets = prometheus.ExponentialBuckets(0.001, 2.5, 14)

// The broker's write latencies start ten times lower, at 100µs.
var writeBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 14)

var (
	Calls = counterVec("calls_total",
		"gRPC calls finished, by socket, method and outcome (errdefs reason, OK on success).", "socket", "method", "outcome")
	Pushes = counterVec("pushes_total",
		"Pushes (PushWorking) accepted (outcome OK) or refused (outcome = errdefs reason).", "outcome")
	PushSeconds = histogram("push_duration_seconds",
		"Duration of a PushWorking call, from its first message to its answer.", durationBuckets)
	PushBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Name: "push_bundle_bytes_total",
		Help: "Bundle bytes received by PushWorking calls (accepted or not).",
	})
	indexPackSeconds = histogram("index_pack_duration_seconds",
		"Duration of git index-pack --strict on a pushed bundle's pack, in quarantine.", durationBuckets)
	writes = counterVec("broker_writes_total",
		"Broker log writes, by result: committed (it appended its events) or refused (it appended nothing).", "result")
	writeSeconds = histogram("broker_append_duration_seconds",
		"Append latency: from a broker write's call to its durable commit (group commit included).", writeBuckets)
	lockWaitSeconds = histogram("broker_write_lock_wait_seconds",
		"How long a broker write transaction waited for the log's write lock (on PostgreSQL, shared by every host of the fleet).", writeBuckets)
	lockHoldSeconds = histogram("broker_write_lock_hold_seconds",
		"How long a broker write transaction held the log's write lock, its commit included.", writeBuckets)
	Gate = counterVec("gate_decisions_total",
		"task.close gate decisions: closed, or the refusal's errdefs reason.", "decision")
	LimitRefusals = counterVec("limit_refusals_total",
		"Calls refused for a limit (ResourceExhausted), by socket and reason.", "socket", "reason")
	InFlight = gaugeVec("calls_in_flight", "Calls being served, by socket.", "socket")
	Conns    = gaugeVec("connections_open", "Connections open, by socket.", "socket")
)

var (
	housekeepingRuns = counterVec("git_housekeeping_runs_total",
		"Housekeeping runs on a repository, by repository kind (pool, task) and outcome (optimized, clean, failed).", "repository", "outcome")
	housekeepingSeconds = histogramVec("git_housekeeping_duration_seconds",
		"Duration of a housekeeping run on a repository, by repository kind.", durationBuckets, "repository")
	housekeepingPacks = histogramVec("git_housekeeping_packs",
		"Packs a repository holds after a housekeeping run, by repository kind.", []float64{1, 2, 4, 8, 16, 32, 64, 128}, "repository")
)

func init() {
	Registry.MustRegister(Calls, Pushes, PushSeconds, PushBytes, indexPackSeconds,
		writes, writeSeconds, lockWaitSeconds, lockHoldSeconds, Gate, LimitRefusals, InFlight, Conns,
		housekeepingRuns, housekeepingSeconds, housekeepingPacks)
}

// Housekeeping records one housekeeping run (gitd's hook): kind is "pool"
// or "task", outcome "optimized", "clean" or "failed".
func Housekeeping(kind, outcome string, d time.Duration, packs int) {
	housekeepingRuns.WithLabelValues(kind, outcome).Inc()
	housekeepingSeconds.WithLabelValues(kind).Observe(d.Seconds())
	housekeepingPacks.WithLabelValues(kind).Observe(float64(packs))
}

// IndexPack records one index-pack run (gitd's hook).
func IndexPack(d time.Duration) { indexPackSeconds.Observe(d.Seconds()) }

// Write records one broker write, from its call to its commit or refusal
// (the broker's hook).
func Write(err error, d time.Duration) {
	if err != nil {
		writes.WithLabelValues("refused").Inc()
		return
	}
	writes.WithLabelValues("committed").Inc()
	writeSeconds.Observe(d.Seconds())
}

// WriteLock records one broker write transaction's wait for the log's
// write lock, and how long it then held it (the broker's hook).
func WriteLock(wait, hold time.Duration) {
	lockWaitSeconds.Observe(wait.Seconds())
	lockHoldSeconds.Observe(hold.Seconds())
}

// Call is what the daemon knows about one call as it runs; the interceptor
// logs it when the call ends. Handlers add the grant through NoteGrant.
type Call struct {
	grant atomic.Pointer[grantNote]
	// Bytes counts the messages' payload both ways.
	Bytes atomic.Int64
	// Passed counts the bytes of a bundle the call read from a file the
	// client passed as a descriptor instead of sending them (a push's).
	Passed atomic.Int64
}

type grantNote struct{ id, task string }

// Grant returns the grant id and task a handler noted, or "".
func (c *Call) Grant() (id, task string) {
	if g := c.grant.Load(); g != nil {
		return g.id, g.task
	}
	return "", ""
}

type callKey struct{}

// WithCall returns ctx carrying c.
func WithCall(ctx context.Context, c *Call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// NotePassed adds n bytes read from a passed descriptor to the call in
// ctx.
func NotePassed(ctx context.Context, n int64) {
	if c, ok := ctx.Value(callKey{}).(*Call); ok {
		c.Passed.Add(n)
	}
}

// NoteGrant records, for the call in ctx, which grant it acts under and
// for which task (the broker's hook, once a token is resolved). Only ids
// are kept: never the token.
func NoteGrant(ctx context.Context, id, task string) {
	if c, ok := ctx.Value(callKey{}).(*Call); ok {
		c.grant.Store(&grantNote{id: id, task: task})
	}
}
