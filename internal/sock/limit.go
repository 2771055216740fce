package sock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
)

// AdmitLimits bound one socket. Connections are counted at accept, calls
// at stream creation (before any message byte is read), both per peer uid
// (SO_PEERCRED) and in total. The daemon's own uid (the host's tools) is
// not held to the per-uid limits and has room in the totals that the
// others cannot take.
type AdmitLimits struct {
	MaxConns       int // connections on the socket
	MaxCalls       int // calls (streams) in flight on the socket
	MaxConnsPerUID int
	MaxCallsPerUID int
	// ReservedConns and ReservedCalls are kept for OwnUID: other uids
	// share MaxConns-ReservedConns and MaxCalls-ReservedCalls. A reserve
	// is capped at half its total, so that others always get in.
	ReservedConns int
	ReservedCalls int
	OwnUID        int
	// RequestTimeout bounds how long a call's request may take to arrive
	// whole: a unary request, or a stream's first message.
	RequestTimeout time.Duration
	// SendTimeout cuts a stream whose reader takes none of a message for
	// this long.
	SendTimeout time.Duration
}

// The HTTP/2 sizes of every socket's server (Admission.Server), part of
// the memory budgets of bushostd and sandbox serve (docs/limits.md).
const (
	// StreamWindow and ConnWindow are the HTTP/2 flow-control windows:
	// what a peer may send before the server reads it. Setting them turns
	// off grpc's window growth (BDP estimation), which would let a peer
	// grow them to megabytes per connection.
	StreamWindow = 64 << 10
	ConnWindow   = 256 << 10
	// IOBuffer is each connection's read and write buffer.
	IOBuffer = 32 << 10
)

// Server is a gRPC server on the socket a admits (its listener wrapped
// in a.Listener, its streams admitted by a.Tap): it reads each peer's
// credentials (PeerCred, with passFDs), bounds a message to maxMsg bytes
// and a connection to maxStreams streams and maxHeader bytes of headers,
// has the windows and buffers above, closes a connection idle for idle,
// and wants a peer's handshake (SO_PEERCRED, HTTP/2 preface) within the
// request timeout. opts add the interceptors.
func (a *Admission) Server(passFDs bool, maxMsg int, maxStreams, maxHeader uint32, idle time.Duration, opts ...grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append([]grpc.ServerOption{
		grpc.Creds(PeerCred{PassFDs: passFDs}),
		grpc.MaxRecvMsgSize(maxMsg),
		grpc.MaxConcurrentStreams(maxStreams),
		grpc.MaxHeaderListSize(maxHeader),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(ConnWindow),
		grpc.ReadBufferSize(IOBuffer),
		grpc.WriteBufferSize(IOBuffer),
		grpc.ConnectionTimeout(a.lim.RequestTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle, Time: idle, Timeout: a.lim.RequestTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second}),
		grpc.InTapHandle(a.Tap),
	}, opts...)...)
}

// Admission applies AdmitLimits to one socket: Listener closes
// connections over the limits at accept, Tap refuses streams over the
// limits before they are read, and Unary/Stream enforce the request and
// send deadlines.
type Admission struct {
	lim AdmitLimits

	mu        sync.Mutex
	conns     tally
	calls     tally
	onRefused func(reason errdefs.Reason) // tests and logs; may be nil
}

// NewAdmission returns the admission of one socket.
func NewAdmission(l AdmitLimits) *Admission {
	l.ReservedConns = min(l.ReservedConns, l.MaxConns/2)
	l.ReservedCalls = min(l.ReservedCalls, l.MaxCalls/2)
	return &Admission{lim: l,
		conns: tally{max: l.MaxConns, reserved: l.ReservedConns, perUID: l.MaxConnsPerUID, by: map[uint32]int{},
			what: "connections", where: "to this socket", flag: "--max-conns-per-uid", then: "close some and retry",
			full: errdefs.TooManyConns, uidFull: errdefs.TooManyConnsPerUID},
		calls: tally{max: l.MaxCalls, reserved: l.ReservedCalls, perUID: l.MaxCallsPerUID, by: map[uint32]int{},
			what: "calls in flight", where: "on this socket", flag: "--max-calls-per-uid", then: "retry later",
			full: errdefs.TooManyCalls, uidFull: errdefs.TooManyCallsPerUID},
	}
}

