package sock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

// Attacks on descriptor passing (fdpass.go) by a hostile peer of git.sock:
// it may send any bytes and any descriptors on its connections.

// serveFDsAs serves the fdHealth service with PassFDs and the daemon's
// default per-uid connection limit (32), so that one uid can open as many
// connections as the daemon lets it.
func serveFDsAs(t *testing.T, connsPerUID int) (string, *fdHealth) {
	path, h, _ := serveFDsAdm(t, connsPerUID)
	return path, h
}

func serveFDsAdm(t *testing.T, connsPerUID int) (string, *fdHealth, *Admission) {
	t.Helper()
	path := filepath.Join(shortDir(t), "f.sock")
	l, err := Listen(path, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	adm := NewAdmission(AdmitLimits{MaxConns: 4 * connsPerUID, MaxCalls: 64, MaxConnsPerUID: connsPerUID, MaxCallsPerUID: 64, OwnUID: -1})
	srv := grpc.NewServer(grpc.Creds(PeerCred{PassFDs: true}))
	h := &fdHealth{got: make(chan string, 64)}
	healthpb.RegisterHealthServer(srv, h)
	go srv.Serve(adm.Listener(l))
	t.Cleanup(srv.Stop)
	return path, h, adm
}

// openFDs counts this process's open descriptors.
// fdTarget is what /proc/self/fd shows for f ("pipe:[123]").
func fdTarget(t *testing.T, f *os.File) string {
	t.Helper()
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return target
}

// fdsAt counts the process's descriptors that point at target.
func fdsAt(t *testing.T, target string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if got, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && got == target {
			n++
		}
	}
	return n
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// One uid must not take the whole process's room for unclaimed
// descriptors: with the daemon's 32 connections per uid and 2 unclaimed a
// connection, one session could hold all 64 (MaxHeldFDs), and every other
// session's push would find its descriptor closed on arrival and fall back
// to streaming, for as long as the attacker keeps its connections. A uid
// holds at most MaxHeldFDsPerUID; the others are closed as they arrive,
// and every one is closed with its connection.
func TestAttackOneUIDHoldsEveryPassedFD(t *testing.T) {
	const conns = 32 // DefaultMaxConnsPerUID of the daemon
	path, h := serveFDsAs(t, conns)
	var writers []*os.File
	defer func() {
		for _, w := range writers {
			w.Close()
		}
	}()
	var clients []*grpc.ClientConn
	for i := 0; i < conns; i++ {
		d := &FDDialer{Path: path}
		c, conn := fdClientConn(t, d)
		clients = append(clients, conn)
		for j := 0; j < MaxPendingFDs; j++ {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			writers = append(writers, w)
			d.Pass(r)
			// The call carries the descriptor and names none.
			if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			<-h.got
			r.Close()
		}
	}
	if held := heldFDs.Load(); held > MaxHeldFDsPerUID {
		t.Fatalf("one uid holds %d unclaimed descriptors of the process's %d; want at most %d", held, MaxHeldFDs, MaxHeldFDsPerUID)
	}
	open := 0
	for _, w := range writers {
		if _, err := w.Write([]byte("x")); err == nil {
			open++
		} else if !errors.Is(err, syscall.EPIPE) {
			t.Fatal(err)
		}
	}
	if open > MaxHeldFDsPerUID {
		t.Fatalf("%d passed descriptors still open in the server, want at most %d", open, MaxHeldFDsPerUID)
	}
	for _, c := range clients {
		c.Close()
	}
	waitFor(t, func() bool { return heldFDs.Load() == 0 }, "descriptors still held after their connections closed")
	for _, w := range writers {
		if _, err := w.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("a passed descriptor outlived its connection: write %v", err)
		}
	}
}

// The per-uid share leaves room for other uids: a queue of another uid
// still keeps its descriptor when one uid has its whole share.
func TestPassedFDShareIsPerUID(t *testing.T) {
	pipe := func() (int, *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		fd, err := syscall.Dup(int(r.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		t.Cleanup(func() { w.Close() })
		return fd, w
	}
	var qs []*fdQueue
	for i := 0; i < MaxHeldFDsPerUID; i++ {
		q := &fdQueue{uid: 1000}
		qs = append(qs, q)
		fd, _ := pipe()
		q.add(fd)
	}
	over := &fdQueue{uid: 1000}
	fd, w := pipe()
	over.add(fd)
	if _, err := w.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("a descriptor over the uid's share was kept: write %v", err)
	}
	other := &fdQueue{uid: 1001}
	fd, w = pipe()
	other.add(fd)
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatalf("another uid's descriptor was not kept: write %v", err)
	}
	for _, q := range append(qs, over, other) {
		q.close()
	}
	if n := heldFDs.Load(); n != 0 {
		t.Fatalf("%d descriptors held after every queue closed", n)
	}
	heldMu.Lock()
	n := len(heldByUID)
	heldMu.Unlock()
	if n != 0 {
		t.Fatalf("per-uid counts left: %d uids", n)
	}
}

