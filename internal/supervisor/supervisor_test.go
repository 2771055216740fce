package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// syncBuffer is a log the test can read while the supervisor writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serveScript stays up unless $FLAG exists; it leaves a background child
// so that group cleanup is exercised.
const serveScript = `#!/bin/bash
echo "serving v1"
if [ -n "$FLAG" ] && [ -e "$FLAG" ]; then echo "flag set" >&2; exit 1; fi
sleep 300 &
while true; do
  if [ -n "$FLAG" ] && [ -e "$FLAG" ]; then exit 1; fi
  sleep 0.05
done
`

type running struct {
	s    *Supervisor
	ws   string
	addr string
	log  *syncBuffer
	stop func()
}

// startSupervisor runs a supervisor on a fresh workspace whose src/web holds
// serve.sh, with windows short enough for a unit test.
func startSupervisor(t *testing.T, extra string) *running {
	t.Helper()
	return startSupervisorWith(t, extra, Options{}, nil)
}

// startSupervisorWith is startSupervisor with log options, and tweak (if
// not nil) applied between New and Run.
func startSupervisorWith(t *testing.T, extra string, opts Options, tweak func(*Supervisor)) *running {
	t.Helper()
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	writeFile(t, filepath.Join(ws, "src", "web", "serve.sh"), serveScript)
	cfgText := fmt.Sprintf(`
workspace = %q
git_dir = %q
watch = ["src"]
health_addr = "127.0.0.1:0"
debounce = "150ms"
good_after = "1500ms"
crash_window = "3s"
crash_threshold = 3
max_failed_reverts = 2
restart_backoff = "30ms"
max_backoff = "200ms"
stop_grace = "500ms"
%s`, ws, filepath.Join(dir, "sup.git"), extra)
	cfg, err := ParseConfig(filepath.Join(dir, "sup.toml"), []byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	// serve.sh is the seed, as init's note in the git dir says: the first
	// commit needs no acknowledgement.
	if err := os.Mkdir(cfg.GitDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(cfg.GitDir, seededFile), "seeded\n")
	log := &syncBuffer{}
	ready := make(chan string, 1)
	opts.Shim, opts.Log, opts.Ready = []string{os.Args[0]}, log, func(a string) { ready <- a }
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	r := &running{s: s, ws: ws, log: log}
	var once sync.Once
	r.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("supervisor log:\n%s", log.String())
		}
	})
	select {
	case r.addr = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("supervisor did not start")
	}
	return r
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, timeout, what, cond)
}