// tally counts what a socket admits of one kind (connections or calls),
// in all and per peer uid, against its limits. The rest words its
// refusals: "too many WHAT WHERE (limit N); THEN" (reason full), and
// "too many WHAT from uid U (limit N, FLAG); THEN" (reason uidFull).
type tally struct {
	n                       int
	by                      map[uint32]int
	max, reserved, perUID   int
	what, where, flag, then string
	full, uidFull           errdefs.Reason
}

// admit counts one more of uid in t (a.conns or a.calls), or says why
// not. The daemon's own uid is not held to perUID and may use the
// reserve, which others may not.
func (a *Admission) admit(t *tally, uid uint32) *errdefs.Error {
	a.mu.Lock()
	defer a.mu.Unlock()
	own := int(uid) == a.lim.OwnUID
	total := t.max
	if !own {
		total -= t.reserved
	}
	if t.n >= total {
		return errdefs.ResourceExhausted(t.full, "too many %s %s (limit %d); %s", t.what, t.where, total, t.then).
			With("limit", total).Retry(time.Second)
	}
	if !own && t.by[uid] >= t.perUID {
		return errdefs.ResourceExhausted(t.uidFull, "too many %s from uid %d (limit %d, %s); %s", t.what, uid, t.perUID, t.flag, t.then).
			With("limit", t.perUID).With("uid", uid).Retry(time.Second)
	}
	t.n++
	t.by[uid]++
	return nil
}

func (a *Admission) release(t *tally, uid uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t.n--
	if t.by[uid]--; t.by[uid] <= 0 {
		delete(t.by, uid)
	}
}

// GrantSlots counts what each grant holds of one kind (calls in flight,
// streams), on any number of sockets, by its token's hash: a grant has
// exactly one token, so that costs no store lookup before the call is
// admitted, and a call with an unknown token, counted the same way, is
// refused by the service right after. The host's admin token, and a call
// with none, are not counted.
type GrantSlots struct {
	admin [sha256.Size]byte
	mu    sync.Mutex
	n     map[[sha256.Size]byte]int
}

// NewGrantSlots counts the slots of every grant but the host's.
func NewGrantSlots(adminToken string) *GrantSlots {
	return &GrantSlots{admin: sha256.Sum256([]byte(adminToken)), n: map[[sha256.Size]byte]int{}}
}

// Take takes one of the max slots of the grant of ctx's token, or
// returns full(n), n being what it holds; release gives the slot back.
func (g *GrantSlots) Take(ctx context.Context, max int, full func(n int) error) (release func(), err error) {
	tok := authz.TokenFromContext(ctx)
	k := sha256.Sum256([]byte(tok))
	if tok == "" || subtle.ConstantTimeCompare(k[:], g.admin[:]) == 1 {
		return func() {}, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := g.n[k]; n >= max {
		return nil, full(n)
	}
	g.n[k]++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.n[k]--; g.n[k] <= 0 {
			delete(g.n, k)
		}
	}, nil
}

// Unary is a grpc.UnaryServerInterceptor that holds one of the call's
// grant's slots (Take) while the call runs.
func (g *GrantSlots) Unary(max int, full func(n int) error) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		release, err := g.Take(ctx, max, full)
		if err != nil {
			return nil, err
		}
		defer release()
		return h(ctx, req)
	}
}

// OnRefused sets a function told of every refusal (for the daemon's log).
func (a *Admission) OnRefused(f func(errdefs.Reason)) { a.onRefused = f }

func (a *Admission) refused(r errdefs.Reason) {
	if a.onRefused != nil {
		a.onRefused(r)
	}
}

// Counts reports the connections and calls now admitted (for tests).
func (a *Admission) Counts() (conns, calls int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conns.n, a.calls.n
}

// Listener wraps l: a connection over the limits is told why (an HTTP/2
// GOAWAY carrying the reason) and closed at accept, before the daemon
// gives it a transport.
func (a *Admission) Listener(l net.Listener) net.Listener {
	return &admitListener{Listener: l, a: a}
}

type admitListener struct {
	net.Listener
	a *Admission
}

