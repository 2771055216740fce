package sock

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/testenv"
)

func shortDir(t *testing.T) string {
	t.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir() can be long.
	d, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func TestListenModeAndStaleSocket(t *testing.T) {
	path := filepath.Join(shortDir(t), "x.sock")
	l, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode = %v, %v", fi.Mode(), err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if _, err := Listen(path, 0o660, -1); err == nil {
		t.Fatal("a second listener took a socket that is being served")
	}
	// A socket left by a dead process is replaced: make one without
	// unlinking it on close.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	l2, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	l2.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("socket file left after close")
	}
	// Anything but a socket is never removed.
	plain := filepath.Join(filepath.Dir(path), "plain")
	os.WriteFile(plain, []byte("keep"), 0o600)
	if _, err := Listen(plain, 0o660, -1); err == nil {
		t.Fatal("Listen replaced a regular file")
	}
	if b, _ := os.ReadFile(plain); string(b) != "keep" {
		t.Fatal("regular file changed")
	}
}

type server struct {
	path string
	srv  *grpc.Server
	seen chan authz.Peer
	adm  *Admission
}

func serve(t *testing.T, maxConns, maxInFlight int) *server {
	t.Helper()
	return serveWith(t, AdmitLimits{MaxConns: maxConns, MaxCalls: maxInFlight, MaxConnsPerUID: maxConns, MaxCallsPerUID: maxInFlight, OwnUID: -1})
}

func serveWith(t *testing.T, lim AdmitLimits) *server {
	t.Helper()
	s := &server{path: filepath.Join(shortDir(t), "h.sock"), seen: make(chan authz.Peer, 16)}
	l, err := Listen(s.path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	s.adm = NewAdmission(lim)
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if p, ok := PeerFromContext(ctx); ok {
			s.seen <- p
		}
		return h(ctx, req)
	}
	s.srv = grpc.NewServer(grpc.Creds(PeerCred{}), grpc.InTapHandle(s.adm.Tap), grpc.ChainUnaryInterceptor(grpcerr.UnaryServer, s.adm.Unary, record), grpc.ChainStreamInterceptor(grpcerr.StreamServer, s.adm.Stream))
	healthpb.RegisterHealthServer(s.srv, health.NewServer())
	go s.srv.Serve(s.adm.Listener(l))
	t.Cleanup(s.srv.Stop)
	return s
}

func (s *server) client(t *testing.T) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+s.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func TestPeerCredentialsReachTheCall(t *testing.T) {
	s := serve(t, 4, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.client(t).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	p := <-s.seen
	if p.PID != int32(os.Getpid()) || p.UID != int32(os.Getuid()) {
		t.Fatalf("peer = %+v, want pid %d uid %d", p, os.Getpid(), os.Getuid())
	}
}

func TestInFlightLimit(t *testing.T) {
	s := serve(t, 8, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := s.client(t)
	// Watch holds its slot for as long as the stream is open.
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call: %v, want ResourceExhausted", err)
	}
	cancel()
	// Once the stream ends, the slot frees up.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = c.Check(ctx2, &healthpb.HealthCheckRequest{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot never freed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A connection past the limit is closed at accept, with the reason in a
// GOAWAY; the first client is still served, and a freed slot is reused.
func TestConnectionLimit(t *testing.T) {
	s := serve(t, 1, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := s.client(t)
	if _, err := first.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := s.client(t).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	if err == nil {
		t.Fatal("call on a connection past the limit was served")
	}
	// The refused connection's call gets the refusal as its status: the
	// reason, the limit and when to retry, not "the connection is
	// draining".
	if e := grpcerr.FromStatus(err); e.Kind != errdefs.KindResourceExhausted || e.Reason != errdefs.TooManyConns || e.Metadata["limit"] != "1" || e.RetryAfter != time.Second {
		t.Fatalf("call past the connection limit: %v (%+v), want TOO_MANY_CONNECTIONS limit 1", err, e)
	}
	waitFor(t, func() bool { return len(lingering) == 0 }, "the refused connection still lingers")
	if conns, _ := s.adm.Counts(); conns != 1 {
		t.Fatalf("%d connections counted, want 1", conns)
	}
	// The first client is still served.
	if _, err := first.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

// The daemon's own uid has room the others cannot take, and is not held
// to the per-uid limit.
func TestReservedRoomForOwnUID(t *testing.T) {
	own := os.Getuid()
	for _, c := range []struct {
		name  string
		owner int
		ok    bool
	}{{"own uid gets the reserve", own, true}, {"another uid does not", own + 1, false}} {
		t.Run(c.name, func(t *testing.T) {
			s := serveWith(t, AdmitLimits{MaxConns: 4, MaxCalls: 2, MaxConnsPerUID: 4, MaxCallsPerUID: 1, ReservedCalls: 1, OwnUID: c.owner})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cl := s.client(t)
			w, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Recv(); err != nil {
				t.Fatal(err)
			}
			_, err = cl.Check(ctx, &healthpb.HealthCheckRequest{})
			if c.ok && err != nil {
				t.Fatalf("second call of the own uid: %v", err)
			}
			if !c.ok {
				e := grpcerr.FromStatus(err)
				if e.Kind != errdefs.KindResourceExhausted || e.Reason != errdefs.TooManyCalls || e.Metadata["limit"] != "1" {
					t.Fatalf("second call of another uid: %v (%+v), want TOO_MANY_CALLS limit 1", err, e)
				}
			}
		})
	}
}

// A unary request that never arrives whole is cut after RequestTimeout
// with its reason, and frees its slot.
func TestRequestTimeout(t *testing.T) {
	s := serveWith(t, AdmitLimits{MaxConns: 4, MaxCalls: 1, MaxConnsPerUID: 4, MaxCallsPerUID: 1, OwnUID: -1, RequestTimeout: 300 * time.Millisecond})
	c, err := net.Dial("unix", s.path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fr := http2.NewFramer(c, c)
	c.Write([]byte(http2.ClientPreface))
	fr.WriteSettings()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Check"}, {":authority", "x"}, {"content-type", "application/grpc"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	// A message header announcing 100 bytes, then only 3 of them.
	fr.WriteData(1, false, []byte{0, 0, 0, 0, 100, 1, 2, 3})
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 1 && h.StreamEnded() {
			fields, err := hpack.NewDecoder(4096, nil).DecodeFull(h.HeaderBlockFragment())
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for _, hf := range fields {
				if hf.Name == "grpc-status" {
					got = hf.Value
				}
			}
			if got != strconv.Itoa(int(codes.DeadlineExceeded)) {
				t.Fatalf("stream ended with %v, want grpc-status DeadlineExceeded", fields)
			}
			break
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cut after %v", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, calls := s.adm.Counts(); calls == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot was never freed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor polls cond until it holds, failing after ten seconds.
func waitFor(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, msg, cond)
}