func (r *running) healthz(t *testing.T) int {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (r *running) service(name string) ServiceStatus {
	for _, s := range r.s.Status().Services {
		if s.Name == name {
			return s
		}
	}
	return ServiceStatus{}
}

const webService = `
[[service]]
name = "web"
command = ["bash", "./serve.sh"]
dir = "src/web"
env = ["FLAG=%s"]
[service.health]
exec = ["test", "-f", "serve.sh"]
interval = "20ms"
`

func TestSupervisorCommitsEditsAndRevertsCrashLoop(t *testing.T) {
	r := startSupervisor(t, fmt.Sprintf(webService, "/nonexistent"))
	waitFor(t, "first good commit", 5*time.Second, func() bool {
		st := r.s.Status()
		return st.Good != "" && st.Good == st.Head
	})
	if code := r.healthz(t); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	first := r.s.Status().Head

	// A burst of edits: one commit, one restart.
	for i := range 5 {
		writeFile(t, filepath.Join(r.ws, "src", "web", fmt.Sprintf("page%d.html", i)), "hello\n")
		time.Sleep(5 * time.Millisecond)
	}
	waitFor(t, "agent commit", 5*time.Second, func() bool { return r.s.Status().Head != first })
	time.Sleep(300 * time.Millisecond)
	edit := r.s.Status().Head
	if n := strings.Count(r.log.String(), "committed agent edits"); n != 1 {
		t.Errorf("%d commits for one burst", n)
	}
	if a, _ := authorOf(t, r.s.repo, edit); a != "agent <agent@localhost>" {
		t.Errorf("edit author %q", a)
	}
	if got := r.service("web").Restarts; got != 1 {
		t.Errorf("restarts = %d after one edit, want 1", got)
	}
	waitFor(t, "edit becomes good", 5*time.Second, func() bool { return r.s.Status().Good == edit })

	// Break it: exit 1 at start. Bricked, reverted, healthy again.
	writeFile(t, filepath.Join(r.ws, "src", "web", "serve.sh"), "#!/bin/bash\necho broken\nexit 1\n")
	waitFor(t, "revert", 10*time.Second, func() bool { return len(r.s.Status().Reverts) == 1 })
	rev := r.s.Status().Reverts[0]
	if rev.Error != "" || rev.To != edit || rev.Service != "web" {
		t.Fatalf("revert record %+v", rev)
	}
	if a, _ := authorOf(t, r.s.repo, rev.Commit); a != "supervisor <supervisor@localhost>" {
		t.Errorf("revert author %q", a)
	}
	ctx := context.Background()
	gt, _ := r.s.repo.Tree(ctx, edit)
	rt, _ := r.s.repo.Tree(ctx, rev.Commit)
	if gt != rt {
		t.Errorf("revert tree %s != good tree %s", rt, gt)
	}
	waitFor(t, "healthy after revert", 5*time.Second, func() bool { return r.healthz(t) == 200 })
	if b, _ := os.ReadFile(filepath.Join(r.ws, "src", "web", "serve.sh")); string(b) != serveScript {
		t.Errorf("serve.sh not restored:\n%s", b)
	}
	// The revert's own file changes must not come back as an agent commit.
	time.Sleep(300 * time.Millisecond)
	if st := r.s.Status(); st.Head != rev.Commit {
		t.Errorf("HEAD moved after the revert to %s", st.Head)
	}
}

// A failure outside the agent's edits: the trees are the good commit, so
// there is nothing to revert. No revert commit, no revert notification:
// it says so and halts once.
func TestSupervisorHaltsWithNothingToRevert(t *testing.T) {
	flag := filepath.Join(t.TempDir(), "broken")
	rcv := newReceiver(t, 0)
	r := startSupervisor(t, fmt.Sprintf("notify_url = %q\n", rcv.srv.URL)+fmt.Sprintf(webService, flag))
	waitFor(t, "first good commit", 5*time.Second, func() bool { return r.s.Status().Good != "" })
	head := r.s.Status().Head

	// Broken from outside the tree: no revert can help.
	writeFile(t, flag, "x")
	waitFor(t, "halted", 15*time.Second, func() bool { return r.s.Status().State == "halted" })
	if code := r.healthz(t); code != 503 {
		t.Errorf("/healthz = %d while halted", code)
	}
	st := r.s.Status()
	if len(st.Reverts) != 0 || st.Head != head || !strings.Contains(st.HaltReason, "nothing to revert") {
		t.Errorf("with nothing to revert: %d reverts, head %s (was %s), halt reason %q", len(st.Reverts), st.Head, head, st.HaltReason)
	}
	if svc := r.service("web"); svc.State != StateBricked {
		t.Errorf("web is %s while halted", svc.State)
	}
	if !strings.Contains(r.log.String(), "RECOVERY HALTED") {
		t.Error("halt not logged loudly")
	}
	// The halt is the supervisor's state: a restart would find it.
	if p, err := loadState(r.s.cfg.GitDir); err != nil || !p.Halted {
		t.Errorf("persisted state %+v %v, want halted", p, err)
	}

	// An agent edit once the outside fault is gone brings it back, and a
	// healthy commit ends the halt.
	os.Remove(flag)
	writeFile(t, filepath.Join(r.ws, "src", "web", "fix.txt"), "fixed\n")
	waitFor(t, "recovery resumed", 10*time.Second, func() bool { return r.s.Status().State == "ok" })
	if st := r.s.Status(); st.Good != st.Head || len(st.Reverts) != 0 {
		t.Errorf("after fix: %+v", st)
	}
	if p, err := loadState(r.s.cfg.GitDir); err != nil || p.Halted {
		t.Errorf("persisted state %+v %v after the recovery", p, err)
	}

	// The webhook heard the halt once, then the recovery that ended it.
	waitFor(t, "recovery notification", 5*time.Second, func() bool { _, ok := rcv.find(EventRecovery); return ok })
	var events []string
	for _, n := range rcv.events() {
		events = append(events, n.Event)
		if n.Service != "web" {
			t.Errorf("%s notification names service %q", n.Event, n.Service)
		}
	}
	if got := strings.Join(events, " "); got != "halt recovery" {
		t.Errorf("notifications %q", got)
	}
	if rec, _ := rcv.find(EventRecovery); rec.Commit != r.s.Status().Good {
		t.Errorf("recovery notification %+v, good %s", rec, r.s.Status().Good)
	}
}

// Reverts that fail count toward max_failed_reverts, then recovery halts.
func TestSupervisorHaltsAfterFailedReverts(t *testing.T) {
	flag := filepath.Join(t.TempDir(), "broken")
	rcv := newReceiver(t, 0)
	r := startSupervisor(t, fmt.Sprintf("notify_url = %q\n", rcv.srv.URL)+fmt.Sprintf(webService, flag))
	waitFor(t, "first good commit", 5*time.Second, func() bool { return r.s.Status().Good != "" })

	// An edit the supervisor cannot take back: an immutable file (which
	// not even root removes), so each revert fails.
	stuck := filepath.Join(r.ws, "src", "web", "stuck.txt")
	writeFile(t, stuck, "x")
	waitFor(t, "the edit committed", 5*time.Second, func() bool { st := r.s.Status(); return st.Head != st.Good && st.Unrecorded == "" })
	if out, err := exec.Command("chattr", "+i", stuck).CombinedOutput(); err != nil {
		testenv.Missing(t, "chattr +i (root, ext4)", "an immutable file makes a revert fail: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", stuck).Run() })
	writeFile(t, flag, "x")
	waitFor(t, "halted", 15*time.Second, func() bool { return r.s.Status().State == "halted" })
	st := r.s.Status()
	if len(st.Reverts) != 2 || st.Reverts[0].Error == "" || !strings.Contains(st.HaltReason, "max_failed_reverts = 2") {
		t.Errorf("%d reverts (want 2 failed), halt %q: %+v", len(st.Reverts), st.HaltReason, st.Reverts)
	}
	waitFor(t, "halt notification", 5*time.Second, func() bool { _, ok := rcv.find(EventHalt); return ok })
	var events []string
	for _, n := range rcv.events() {
		events = append(events, n.Event)
	}
	if got := strings.Join(events, " "); got != "revert_failed revert_failed halt" {
		t.Errorf("notifications %q", got)
	}
}

