package daemon

// What an operator sees of bushostd: gRPC health checking and reflection
// on both sockets, one log line per call, the Prometheus listener, and the
// drain grace that lets probes see NOT_SERVING before the sockets close.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/metrics"
	"github.com/bushost/bushost/internal/sock"
)

// Observe configures what bushostd tells an operator.
type Observe struct {
	// LogFormat is "text" (default) or "json"; LogLevel is debug, info
	// (default), warn or error. Both apply when Options.Logger is nil.
	LogFormat string
	LogLevel  string
	// MetricsAddr, when set, serves Prometheus metrics at /metrics on
	// host:port or unix:PATH. Empty: no listener.
	MetricsAddr string
	// DrainGrace is how long a stop keeps answering health checks with
	// NOT_SERVING (and refusing new calls with Unavailable) before it
	// closes the sockets (default 2s).
	DrainGrace time.Duration
}

// DefaultDrainGrace is Observe.DrainGrace's default.
const DefaultDrainGrace = 2 * time.Second

// healthInterval is how often the broker's store is probed for the health
// status.
const healthInterval = 5 * time.Second

func (ob *Observe) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&ob.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&ob.LogLevel, "log-level", "info", "least severe log level written: debug, info, warn or error")
	fs.StringVar(&ob.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics at /metrics on 127.0.0.1:PORT or unix:PATH (default: off)")
	fs.DurationVar(&ob.DrainGrace, "drain-grace", DefaultDrainGrace, "on SIGTERM, how long health checks answer NOT_SERVING (new calls get Unavailable) before the sockets close")
}

// nextSteps is what a person who just started bushostd does next, printed
// once it serves (text logs only: a JSON log stays one object a line).
func nextSteps(home string) string {
	if abs, err := filepath.Abs(home); err == nil {
		home = abs
	}
	return fmt.Sprintf(`
bushostd serves on %[1]s. Next, as the host (who reads %[1]s/admin.token), in another shell:
  export BUSHOST_HOME=%[1]s
  bushost project add --business acme --project web --root /path/to/a/git/repository
  bushost task add --business acme --project web --task t1
  bushost grant --business acme --project web --task t1 --role worker --cap git.push.working,review.request --out worker.token
The whole flow, and a session that uses the token: README.md, "Usage". Sessions launched by agents need the launcher beside it: sandbox serve --home %[1]s (as root).

`, home)
}

// observer is the interceptor of one socket: it refuses new calls during a
// drain, counts and logs each call. Health and reflection pass untouched:
// they carry no token and must keep answering during the drain.
type observer struct {
	socket   string
	log      *slog.Logger
	drain    *drainState
	inFlight prometheus.Gauge
}

func newObserver(socket string, log *slog.Logger, drain *drainState) *observer {
	return &observer{socket: socket, log: log, drain: drain, inFlight: metrics.InFlight.WithLabelValues(socket)}
}

// drainState is the stop's two steps, shared by both sockets: from begin,
// health is NOT_SERVING and new calls are refused; at end (after the
// grace), health watches and reflection streams are ended, which would
// otherwise hold the graceful stop until --drain-timeout.
type drainState struct {
	draining atomic.Bool
	closing  context.Context
	end      context.CancelFunc
}

func newDrainState() *drainState {
	d := &drainState{}
	d.closing, d.end = context.WithCancel(context.Background())
	return d
}

func (d *drainState) begin(hs []healthOf) {
	d.draining.Store(true)
	for _, h := range hs {
		h.Shutdown()
	}
}

func passThrough(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.") || strings.HasPrefix(method, "/grpc.reflection.")
}

func (ob *observer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if passThrough(info.FullMethod) {
		return h(ctx, req)
	}
	if ob.drain.draining.Load() {
		return nil, shuttingDown()
	}
	c, start := &metrics.Call{}, time.Now()
	ob.inFlight.Inc()
	resp, err := h(metrics.WithCall(ctx, c), req)
	ob.inFlight.Dec()
	c.Bytes.Add(int64(msgSize(req) + msgSize(resp)))
	ob.done(ctx, info.FullMethod, c, start, err)
	return resp, err
}

func (ob *observer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if passThrough(info.FullMethod) {
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		stop := context.AfterFunc(ob.drain.closing, cancel)
		defer stop()
		return h(srv, &countedStream{ServerStream: ss, ctx: ctx, c: &metrics.Call{}})
	}
	if ob.drain.draining.Load() {
		return shuttingDown()
	}
	c, start := &metrics.Call{}, time.Now()
	ob.inFlight.Inc()
	err := h(srv, &countedStream{ServerStream: ss, ctx: metrics.WithCall(ss.Context(), c), c: c})
	ob.inFlight.Dec()
	ob.done(ss.Context(), info.FullMethod, c, start, err)
	return err
}

func shuttingDown() error {
	return errdefs.Unavailable(errdefs.ShuttingDown, "bushostd is shutting down; retry when it is back")
}

