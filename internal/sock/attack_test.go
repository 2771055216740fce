package sock

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/testenv"
)

// A hostile peer over its limit opens connections as fast as it can and
// never reads or writes on them: each refused connection must cost the
// daemon a bounded goroutine for a bounded time, whatever the peer does.
// At most maxLingering refusals linger (a second at most); the rest are
// told with one write and closed at once. Once the lingering ones have expired the daemon holds
// nothing for the flood, though the peer still holds every connection.
func TestAttackRefusedConnectionFlood(t *testing.T) {
	s := serve(t, 1, 8)
	var refused atomic.Int64
	s.adm.OnRefused(func(errdefs.Reason) { refused.Add(1) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := s.client(t)
	if _, err := first.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(lingering) == 0 }, "lingering before the flood")
	base := runtime.NumGoroutine()
	const n = 600
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	peak := 0
	for i := 0; i < n; i++ {
		c, err := net.Dial("unix", s.path)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		held = append(held, c)
		peak = max(peak, runtime.NumGoroutine()-base)
	}
	waitFor(t, func() bool { return refused.Load() >= n }, "the flood was not all refused")
	peak = max(peak, runtime.NumGoroutine()-base)
	t.Logf("%d refused connections held open by the peer: at most %d goroutines above the base of %d", n, peak, base)
	// The peak is not bounded by a constant: past maxLingering each
	// refusal has a goroutine of its own for one unblocked write and a
	// close (200ms at most, when the peer's buffer is full), so it is the
	// accept rate times that. Only the steady state is checked.
	// The lingering ones end within refuseLinger; the peer holds on.
	waitFor(t, func() bool { return len(lingering) == 0 && runtime.NumGoroutine()-base <= 4 }, "refused connections still cost goroutines")
	if conns, _ := s.adm.Counts(); conns != 1 {
		t.Fatalf("%d connections counted, want 1", conns)
	}
	if _, err := first.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the admitted client after the flood: %v", err)
	}
}

// TestListenModeThroughDescriptor: the socket's mode and group are set on
// what was bound, never on what its name points at afterwards. Whoever
// may write the socket's directory swaps the name for a link to a file of
// theirs, or for a socket of their own; root's Listen changes neither.
func TestListenModeThroughDescriptor(t *testing.T) {
	testenv.NeedRoot(t, "a socket of another user")
	dir := shortDir(t)
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("theirs"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := setMode(link, 0o666, 0); err == nil {
		t.Fatal("setMode followed a link")
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o600 {
		t.Fatalf("the link's target became %v", fi.Mode())
	}

	// A socket of another user in the bound socket's place.
	other := filepath.Join(dir, "other.sock")
	l, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(other, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := setMode(other, 0o666, 0); err == nil || !strings.Contains(err.Error(), "replaced after the bind") {
		t.Fatalf("setMode on another user's socket: %v", err)
	}
	if fi, _ := os.Stat(other); fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Gid != 65534 {
		t.Fatalf("another user's socket became %v", fi.Mode())
	}

	// What Listen binds gets the mode and group asked for.
	own := filepath.Join(dir, "own.sock")
	l2, err := Listen(own, 0o660, 65534)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	fi, err := os.Lstat(own)
	if err != nil || fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != 65534 {
		t.Fatalf("Listen's socket: %v %v", fi, err)
	}
}

// TestAttackListenModeHardLink: between the bind and the chmod, whoever
// may write the socket's directory moves root's socket aside and puts a
// hard link to another root socket in its place (where the host lets
// users link files they do not own: fs.protected_hardlinks=0). It is a
// socket, and root's, but not the one bound: root must not open it to
// the home's group. A socket just bound has one name.
func TestAttackListenModeHardLink(t *testing.T) {
	testenv.NeedRoot(t, "a root socket elsewhere, as a host's")
	dir := shortDir(t)
	other := filepath.Join(dir, "rootonly.sock")
	l, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(other, 0o600); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(dir, "launch.sock")
	if err := os.Link(other, planted); err != nil {
		t.Fatal(err)
	}
	if err := setMode(planted, 0o666, 65534); err == nil || !strings.Contains(err.Error(), "replaced after the bind") {
		t.Fatalf("setMode on a hard link to another root socket: %v", err)
	}
	if fi, _ := os.Stat(other); fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Gid != 0 {
		t.Fatalf("the other root socket became %v, group %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Gid)
	}
}

// TestAttackListenStaleCheckFollowsNoLink: Listen dials a socket already
// at its name to tell a live one from a stale one, the launcher dials
// broker.sock: DialNoFollow, both. Whoever may write the directory swaps
// the socket, after the Lstat, for a link to another socket (root's,
// which that user may not reach): root must not connect to what the link
// names, nor call the name served because of it.
func TestAttackListenStaleCheckFollowsNoLink(t *testing.T) {
	testenv.NeedRoot(t, "a socket only root may reach")
	dir := shortDir(t)
	private := filepath.Join(dir, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(private, "v.sock")
	vl, err := net.Listen("unix", victim)
	if err != nil {
		t.Fatal(err)
	}
	defer vl.Close()
	name := filepath.Join(dir, "launch.sock")
	if err := os.Symlink(victim, name); err != nil {
		t.Fatal(err)
	}
	if l, err := Listen(name, 0o600, -1); err == nil || !strings.Contains(err.Error(), "is a link") {
		if l != nil {
			l.Close()
		}
		t.Errorf("Listen on a link to another socket: %v, want refused as a link", err)
	}
	if fi, err := os.Lstat(name); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v", err)
	}
	if c, err := DialNoFollow(context.Background(), name); err == nil {
		c.Close()
		t.Errorf("DialNoFollow dialled through a link")
	}
	// Connections wait in the victim's backlog in order: the first one it
	// accepts must be this one, which says so.
	c, err := net.Dial("unix", victim)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("mine"))
	c.Close()
	a, err := vl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if b, _ := io.ReadAll(a); string(b) != "mine" {
		t.Fatalf("the victim's first connection said %q: root connected to the socket the link named", b)
	}
}
