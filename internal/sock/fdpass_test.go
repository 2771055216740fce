package sock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// fdHealth reports through got what each Check call's passed descriptor
// holds (its first bytes), or why it has none.
type fdHealth struct {
	healthpb.UnimplementedHealthServer
	got chan string
}

func (h *fdHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	f, offered, err := PassedFD(ctx)
	switch {
	case !offered:
		h.got <- "none"
	case err != nil:
		h.got <- "error: " + err.Error()
	default:
		b := make([]byte, 64)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		h.got <- string(b[:n])
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func serveFDs(t *testing.T, pass bool) (*FDDialer, *fdHealth) {
	t.Helper()
	path := filepath.Join(shortDir(t), "f.sock")
	l, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	adm := NewAdmission(AdmitLimits{MaxConns: 8, MaxCalls: 8, MaxConnsPerUID: 8, MaxCallsPerUID: 8, OwnUID: -1})
	srv := grpc.NewServer(grpc.Creds(PeerCred{PassFDs: pass}))
	h := &fdHealth{got: make(chan string, 8)}
	healthpb.RegisterHealthServer(srv, h)
	go srv.Serve(adm.Listener(l))
	t.Cleanup(srv.Stop)
	return &FDDialer{Path: path}, h
}

func fdClient(t *testing.T, d *FDDialer) healthpb.HealthClient {
	c, _ := fdClientConn(t, d)
	return c
}

func fdClientConn(t *testing.T, d *FDDialer) (healthpb.HealthClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+d.Path, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(d.Dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn), conn
}

func tempFile(t *testing.T, content string) *os.File {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// Descriptors passed on the connection reach the calls that name them, in
// order, on the first connection (passed with its preface) and after; a
// call that names none, or one never passed, is told so.
func TestPassedFDReachesTheCall(t *testing.T) {
	d, h := serveFDs(t, true)
	c := fdClient(t, d)
	check := func(seq uint64, want string) {
		t.Helper()
		ctx := context.Background()
		if seq > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, PassedFDKey, fmt.Sprint(seq))
		}
		if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := <-h.got; got != want {
			t.Fatalf("descriptor %d: got %q, want %q", seq, got, want)
		}
	}
	n := d.Pass(tempFile(t, "first"))
	check(n, "first")
	n = d.Pass(tempFile(t, "second"))
	if n != 2 {
		t.Fatalf("second descriptor numbered %d", n)
	}
	check(n, "second")
	check(0, "none")
	check(9, "error: "+ErrNoFD.Error())
	if held := heldFDs.Load(); held != 0 {
		t.Fatalf("%d descriptors held after every one was claimed", held)
	}
}

// A server without PassFDs takes none: the kernel drops what it reads
// with plain reads, and the call finds nothing.
func TestPassedFDIgnoredWithoutPassFDs(t *testing.T) {
	d, h := serveFDs(t, false)
	c := fdClient(t, d)
	ctx := metadata.AppendToOutgoingContext(context.Background(), PassedFDKey, fmt.Sprint(d.Pass(tempFile(t, "x"))))
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := <-h.got; got != "error: "+ErrNoFD.Error() {
		t.Fatalf("got %q", got)
	}
}

// Unclaimed descriptors are bounded per connection and closed with it:
// the read ends of pipes passed and never claimed are all closed once the
// connection is, so writing into the pipes fails with EPIPE.
func TestUnclaimedFDsBoundedAndClosed(t *testing.T) {
	d, h := serveFDs(t, true)
	c, conn := fdClientConn(t, d)
	var writers []*os.File
	for i := 0; i < MaxPendingFDs+3; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		writers = append(writers, w)
		d.Pass(r)
		// A call makes the write that carries it; it names nothing.
		if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		<-h.got
		r.Close()
	}
	if held := heldFDs.Load(); held != MaxPendingFDs {
		t.Fatalf("%d descriptors held, want the bound %d", held, MaxPendingFDs)
	}
	// Those over the bound were closed at once.
	for _, w := range writers[MaxPendingFDs:] {
		if _, err := w.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("a descriptor over the bound is still open: write %v", err)
		}
	}
	conn.Close()
	waitFor(t, func() bool { return heldFDs.Load() == 0 }, "descriptors still held after their connection closed")
	for _, w := range writers[:MaxPendingFDs] {
		if _, err := w.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("an unclaimed descriptor outlived its connection: write %v", err)
		}
		w.Close()
	}
	for _, w := range writers[MaxPendingFDs:] {
		w.Close()
	}
}

// CheckPassedFile takes a readable regular file on a disk or memory file
// system, and nothing else.
func TestCheckPassedFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	syscall.Mkfifo(fifo, 0o600)
	reg := filepath.Join(dir, "reg")
	os.WriteFile(reg, []byte("0123456789"), 0o600)
	open := func(path string, flags int) *os.File {
		fd, err := syscall.Open(path, flags|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), path)
		t.Cleanup(func() { f.Close() })
		return f
	}
	if p, err := CheckPassedFile(open(reg, syscall.O_RDONLY)); err != nil || p.Size != 10 {
		t.Fatalf("regular file: %+v, %v", p, err)
	}
	for name, f := range map[string]*os.File{
		"fifo": open(fifo, syscall.O_RDWR), "dir": open(dir, syscall.O_RDONLY), "/dev/zero": open("/dev/zero", syscall.O_RDONLY),
		"O_PATH": open(reg, unix.O_PATH), "write-only": open(reg, syscall.O_WRONLY), "procfs": open("/proc/self/status", syscall.O_RDONLY),
	} {
		if _, err := CheckPassedFile(f); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	f := open(reg, syscall.O_RDONLY)
	p, _ := CheckPassedFile(f)
	if changed, _ := p.Changed(f); changed {
		t.Fatal("an untouched file changed")
	}
	w, _ := os.OpenFile(reg, os.O_WRONLY|os.O_APPEND, 0)
	io.WriteString(w, "more")
	w.Close()
	if changed, _ := p.Changed(f); !changed {
		t.Fatal("a grown file did not change")
	}
}