func (l *admitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := peerCred(c)
		if err != nil {
			c.Close()
			continue
		}
		if e := l.a.admit(&l.a.conns, cred.Uid); e != nil {
			l.a.refused(e.Reason)
			go refuseConn(c, e)
			continue
		}
		return &countedConn{Conn: c, a: l.a, cred: cred}, nil
	}
}

// refuseConn tells the peer why in its own terms and closes c. A gRPC
// client's first call gets the refusal as its status (e's code, reason
// and retry, as any call's refusal), then a GOAWAY (ENHANCE_YOUR_CALM, the
// message as its debug data) ends the connection: a bare GOAWAY reaches a
// gRPC client only as "the connection is draining", and a socket closed
// under a client still writing its preface fails that write (EPIPE), so
// neither says why. The exchange is bounded: refuseLinger in all, a few
// frames, and at most maxLingering refusals at once; past that, c gets the
// bare GOAWAY and is closed at once.
func refuseConn(c net.Conn, e *errdefs.Error) {
	defer c.Close()
	select {
	case lingering <- struct{}{}:
		defer func() { <-lingering }()
	default:
		c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		fr := http2.NewFramer(c, nil)
		if fr.WriteSettings() == nil {
			fr.WriteGoAway(0, http2.ErrCodeEnhanceYourCalm, []byte(string(e.Reason)+": "+e.Message))
		}
		return
	}
	c.SetDeadline(time.Now().Add(refuseLinger))
	fr := http2.NewFramer(c, c)
	// HTTP/2's smallest frame bound: a refused peer gets no more memory
	// than that (the default would let it claim 16 MiB a frame).
	fr.SetMaxReadFrameSize(16 << 10)
	if fr.WriteSettings() != nil {
		return
	}
	stream := uint32(0)
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c, preface[:]); err == nil && string(preface[:]) == http2.ClientPreface {
		for i := 0; i < 16 && stream == 0; i++ {
			f, err := fr.ReadFrame()
			if err != nil {
				break
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() && fr.WriteSettingsAck() != nil {
					return
				}
			case *http2.HeadersFrame:
				stream = f.StreamID
			}
		}
	}
	if stream != 0 {
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: grpcRefusal(e), EndStream: true, EndHeaders: true}); err != nil {
			return
		}
	}
	if fr.WriteGoAway(stream, http2.ErrCodeEnhanceYourCalm, []byte(string(e.Reason)+": "+e.Message)) != nil {
		return
	}
	// Wait for the peer to hang up, so that it reads all of the above.
	io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// Bounds of a refused connection's exchange (refuseConn).
const (
	refuseLinger = time.Second
	maxLingering = 64
)

var lingering = make(chan struct{}, maxLingering)

// grpcRefusal is the header block of a trailers-only gRPC response
// carrying e as its status, as a handler's error is sent: no handler runs
// here, so this is one of the few places that call grpcerr itself.
func grpcRefusal(e *errdefs.Error) []byte {
	st := status.Convert(grpcerr.ToStatus(e))
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	fields := [][2]string{
		{":status", "200"},
		{"content-type", "application/grpc"},
		{"grpc-status", strconv.Itoa(int(st.Code()))},
		{"grpc-message", percentEncode(st.Message())},
	}
	if details, err := proto.Marshal(st.Proto()); err == nil {
		fields = append(fields, [2]string{"grpc-status-details-bin", base64.RawStdEncoding.EncodeToString(details)})
	}
	for _, f := range fields {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return b.Bytes()
}

// percentEncode encodes grpc-message as the gRPC wire protocol says:
// bytes outside printable ASCII, and '%', as %XX.
func percentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x20 && c <= 0x7e && c != '%' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

type countedConn struct {
	net.Conn
	a    *Admission
	cred *syscall.Ucred
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.a.release(&c.a.conns, c.cred.Uid) })
	return c.Conn.Close()
}

// NetConn returns the connection under the wrapper.
func (c *countedConn) NetConn() net.Conn { return c.Conn }

// guard is what Tap attaches to an admitted stream: its cancel (with a
// cause), and the timer that ends it if its request does not arrive.
type guard struct {
	cancel  context.CancelCauseFunc
	request *time.Timer
	once    sync.Once
}

type guardKey struct{}

