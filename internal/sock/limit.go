package sock

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc"

	"github.com/bushost/bushost/internal/errdefs"
)

// Limiter bounds the calls in flight on one server. A call beyond the bound
// is refused at once with ResourceExhausted rather than queued, so a flood
// from one client cannot make everyone else wait.
type Limiter struct {
	slots chan struct{}
}

// NewLimiter allows n calls at a time.
func NewLimiter(n int) *Limiter {
	return &Limiter{slots: make(chan struct{}, n)}
}

func (l *Limiter) acquire(ctx context.Context) error {
	if overConn(ctx) {
		return errdefs.ToGRPC(errdefs.ResourceExhausted(errdefs.TooManyConns, "too many connections to this socket; close some and retry"))
	}
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
		return errdefs.ToGRPC(errdefs.ResourceExhausted(errdefs.TooManyCalls, "too many calls in flight on this socket (limit %d); retry later", cap(l.slots)).With("limit", cap(l.slots)))
	}
}

func (l *Limiter) release() { <-l.slots }

// Unary is a grpc.UnaryServerInterceptor applying the limit.
func (l *Limiter) Unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := l.acquire(ctx); err != nil {
		return nil, err
	}
	defer l.release()
	return h(ctx, req)
}

// Stream is a grpc.StreamServerInterceptor applying the limit.
func (l *Limiter) Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := l.acquire(ss.Context()); err != nil {
		return err
	}
	defer l.release()
	return h(srv, ss)
}

// LimitConns wraps l so that connections beyond max are marked: every call
// on them is refused with ResourceExhausted (a clear answer rather than a
// silent close). Beyond twice max, connections are closed at once, so that
// a flood cannot exhaust the daemon's file descriptors.
func LimitConns(l net.Listener, max int) net.Listener {
	return &limitListener{Listener: l, max: int64(max)}
}

type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		n := l.open.Add(1)
		if n > 2*l.max {
			l.open.Add(-1)
			c.Close()
			continue
		}
		return &countedConn{Conn: c, l: l, over: n > l.max}, nil
	}
}

type countedConn struct {
	net.Conn
	l    *limitListener
	over bool
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

// SyscallConn lets the handshake read SO_PEERCRED through the wrapper.
func (c *countedConn) SyscallConn() (syscall.RawConn, error) {
	if sc, ok := c.Conn.(syscall.Conn); ok {
		return sc.SyscallConn()
	}
	return nil, syscall.EINVAL
}

func overConn(ctx context.Context) bool {
	ai, ok := authInfo(ctx)
	return ok && ai.Over
}
