package integration

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/sock"
)

// daemonFDs counts the daemon's open descriptors.
func daemonFDs(t *testing.T, h *Host) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", h.PID()))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// Hostile descriptors through the real daemon, its open descriptors
// counted before and after: a memfd rewritten while read, a socket (its own
// connection's other end), and a flood of descriptors nobody claims on 32
// connections of one uid and in one message. Each push is refused or
// declined (none moves the ref), and once the peer's connections are gone
// the daemon holds no more descriptors than before.
func TestAttackPushDescriptorsThroughDaemon(t *testing.T) {
	h := startHost(t)
	bundle, _, tok := fdWork(t, h, "p")
	before := len(brokerEvents(t, h))
	base := daemonFDs(t, h)

	// A memfd holding the bundle with one byte changed: a memory file, so
	// it is taken, and its bytes are checked as a stream's.
	b, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	mfd, err := unix.MemfdCreate("bundle", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	mf := os.NewFile(uintptr(mfd), "memfd")
	bad := append([]byte(nil), b...)
	bad[len(bad)-30] ^= 0xff
	mf.Write(bad)
	if _, accepted, err := fdPush(t, h, tok, mf, 0); err == nil || !accepted {
		t.Fatalf("push of a corrupt memfd bundle: accepted %v, %v", accepted, err)
	}
	mf.Close()

	// A socket: its own connection's other end, closed on arrival, so the
	// push is declined.
	t.Run("socket", func(t *testing.T) {
		c, err := net.Dial("unix", filepath.Join(h.Home, "git.sock"))
		if err != nil {
			t.Fatal(err)
		}
		f, _ := c.(*net.UnixConn).File()
		_, accepted, err := fdPush(t, h, tok, f, 0)
		f.Close()
		c.Close()
		if reasonOf(err) != "PUSH_FD_DECLINED" || accepted {
			t.Fatalf("push of a socket: accepted %v, %v (reason %s)", accepted, err, reasonOf(err))
		}
	})

	// 30 connections, 2 descriptors each, never claimed, and one raw
	// connection with 250 descriptors in each of the preface's bytes: 62
	// held without a share per uid, leaving the process's 64 room for the
	// push below.
	dir := t.TempDir()
	var conns []*grpc.ClientConn
	var raw []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		for _, c := range raw {
			c.Close()
		}
	}()
	tokb, _ := os.ReadFile(tok)
	for i := 0; i < 30; i++ {
		d := &sock.FDDialer{Path: filepath.Join(h.Home, "git.sock")}
		conn, err := grpc.NewClient("unix://"+d.Path, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(d.Dial))
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
		for j := 0; j < 2; j++ {
			p := filepath.Join(dir, fmt.Sprintf("f%d-%d", i, j))
			os.WriteFile(p, []byte("x"), 0o600)
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			d.Pass(f)
			ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+strings.TrimSpace(string(tokb)))
			// A call that names no descriptor: the one passed stays unclaimed.
			if s, err := gitv1.NewGitServiceClient(conn).FetchWork(ctx, &gitv1.FetchWorkRequest{}); err == nil {
				for {
					if _, err := s.Recv(); err != nil {
						break
					}
				}
			}
			f.Close()
		}
	}
	c, err := net.Dial("unix", filepath.Join(h.Home, "git.sock"))
	if err != nil {
		t.Fatal(err)
	}
	raw = append(raw, c)
	p := filepath.Join(dir, "flood")
	os.WriteFile(p, []byte("x"), 0o600)
	ff, _ := os.Open(p)
	many := make([]int, 250)
	for i := range many {
		many[i] = int(ff.Fd())
	}
	for i := 0; i < len(http2.ClientPreface); i++ {
		if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte(http2.ClientPreface[i:i+1]), syscall.UnixRights(many...), nil); err != nil {
			t.Fatal(err)
		}
	}
	ff.Close()
	// The daemon holds a uid's share, not 64 nor 250 more.
	if n := daemonFDs(t, h); n > base+32+sock.MaxHeldFDsPerUID+8 {
		t.Errorf("the daemon has %d descriptors open, %d before: the unclaimed ones are not bounded per uid", n, base)
	}
	// A push of the same uid now finds its descriptor closed on arrival
	// (the uid's share is full) and is declined, so the CLI streams it.
	f, _ := os.Open(bundle)
	if _, accepted, err := fdPush(t, h, tok, f, 0); accepted || reasonOf(err) != "PUSH_FD_DECLINED" {
		t.Errorf("a push past the uid's share: accepted %v, %v", accepted, err)
	}
	f.Close()
	for _, c := range conns {
		c.Close()
	}
	for _, c := range raw {
		c.Close()
	}
	conns, raw = nil, nil
	waitUntil(t, 20*time.Second, func() bool { return daemonFDs(t, h) <= base }, fmt.Sprintf("the daemon holds more descriptors than the %d before the attacks", base))
	nothingLeft(t, h, "p", before)
}
