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
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/testenv"
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
	// hostCall is the host's call the probe makes (default: VerifyLog).
	hostCall func(ctx context.Context, c brokerv1.BrokerServiceClient) error
}

func needRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "makes a user and a group and runs peers as that user")
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

// groupID is the gid of group, from getent.
func groupID(t *testing.T, group string) uint32 {
	t.Helper()
	out, err := exec.Command("getent", "group", group).Output()
	if err != nil {
		t.Fatal(err)
	}
	gid, err := strconv.Atoi(strings.Split(strings.TrimSpace(string(out)), ":")[2])
	if err != nil {
		t.Fatal(err)
	}
	return uint32(gid)
}

func newHostileEnv(t *testing.T, args ...string) *hostileEnv {
	t.Helper()
	return newHostileEnvWith(t, hostOpts{Args: args})
}

// newHostileEnvWith is newHostileEnv with the host's options (o.Args are
// added after the socket group).
func newHostileEnvWith(t *testing.T, o hostOpts) *hostileEnv {
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
	e.gid = groupID(t, e.group)
	e.user, e.uid = makeUser(t, e.group)
	o.Args = append([]string{"--socket-group", e.group}, o.Args...)
	e.h = startHostWith(t, o)
	e.admin = adminTokenOf(t, e.h)
	return e
}

// attack starts the hostile peer as uid with mode and args, waits until it
// says it is under way (or ended, for a mode that ends), and kills it when
// the test ends. It returns the process and its output so far.
func (e *hostileEnv) attack(t *testing.T, uid uint32, mode string, args ...string) <-chan string {
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
	return lines
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
	return e.probeHostWithin(t, time.Second)
}

// probeHostWithin is probeHost with another bound than 1 s (a log verify
// of a big log takes its time whatever the attack).
func (e *hostileEnv) probeHostWithin(t *testing.T, within time.Duration) *probe {
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
			ctx, cancel := context.WithTimeout(ctx, within)
			start := time.Now()
			if e.hostCall != nil {
				err = e.hostCall(ctx, brokerv1.NewBrokerServiceClient(conn))
			} else {
				_, err = brokerv1.NewBrokerServiceClient(conn).VerifyLog(ctx, &brokerv1.VerifyLogRequest{})
			}
			d := time.Since(start)
			cancel()
			conn.Close()
			p.mu.Lock()
			p.calls++
			p.slowest = max(p.slowest, d)
			if err != nil && p.err == nil {
				p.err = fmt.Errorf("host call after %s: %w", d, err)
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
	t.Logf("host: %d calls, slowest %s", p.calls, p.slowest)
}

// Costs of docs/limits.md's memory budget (internal/daemon/limits.go).
const (
	budgetBaseline = 32 << 20
	budgetPerConn  = 2*32<<10 + 32<<10 + 16<<10 // buffers, framer and goroutines, the header list
	budgetPerCall  = 2*(1<<20+16<<10) + 64<<10  // one message buffered and decoded, its window
)

// budget is docs/limits.md's bound on bushostd's resident memory when one
// uid attacks: the baseline and that uid's share on both sockets (its
// connections and calls at their cost), the share doubled for Go's
// collector (GOGC=100 lets the heap reach twice what is live).
func budget(connsPerUID, callsPerUID int) int64 {
	return budgetBaseline + 2*2*(int64(connsPerUID)*budgetPerConn+int64(callsPerUID)*budgetPerCall)
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
			b := budget(32, 16)
			t.Logf("bushostd VmHWM %d MiB, budget %d MiB", peak>>20, b>>20)
			if peak > 512<<20 || peak > b {
				t.Fatalf("bushostd peaked at %d MiB: over 512 MiB or the budget of %d MiB", peak>>20, b>>20)
			}
			e.h.Must(t, "log", "verify")
		})
	}
}