// done counts the call and writes its log line.
func (ob *observer) done(ctx context.Context, method string, c *metrics.Call, start time.Time, err error) {
	d := time.Since(start)
	outcome, kind := "OK", errdefs.KindOK
	var e *errdefs.Error
	if err != nil {
		e = grpcerr.Of(err)
		kind, outcome = e.Kind, cmp.Or(string(e.Reason), e.Kind.String())
	}
	metrics.Calls.WithLabelValues(ob.socket, method, outcome).Inc()
	switch method {
	case gitv1.GitService_PushWorking_FullMethodName:
		metrics.Pushes.WithLabelValues(outcome).Inc()
		metrics.PushSeconds.Observe(d.Seconds())
		metrics.PushBytes.Add(float64(c.Bytes.Load() + c.Passed.Load()))
	case brokerv1.BrokerService_CloseTask_FullMethodName:
		decision := outcome
		if err == nil {
			decision = "closed"
		}
		metrics.Gate.WithLabelValues(decision).Inc()
	}
	if kind == errdefs.KindResourceExhausted {
		metrics.LimitRefusals.WithLabelValues(ob.socket, outcome).Inc()
	}
	lvl := slog.LevelInfo
	if kind == errdefs.KindInternal || kind == errdefs.KindUnknown || kind == errdefs.KindDataLoss {
		lvl = slog.LevelError
	}
	if !ob.log.Enabled(ctx, lvl) {
		return
	}
	grant, task := c.Grant()
	p, _ := sock.PeerFromContext(ctx)
	attrs := []slog.Attr{
		slog.String("socket", ob.socket),
		slog.String("method", method),
		slog.Int("pid", int(p.PID)),
		slog.Int("uid", int(p.UID)),
		slog.String("grant", grant),
		slog.String("task", task),
		slog.String("outcome", outcome),
		slog.String("code", kind.String()),
		slog.Int64("bytes", c.Bytes.Load()),
		slog.Duration("duration", d),
	}
	if n := c.Passed.Load(); n > 0 {
		attrs = append(attrs, slog.Int64("passed", n))
	}
	if e != nil {
		attrs = append(attrs, slog.String("error", e.Message))
	}
	ob.log.LogAttrs(ctx, lvl, "call", attrs...)
}

// countedStream counts a stream's payload bytes and carries the call
// record in its context.
type countedStream struct {
	grpc.ServerStream
	ctx context.Context
	c   *metrics.Call
}

func (s *countedStream) Context() context.Context { return s.ctx }

func (s *countedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.c.Bytes.Add(int64(msgSize(m)))
	}
	return err
}

func (s *countedStream) SendMsg(m any) error {
	s.c.Bytes.Add(int64(msgSize(m)))
	return s.ServerStream.SendMsg(m)
}

func msgSize(m any) int {
	if pm, ok := m.(proto.Message); ok && pm != nil {
		return proto.Size(pm)
	}
	return 0
}

// healthOf is one socket's health server and the service names it answers
// for ("" is the whole server).
type healthOf struct {
	*health.Server
	services []string
}

func (h healthOf) set(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, s := range h.services {
		h.SetServingStatus(s, st)
	}
}

// healthFor registers health checking and reflection on srv, SERVING for
// the whole server ("") and for service. Neither asks for a token: they
// tell nothing a member of the socket's group cannot already see.
func healthFor(srv *grpc.Server, service string) healthOf {
	h := healthOf{Server: health.NewServer(), services: []string{"", service}}
	healthpb.RegisterHealthServer(srv, h.Server)
	reflection.Register(srv)
	h.set(healthpb.HealthCheckResponse_SERVING)
	return h
}

// watchStore turns every health server NOT_SERVING while ping fails, and
// back to SERVING once it answers, until ctx ends.
func watchStore(ctx context.Context, log *slog.Logger, ping func(context.Context) error, hs []healthOf) {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	healthy := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, healthInterval)
		err := ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if (err == nil) == healthy {
			continue
		}
		healthy = err == nil
		st := healthpb.HealthCheckResponse_SERVING
		if !healthy {
			st = healthpb.HealthCheckResponse_NOT_SERVING
			log.Error("broker store unreachable: health is NOT_SERVING", "err", err)
		} else {
			log.Info("broker store reachable again: health is SERVING")
		}
		for _, h := range hs {
			h.set(st)
		}
	}
}

// serveMetrics starts the Prometheus listener on addr (host:port or
// unix:PATH) and returns a function that closes it.
func serveMetrics(addr string, log *slog.Logger) (func(), error) {
	network, where := "tcp", addr
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, where = "unix", p
	}
	var l net.Listener
	var err error
	if network == "unix" {
		l, err = sock.Listen(where, 0o660, -1)
	} else {
		l, err = net.Listen(network, where)
	}
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics listener stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", l.Addr().String())
	return func() { srv.Close() }, nil
}

// countConns wraps l so that the connections open on it are a gauge.
func countConns(l net.Listener, socket string) net.Listener {
	return &gaugeListener{Listener: l, g: metrics.Conns.WithLabelValues(socket)}
}

type gaugeListener struct {
	net.Listener
	g prometheus.Gauge
}

func (l *gaugeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.g.Inc()
	return &gaugeConn{Conn: c, g: l.g}, nil
}

type gaugeConn struct {
	net.Conn
	g      prometheus.Gauge
	closed atomic.Bool
}

// NetConn returns the connection under the wrapper.
func (c *gaugeConn) NetConn() net.Conn { return c.Conn }

func (c *gaugeConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.g.Dec()
	}
	return c.Conn.Close()
}
