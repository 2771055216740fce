package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
)

// hostileEnv is a bushostd serving with a socket group of the test's own,
// and an unprivileged user of the test's own in that group: what a
// sandboxed session is. Both are uniquely named and removed at the end.
type hostileEnv struct {
	h        *Host
	group    string
	gid      uint32
	user     string
	uid      uint32
	hostile  string
	admin    string
	extraUID []uint32
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a user and a group and runs peers as that user")
	}
}

// makeUser makes a uniquely named user in group (no home, no login) and
// removes it when the test ends; it returns the uid.
func makeUser(t *testing.T, group string) (string, uint32) {
	t.Helper()
	name := "bh-u-" + randSuffix()
	if out, err := exec.Command("useradd", "-M", "-N", "-g", group, "-s", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v\n%s", name, err, out)
		}
	})
	out, err := exec.Command("id", "-u", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	uid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	return name, uint32(uid)
}

func newHostileEnv(t *testing.T, args ...string) *hostileEnv {
	t.Helper()
	needRoot(t)
	e := &hostileEnv{group: "bh-g-" + randSuffix(), hostile: testdataBin(t, "hostile")}
	if out, err := exec.Command("groupadd", e.group).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v\n%s", err, out)
	}
	// Removed after the users (cleanups run last-in first-out).
	t.Cleanup(func() {
		if out, err := exec.Command("groupdel", e.group).CombinedOutput(); err != nil {
			t.Errorf("groupdel %s: %v\n%s", e.group, err, out)
		}
	})
	out, err := exec.Command("getent", "group", e.group).Output()
	if err != nil {
		t.Fatal(err)
	}
	gid, err := strconv.Atoi(strings.Split(strings.TrimSpace(string(out)), ":")[2])
	if err != nil {
		t.Fatal(err)
	}
	e.gid = uint32(gid)
	e.user, e.uid = makeUser(t, e.group)
	e.h = startHostWith(t, hostOpts{Args: append([]string{"--socket-group", e.group}, args...)})
	e.admin = adminTokenOf(t, e.h)
	return e
}

// attack starts the hostile peer as uid with mode and args, waits until it
// says it is under way (or ended, for a mode that ends), and kills it when
// the test ends. It returns the process and its output so far.
func (e *hostileEnv) attack(t *testing.T, uid uint32, mode string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(e.hostile, append([]string{mode}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: e.gid, Groups: []uint32{e.gid}}}
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	select {
	case l, ok := <-lines:
		if !ok || l != "ready" {
			t.Fatalf("hostile %s: %q, %s", mode, l, errb.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("hostile %s never got under way: %s", mode, errb.String())
	}
	return cmd
}

// probe is the host at work while an attack runs: every 100 ms a new
// connection to broker.sock calls VerifyLog, which must be answered within
// 1 s. stop ends it and returns the slowest answer.
type probe struct {
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	slowest time.Duration
	calls   int
	err     error
}

func (e *hostileEnv) probeHost(t *testing.T) *probe {
	t.Helper()
	p := &probe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			conn, err := grpc.NewClient("unix://"+filepath.Join(e.h.Home, "broker.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				p.err = err
				return
			}
			ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+e.admin)
			ctx, cancel := context.WithTimeout(ctx, 1*time.Second)
			start := time.Now()
			_, err = brokerv1.NewBrokerServiceClient(conn).VerifyLog(ctx, &brokerv1.VerifyLogRequest{})
			d := time.Since(start)
			cancel()
			conn.Close()
			p.mu.Lock()
			p.calls++
			p.slowest = max(p.slowest, d)
			if err != nil && p.err == nil {
				p.err = fmt.Errorf("log verify after %s: %w", d, err)
			}
			p.mu.Unlock()
			select {
			case <-p.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return p
}

// served waits until the host has been served n more times.
func (p *probe) served(t *testing.T, n int) {
	t.Helper()
	p.mu.Lock()
	want := p.calls + n
	p.mu.Unlock()
	for {
		p.mu.Lock()
		got, err := p.calls, p.err
		p.mu.Unlock()
		if got >= want || err != nil {
			return
		}
		select {
		case <-p.done:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (p *probe) end(t *testing.T) {
	t.Helper()
	close(p.stop)
	<-p.done
	if p.err != nil {
		t.Fatalf("the host was not served in time (%d calls): %v", p.calls, p.err)
	}
	t.Logf("host: %d log verify calls, slowest %s", p.calls, p.slowest)
}

// budget is docs/limits.md's bound on bushostd's memory for the flags it
// runs with: a baseline plus, per socket, a fixed cost per connection and
// a cost per call in flight. Only one uid attacks here, so its share is
// what the attack can add: its connections and calls on each socket.
func budget(connsPerUID, callsPerUID, streamsPerConn int) int64 {
	const (
		baseline    = 64 << 20
		perConn     = 2*32<<10 + 16<<10 + 64<<10 // buffers, header list, one stream window for streams not yet admitted
		perCall     = 2*(1<<20+16<<10) + 64<<10  // the message buffered and decoded, plus its window
		perStreamRx = 64 << 10
	)
	sockets := int64(2)
	return baseline + sockets*(int64(connsPerUID)*(perConn+int64(streamsPerConn)*perStreamRx)+int64(callsPerUID)*perCall)
}

// TestHostilePeerMemoryBounded: a socket-group member with no token opens
// streams it never finishes, sends huge or endless header blocks, or opens
// streams by the ten thousand. For each, bushostd's peak memory stays
// under 512 MiB and within docs/limits.md's budget, it keeps running, and
// the host's log verify is answered within 1 s throughout.
func TestHostilePeerMemoryBounded(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name string
		sock string
		mode string
		args []string
	}{
		{"2 conns x 500 unfinished 2 MiB requests", "broker.sock", "unfinished", []string{"2", "500", strconv.Itoa(2 << 20)}},
		{"2 conns x 500 unfinished requests just under the message bound", "broker.sock", "unfinished", []string{"2", "500", strconv.Itoa(1 << 20)}},
		{"60 streams with 15 MiB header values", "broker.sock", "headers", []string{"60", strconv.Itoa(15 << 20)}},
		{"20 connections of endless CONTINUATION", "git.sock", "continuation", []string{"20"}},
		{"50000 empty streams", "broker.sock", "empty", []string{"50000"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newHostileEnv(t)
			p := e.probeHost(t)
			e.attack(t, e.uid, c.mode, append([]string{filepath.Join(e.h.Home, c.sock)}, c.args...)...)
			// The attack goes on while the host is served 20 times more.
			p.served(t, 20)
			p.end(t)
			peak := vmHWM(t, e.h.PID())
			b := budget(32, 16, 16)
			t.Logf("bushostd VmHWM %d MiB, budget %d MiB", peak>>20, b>>20)
			if peak > 512<<20 || peak > b {
				t.Fatalf("bushostd peaked at %d MiB: over 512 MiB or the budget of %d MiB", peak>>20, b>>20)
			}
			e.h.Must(t, "log", "verify")
		})
	}
}