func TestSupervisorNonRevertableServiceStaysBricked(t *testing.T) {
	r := startSupervisor(t, `
[[service]]
name = "bot"
command = ["bash", "-c", "test -f ok || exit 3; exec sleep 300"]
dir = "src/web"
revertable = false
`)
	waitFor(t, "bricked", 5*time.Second, func() bool { return r.service("bot").State == StateBricked })
	time.Sleep(200 * time.Millisecond)
	if st := r.s.Status(); len(st.Reverts) != 0 || r.service("bot").State != StateBricked {
		t.Fatalf("non-revertable service: %+v", st)
	}
	if code := r.healthz(t); code != 503 {
		t.Errorf("/healthz = %d with a bricked service", code)
	}
	exits := r.service("bot").RecentExits
	if len(exits) != 3 || exits[0].Code != 3 {
		t.Errorf("recent exits %+v", exits)
	}
	writeFile(t, filepath.Join(r.ws, "src", "web", "ok"), "")
	waitFor(t, "bot back after the fix", 5*time.Second, func() bool { return r.healthz(t) == 200 })
}

// Stopping the supervisor stops every process of every service group,
// background children included.
func TestSupervisorStopLeavesNoProcess(t *testing.T) {
	r := startSupervisor(t, fmt.Sprintf(webService, "/nonexistent"))
	waitFor(t, "running", 5*time.Second, func() bool { return r.service("web").PID != 0 })
	pgid := r.service("web").PID
	waitFor(t, "background child", 5*time.Second, func() bool { return len(groupMembers(pgid)) >= 3 })
	r.stop()
	waitFor(t, "group gone", 5*time.Second, func() bool { return len(groupMembers(pgid)) == 0 })
}

// When the command exits by itself, the shim kills what it left behind.
func TestShimKillsLeftovers(t *testing.T) {
	r := startSupervisor(t, `
[[service]]
name = "leaky"
command = ["bash", "-c", "sleep 300 & echo $! > leak.log; sleep 0.2; exit 0"]
dir = "src/web"
`)
	waitFor(t, "first exit", 5*time.Second, func() bool { return len(r.service("leaky").RecentExits) > 0 })
	b, err := os.ReadFile(filepath.Join(r.ws, "src", "web", "leak.log"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "background sleep killed", 5*time.Second, func() bool {
		state, _, _, ok := procStat(pid)
		return !ok || state == "Z"
	})
	if code := r.service("leaky").RecentExits[0].Code; code != 0 {
		t.Errorf("exit code %d, want the command's 0", code)
	}
}