// Many descriptors in one message, and a descriptor with every byte of
// the preface: the server keeps at most MaxPendingFDs for the connection
// (the kernel closes what one recvmsg has no room for; the queue closes
// the rest), and once the connection is gone the process has no more
// descriptors open than before it.
func TestAttackPassedFDFlood(t *testing.T) {
	path, _ := serveFDsAs(t, 4)
	c0, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c0.Close() // the server's first accept and its goroutines are up
	base := openFDs(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // on a failure, before the server's Stop waits out its handshake
	u := c.(*net.UnixConn)
	many := make([]int, 250) // SCM_MAX_FD is 253
	for i := range many {
		many[i] = int(r.Fd())
	}
	rights := syscall.UnixRights(many...)
	for i := 0; i < len(http2.ClientPreface); i++ {
		if _, _, err := u.WriteMsgUnix([]byte(http2.ClientPreface[i:i+1]), rights, nil); err != nil {
			t.Fatal(err)
		}
	}
	pipe := fdTarget(t, r)
	r.Close()
	waitFor(t, func() bool { return heldFDs.Load() == MaxPendingFDs }, "the connection's descriptors were not queued")
	// Counted by what they point at, not in all: other descriptors of the
	// process (the runtime's, the test server's) come and go. The pipe's
	// write end and the queue's; a descriptor the server has just
	// received it closes on arrival.
	waitFor(t, func() bool { return fdsAt(t, pipe) == 1+MaxPendingFDs }, "the flood's descriptors were not closed beyond the queue's")
	c.Close()
	waitFor(t, func() bool { return heldFDs.Load() == 0 }, "descriptors still held after the connection closed")
	if _, err := w.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("the flood's descriptors outlived their connection: write %v", err)
	}
	waitFor(t, func() bool { return openFDs(t) <= base+1 }, "the process holds more descriptors than before the flood")
}

// A socket is never a bundle, and one held in a connection's queue can
// keep a connection open after its client is gone: a peer that passes its
// own end of the connection on it, and closes its copy, leaves the server
// a connection whose other end the server itself holds, so it never reads
// end-of-file (only the daemon's idle and keepalive timers would end it,
// and the uid's connection slot with it). A socket, and any descriptor
// of a kind that can hold others (an anonymous inode: io_uring holds its
// registered files, though the kernel refuses to pass one today), is
// closed as it arrives.
func TestAttackPassedSocketKeepsItsConnection(t *testing.T) {
	path, _, adm := serveFDsAdm(t, 4)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	self, err := c.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	// The preface and a SETTINGS frame: an established HTTP/2 connection.
	var msg []byte
	msg = append(msg, http2.ClientPreface...)
	msg = append(msg, 0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0)
	if _, _, err := c.(*net.UnixConn).WriteMsgUnix(msg, syscall.UnixRights(int(self.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	self.Close()
	waitFor(t, func() bool { n, _ := adm.Counts(); return n == 1 }, "the connection was not admitted")
	c.Close()
	waitFor(t, func() bool { n, _ := adm.Counts(); return n == 0 && heldFDs.Load() == 0 }, "the connection outlived its client: the server holds its other end")

	// An anonymous inode (eventfd here; io_uring and epoll are of its
	// kind, and io_uring holds its registered files) is closed as it
	// arrives: the call that names it finds nothing.
	path2, h := serveFDsAs(t, 4)
	d := &FDDialer{Path: path2}
	cl := fdClient(t, d)
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	ef := os.NewFile(uintptr(efd), "eventfd")
	defer ef.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), PassedFDKey, fmt.Sprint(d.Pass(ef)))
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := <-h.got; got != "error: "+ErrNoFD.Error() {
		t.Fatalf("a passed eventfd reached the call: %q", got)
	}
}
