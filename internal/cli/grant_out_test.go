package cli

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/home"
)

// TestGrantOutNeverRemovesAFileItDidNotMake: grant --out removes its file
// when no grant is issued, but only the file it made. Here the path is
// taken over by someone else's file while the call waits on the bus host
// (a user who gave up on a hung grant, removed its empty file and ran it
// again); the first grant's failure must leave that file as it is.
func TestGrantOutNeverRemovesAFileItDidNotMake(t *testing.T) {
	dir, err := os.MkdirTemp("/tmp", "grant-out-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.WriteFile(filepath.Join(dir, "admin.token"), []byte("admin\n"), 0o600)
	// A "bus host" that accepts and never answers, until closed.
	l, err := net.Listen("unix", home.At(dir).BrokerSock())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			accepted <- struct{}{}
		}
	}()
	out := filepath.Join(dir, "worker.token")
	done := make(chan int, 1)
	go func() {
		_, _, code := run(t, nil, "--home", dir, "grant", "--business", "a", "--project", "b", "--task", "c", "--role", "worker", "--cap", "git.push.working", "--out", out)
		done <- code
	}()
	select {
	case <-accepted:
	case <-time.After(20 * time.Second):
		t.Fatal("grant never connected")
	}
	if _, err := os.Lstat(out); err != nil {
		t.Fatalf("grant --out made no file before its call: %v", err)
	}
	// Someone else's file now stands at --out.
	os.Remove(out)
	if err := os.WriteFile(out, []byte("theirs\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The bus host goes away: no grant is issued.
	l.Close()
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	select {
	case code := <-done:
		t.Logf("grant exited %d", code)
	case <-time.After(3 * time.Minute):
		t.Fatal("grant did not return")
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "theirs\n" {
		t.Fatalf("grant --out removed or changed a file it did not make: %q, %v", b, err)
	}
}
