package sock

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/bushost/bushost/internal/authz"
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
	l, err := Listen(path, 0o660)
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
	if _, err := Listen(path, 0o660); err == nil {
		t.Fatal("a second listener took a socket that is being served")
	}
	// A socket left by a dead process is replaced: make one without
	// unlinking it on close.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	l2, err := Listen(path, 0o660)
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
	if _, err := Listen(plain, 0o660); err == nil {
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
}

func serve(t *testing.T, maxConns, maxInFlight int) *server {
	t.Helper()
	s := &server{path: filepath.Join(shortDir(t), "h.sock"), seen: make(chan authz.Peer, 16)}
	l, err := Listen(s.path, 0o660)
	if err != nil {
		t.Fatal(err)
	}
	lim := NewLimiter(maxInFlight)
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if p, ok := PeerFromContext(ctx); ok {
			s.seen <- p
		}
		return h(ctx, req)
	}
	s.srv = grpc.NewServer(grpc.Creds(PeerCred{}), grpc.ChainUnaryInterceptor(lim.Unary, record), grpc.StreamInterceptor(lim.Stream))
	healthpb.RegisterHealthServer(s.srv, health.NewServer())
	go s.srv.Serve(LimitConns(l, maxConns))
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

func TestConnectionLimit(t *testing.T) {
	s := serve(t, 1, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := s.client(t)
	if _, err := first.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := s.client(t).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("call on a connection past the limit: %v, want ResourceExhausted", err)
	}
	// The first client is still served.
	if _, err := first.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}