// Tap is a grpc.InTapHandle: it admits a stream when its headers arrive,
// before any of its messages is read, or refuses it with
// ResourceExhausted. The slot is freed when the stream ends, whatever
// ends it. A refusal here comes before any interceptor, so it is a status
// already (grpcerr.ToStatus).
func (a *Admission) Tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	ai, ok := authInfo(ctx)
	if !ok {
		return ctx, grpcerr.ToStatus(errdefs.PermissionDenied(errdefs.InternalError, "no peer credentials on this connection"))
	}
	uid := uint32(ai.Peer.UID)
	if e := a.admit(&a.calls, uid); e != nil {
		a.refused(e.Reason)
		return ctx, grpcerr.ToStatus(e)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	ctx = cutCtx{cctx}
	g := &guard{cancel: cancel}
	if a.lim.RequestTimeout > 0 {
		d := a.lim.RequestTimeout
		g.request = time.AfterFunc(d, func() {
			cancel(errdefs.DeadlineExceeded(errdefs.RequestTooSlow, "the request did not arrive whole within %s (--request-timeout)", d).With("limit", d))
		})
	}
	context.AfterFunc(ctx, func() {
		g.requestArrived()
		a.release(&a.calls, uid)
	})
	return context.WithValue(ctx, guardKey{}, g), nil
}

func (g *guard) requestArrived() {
	g.once.Do(func() {
		if g.request != nil {
			g.request.Stop()
		}
	})
}

// cutCtx reports a guard's cut as DeadlineExceeded rather than Canceled:
// grpc turns the context's error into the status of a call whose handler
// never ran (a unary request that never arrived), and a cut is a deadline.
type cutCtx struct{ context.Context }

func (c cutCtx) Err() error {
	err := c.Context.Err()
	if err == context.Canceled {
		if _, ok := context.Cause(c.Context).(*errdefs.Error); ok {
			return context.DeadlineExceeded
		}
	}
	return err
}

func guardOf(ctx context.Context) *guard {
	g, _ := ctx.Value(guardKey{}).(*guard)
	return g
}

// Unary is a grpc.UnaryServerInterceptor: it runs once the request
// arrived whole, so it stops the request timer.
func (a *Admission) Unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	g := guardOf(ctx)
	if g == nil {
		return h(ctx, req)
	}
	g.requestArrived()
	resp, err := h(ctx, req)
	return resp, a.why(ctx, err)
}

// Stream is a grpc.StreamServerInterceptor: the request timer stops at
// the stream's first message, and every send must progress within
// SendTimeout.
func (a *Admission) Stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	g := guardOf(ss.Context())
	if g == nil {
		return h(srv, ss)
	}
	err := h(srv, &guardedStream{ServerStream: ss, g: g, send: a.lim.SendTimeout})
	return a.why(ss.Context(), err)
}

// why turns the cut of a guarded stream (a timer of its guard, or Cut)
// into the cause (an *errdefs.Error); any other error passes unchanged.
func (a *Admission) why(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if e, ok := context.Cause(ctx).(*errdefs.Error); ok {
		a.refused(e.Reason)
		return e
	}
	return err
}

type guardedStream struct {
	grpc.ServerStream
	g    *guard
	send time.Duration
}

func (s *guardedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.g.requestArrived()
	}
	return err
}

func (s *guardedStream) SendMsg(m any) error {
	if s.send <= 0 {
		return s.ServerStream.SendMsg(m)
	}
	d := s.send
	t := time.AfterFunc(d, func() {
		s.g.cancel(errdefs.DeadlineExceeded(errdefs.SendStalled, "the reader took nothing for %s (--send-timeout); stream cut", d).With("limit", d))
	})
	defer t.Stop()
	return s.ServerStream.SendMsg(m)
}

// Cut ends the stream of ctx with cause, as a guard's timers do: a
// blocked read or send on it returns, and the call ends with cause's
// status. It reports false for a context no Tap admitted.
func Cut(ctx context.Context, cause *errdefs.Error) bool {
	g := guardOf(ctx)
	if g == nil {
		return false
	}
	g.cancel(cause)
	return true
}

// peerCred reads SO_PEERCRED of the Unix connection under c's wrappers
// (unixConn).
func peerCred(c net.Conn) (*syscall.Ucred, error) {
	u := unixConn(c)
	if u == nil {
		return nil, errors.New("peercred: not a unix connection")
	}
	raw, err := u.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}