// asUser runs bushost as uid in the socket group, with a token file of its
// own, and returns what it printed and its exit status.
func (e *hostileEnv) asUser(t *testing.T, uid uint32, tokenFile string, args ...string) (string, string, int) {
	t.Helper()
	own := filepath.Join(filepath.Dir(e.h.Home), fmt.Sprintf("token-uid%d-%s", uid, randSuffix()))
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(own, b, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, int(uid), int(e.gid)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.h.client, append([]string{"--home", e.h.Home, "--token-file", own}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: e.gid, Groups: []uint32{e.gid}}}
	cmd.Env = cleanEnv()
	cmd.Dir = "/"
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// One worker uid holding 300 connections on each socket leaves room for
// the host (its own uid's reserve) and for a worker of another uid
// (--max-conns-per-uid).
func TestFairnessConnectionsPerUID(t *testing.T) {
	e := newHostileEnv(t)
	e.h.AddProject(t, "acme", "web")
	tokB := e.h.Grant(t, "acme", "web", "t2", "worker", "event.record")
	_, uidB := makeUser(t, e.group)
	for _, sock := range []string{"broker.sock", "git.sock"} {
		e.attack(t, e.uid, "conns", filepath.Join(e.h.Home, sock), "300")
	}
	p := e.probeHost(t)
	p.served(t, 5)
	if out, errs, code := e.asUser(t, uidB, tokB, "event", "record", "--type", "note", "--data", `{"a":1}`); code != 0 {
		t.Fatalf("worker of another uid refused: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := e.asUser(t, uidB, tokB, "events", "--json"); code != 0 || !strings.Contains(out, `"note"`) {
		t.Fatalf("worker of another uid: exit %d\n%s%s", code, out, errs)
	}
	p.end(t)
}

// 70 `events --follow` streams on one worker's token take its grant's
// follow slots, not everybody's: a follow past --max-streams-per-grant is
// refused with its reason, and another task's calls are served.
func TestFairnessFollowStreamsPerGrant(t *testing.T) {
	e := newHostileEnv(t)
	e.h.AddProject(t, "acme", "web")
	tokA := e.h.Grant(t, "acme", "web", "t1", "worker", "event.record")
	tokB := e.h.Grant(t, "acme", "web", "t2", "worker", "event.record")
	e.attack(t, e.uid, "follow", filepath.Join(e.h.Home, "broker.sock"), strings.TrimSpace(readText(t, tokA)), "70")
	// The attacker's streams come in as fast as it can open them: a
	// follow of the same grant is refused once they hold their slots.
	conn, ctx := dialHome(t, e.h.Home, "broker.sock", strings.TrimSpace(readText(t, tokA)))
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := brokerv1.NewBrokerServiceClient(conn).ListEvents(cctx, &brokerv1.ListEventsRequest{Follow: true})
		if err == nil {
			_, err = s.Recv()
		}
		cancel()
		r := grpcerr.FromStatus(err)
		if r.Reason == errdefs.TooManyFollows || r.Reason == errdefs.TooManyCallsPerGrant {
			if r.Kind != errdefs.KindResourceExhausted || r.Metadata["limit"] == "" {
				t.Fatalf("refusal %+v: want ResourceExhausted with the limit", r)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a follow past the grant's limit was not refused: %v", err)
		}
	}
	if out, errs, code := e.h.Run(t, nil, "--token-file", tokB, "event", "record", "--type", "note", "--data", `{"b":2}`); code != 0 {
		t.Fatalf("another task's call refused: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := e.asUser(t, e.uid, tokB, "events", "--json"); code != 0 || !strings.Contains(out, `"note"`) {
		t.Fatalf("another task's listing from the attacker's uid: exit %d\n%s%s", code, out, errs)
	}
	p := e.probeHost(t)
	p.served(t, 3)
	p.end(t)
}

// A push that trickles one byte a second is cut once --push-rate-grace
// passed, with PUSH_TOO_SLOW naming the limit, and leaves nothing.
func TestPushTrickleIsCut(t *testing.T) {
	const grace = 2 * time.Second
	e := newHostileEnv(t, "--push-rate-grace", grace.String(), "--min-push-rate", "1K", "--idle-timeout", "30s")
	e.h.AddProject(t, "acme", "web")
	tok := e.h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	repos := filepath.Join(e.h.Home, "repos")
	before := treeState(t, repos)
	lines := e.attack(t, e.uid, "trickle", filepath.Join(e.h.Home, "git.sock"), strings.TrimSpace(readText(t, tok)))
	select {
	case l := <-lines:
		// "cut after 2.5s: rpc error: code = ResourceExhausted desc = ..."
		f := strings.Fields(l)
		if len(f) < 3 || f[0] != "cut" {
			t.Fatalf("trickle: %q", l)
		}
		d, err := time.ParseDuration(strings.TrimSuffix(f[2], ":"))
		if err != nil || d > grace+3*time.Second || !strings.Contains(l, "ResourceExhausted") || !strings.Contains(l, "min-push-rate") {
			t.Fatalf("trickle %q: want cut with ResourceExhausted naming --min-push-rate within %s", l, grace+3*time.Second)
		}
	case <-time.After(time.Minute):
		t.Fatal("the trickling push was never cut")
	}
	waitUntil(t, 10*time.Second, func() bool { return treeState(t, repos) == before }, "the cut push left files behind")
}

// 64 ListEvents streams whose reader takes nothing (a zero window) on a
// log of 60 KiB events: each holds at most a page of 1 MiB, and all are
// cut after --send-timeout; the host is served meanwhile. The cut is seen
// from the attacker's uid: while its 64 streams hold its 64 call slots
// (--max-calls-per-uid) its other calls are refused; once they are cut,
// they are served. (A peer with a zero window never sees its streams'
// trailers, which wait behind the data it does not take.)
func TestNonReadingListStreamsAreCut(t *testing.T) {
	const sendTimeout = 3 * time.Second
	// The daemon's memory is measured: it runs as users build it, without
	// the race runtime's shadow memory (other tests drive these paths
	// under -race).
	e := newHostileEnvWith(t, hostOpts{Plain: true, Args: []string{"--send-timeout", sendTimeout.String(),
		"--max-calls-per-grant", "64", "--max-calls-per-uid", "64", "--max-streams-per-conn", "64",
		// The log is written fast by one grant here, past the event quotas.
		"--event-rate", "100000", "--event-bytes-rate", "1G"}})
	e.h.AddProject(t, "acme", "web")
	tokFile := e.h.Grant(t, "acme", "web", "t1", "worker", "event.record")
	tokB := e.h.Grant(t, "acme", "web", "t2", "worker", "event.record")
	tok := strings.TrimSpace(readText(t, tokFile))
	conn, ctx := dialHome(t, e.h.Home, "broker.sock", tok)
	big := `{"x":"` + strings.Repeat("a", 60<<10) + `"}`
	n := 120
	if os.Getenv("BUSHOST_SOAK") != "" {
		n = 6500
	}
	for i := 0; i < n; i++ {
		if _, err := brokerv1.NewBrokerServiceClient(conn).RecordEvent(ctx, &brokerv1.RecordEventRequest{Type: "note", Data: big}); err != nil {
			t.Fatal(err)
		}
	}
	// The host's call here is a task add: a log verify would read and
	// hash the whole log, whose cost is the host's own, not the attack's.
	e.hostCall = func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
		_, err := c.AddTask(ctx, &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: "t9"})
		return err
	}
	// The 64 listings read their pages on the same 2 shared cores (the
	// limits are raised fourfold here): the host is served within 10 s.
	p := e.probeHostWithin(t, 10*time.Second)
	base := vmHWM(t, e.h.PID())
	e.attack(t, e.uid, "noread", filepath.Join(e.h.Home, "broker.sock"), tok, "64")
	started := time.Now()
	held := started
	sawRefusal := false
	for {
		out, errs, code := e.asUser(t, e.uid, tokB, "events", "--json")
		if code == 0 {
			if sawRefusal {
				break // cut: the uid is served again
			}
			// The attacker has written its 64 streams, but a loaded
			// daemon may not have taken them yet: until a call is
			// refused, a success says nothing.
			if time.Since(started) > 30*time.Second {
				t.Fatal("the 64 non-reading streams never held their uid's call slots: the test proves nothing")
			}
			continue
		}
		if !strings.Contains(errs, "ResourceExhausted") && code != errdefs.ExitLimit {
			t.Fatalf("the attacker's uid: exit %d, want a limit or success\n%s%s", code, out, errs)
		}
		if !sawRefusal {
			sawRefusal, held = true, time.Now()
		}
		if time.Since(held) > sendTimeout+30*time.Second {
			t.Fatal("the non-reading streams were never cut")
		}
	}
	t.Logf("slots freed %s after the first refusal", time.Since(held).Round(time.Millisecond))
	p.end(t)
	peak := vmHWM(t, e.h.PID())
	// docs/limits.md: a listing holds at most a page (1 MiB), the event
	// being sent and grpc's write quota, within a call's cost; on top of
	// what the daemon held before the attack, doubled for the collector.
	b := base + 2*64*budgetPerCall
	t.Logf("bushostd VmHWM %d MiB before the attack, %d MiB after, budget %d MiB", base>>20, peak>>20, b>>20)
	if peak > 512<<20 || peak > b {
		t.Fatalf("bushostd peaked at %d MiB: over 512 MiB or the budget of %d MiB", peak>>20, b>>20)
	}
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, cond func() bool, msg string) {
	t.Helper()
	testenv.WaitFor(t, d, msg, cond)
}
