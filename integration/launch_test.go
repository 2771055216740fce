package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// launchEnv is a bushostd with a socket group (so that sessions reach its
// sockets) and a sandbox serve on the same home.
type launchEnv struct {
	h     *Host
	state string // the launcher's state directory: the home, when root's
	group string // the socket group
	serve *exec.Cmd
	log   string
	args  []string
	lead  string // token file of a lead grant: session.launch, --launch worker=git.push.working
	other string // token file of a grant of project acme/api

	// sandbox, when set, is the sandbox serve runs (a hooked build); env
	// is added to its environment.
	sandbox string
	env     []string
}

func newLaunchEnv(t *testing.T, serveArgs ...string) *launchEnv {
	t.Helper()
	return newLaunchEnvAt(t, "", nil, serveArgs...)
}

// newLaunchEnvAt is newLaunchEnv on the home dir ("" for a new one), with
// prepare, when set, run on the home after bushostd started and before
// the launcher does (to give the home to another user).
func newLaunchEnvAt(t *testing.T, dir string, prepare func(e *launchEnv), serveArgs ...string) *launchEnv {
	t.Helper()
	testenv.NeedRoot(t, "sandbox serve gives each session a uid of its own")
	// A group of the test's own, removed at the end.
	group := testGroup(t, "bhl"+randSuffix())
	h := startHostWith(t, hostOpts{Home: dir, Args: []string{"--socket-group", group}})
	h.AddProject(t, "acme", "web")
	h.AddProject(t, "acme", "api")
	h.Must(t, "task", "add", "--business", "acme", "--project", "web", "--task", "t1")
	h.Must(t, "task", "add", "--business", "acme", "--project", "api", "--task", "a1")
	e := &launchEnv{h: h, state: h.Home, group: group, args: serveArgs, log: filepath.Join(filepath.Dir(h.Home), "serve.log")}
	e.lead = filepath.Join(filepath.Dir(h.Home), "lead.token")
	h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead",
		"--cap", "session.launch", "--launch", "worker=git.push.working", "--out", e.lead)
	bin(t, "bushostd") // sandbox serve becomes the bushostd beside it
	bin(t, "bushost")  // bound into sessions from beside the sandbox
	if prepare != nil {
		prepare(e)
	}
	e.start(t)
	t.Cleanup(func() {
		// Whatever a failed test left running is stopped, then the launcher.
		out, _, _ := h.Run(t, nil, "session", "list", "--json")
		for _, s := range decodeSessions(t, out) {
			if s.State == "running" {
				h.Run(t, nil, "session", "stop", s.ID)
			}
		}
		e.stop(t)
		// The disks of sessions whose workspace is still kept (sandbox
		// serve --keep-workspaces) are tmpfs mounts: gone with the test.
		disks, _ := filepath.Glob(filepath.Join(e.state, "sessions", "*", "disk"))
		for _, d := range disks {
			if err := syscall.Unmount(d, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL {
				t.Errorf("unmount %s: %v", d, err)
			}
		}
		// A failed test may leave what the launcher no longer follows:
		// every recorded process still there is killed.
		recs, _ := filepath.Glob(filepath.Join(e.state, "sessions", "*", "record.json"))
		for _, f := range recs {
			var rec struct {
				PID        int      `json:"pid"`
				Start      uint64   `json:"start_time"`
				BwrapPID   int      `json:"bwrap_pid"`
				BwrapStart uint64   `json:"bwrap_start"`
				Cgroup     []string `json:"cgroup"`
			}
			if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &rec) == nil {
				// Nothing of an ended session stays: not its cgroup either.
				for _, d := range rec.Cgroup {
					if _, err := os.Stat(d); err == nil {
						t.Errorf("%s: cgroup %s left behind", f, d)
						syscall.Rmdir(d)
					}
				}
				for _, p := range [][2]uint64{{uint64(rec.BwrapPID), rec.BwrapStart}, {uint64(rec.PID), rec.Start}} {
					// The start time too: the pid may be another process's by now.
					if pid := int(p[0]); pid > 0 && alive(pid) && procStart(pid) == p[1] {
						t.Errorf("%s: pid %d left running", f, pid)
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
		}
		if b, err := os.ReadFile(e.log); err == nil && strings.Contains(string(b), raceReport) {
			t.Errorf("sandbox serve (bushostd launcher, built with -race) reported a data race")
		}
		if t.Failed() {
			b, _ := os.ReadFile(e.log)
			t.Logf("sandbox serve log:\n%s", tail(string(b), 4000))
		}
	})
	return e
}

func (e *launchEnv) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(e.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	sb := e.sandbox
	if sb == "" {
		sb = bin(t, "sandbox")
	}
	cmd := exec.Command(sb, append([]string{"serve", "--home", e.h.Home, "--stop-grace", "2s"}, e.args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), e.env...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.serve = cmd
	sock := filepath.Join(e.h.Home, "launch.sock")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(e.log)
			t.Fatalf("sandbox serve did not come up:\n%s", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *launchEnv) stop(t *testing.T) {
	if e.serve == nil {
		return
	}
	e.serve.Process.Signal(syscall.SIGTERM)
	e.serve.Wait()
	e.serve = nil
}

// as runs bushost with the token file tok.
func (e *launchEnv) as(t *testing.T, tok string, args ...string) (string, string, int) {
	t.Helper()
	return e.h.Run(t, []string{"BUS_TOKEN_FILE=" + tok}, args...)
}

type sessionRow struct {
	ID    string `json:"id"`
	Task  string `json:"task"`
	Role  string `json:"role"`
	UID   int    `json:"uid"`
	State string `json:"state"`
	Exit  int    `json:"exit"`
}

func decodeSessions(t *testing.T, out string) []sessionRow {
	var rows []sessionRow
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r sessionRow
		if json.Unmarshal(sc.Bytes(), &r) == nil && r.ID != "" {
			rows = append(rows, r)
		}
	}
	return rows
}

// procStart is field 22 of /proc/PID/stat, the process's start time.
func procStart(pid int) uint64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// sessionEvents returns the session.* events of task t1 about session id.
func (e *launchEnv) sessionEvents(t *testing.T, id string) []string {
	t.Helper()
	out := e.h.Must(t, "events", "--task", "t1", "--json")
	var types []string
	for _, line := range strings.Split(out, "\n") {
		var ev struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil || !strings.HasPrefix(ev.Type, "session.") {
			continue
		}
		if strings.Contains(string(ev.Data), `"session_id":"`+id+`"`) {
			types = append(types, ev.Type)
		}
	}
	return types
}

func (e *launchEnv) sessionDirs(t *testing.T) []string {
	ents, _ := os.ReadDir(filepath.Join(e.h.Home, "sessions"))
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	return names
}

// TestLaunchWorker: a lead grant launches a worker session that pushes;
// session wait exits with its status; session.launched and session.ended
// are in the log; launches outside the lead's set are refused with
// LAUNCH_NOT_ALLOWED and start nothing.
func TestLaunchWorker(t *testing.T) {
	e := newLaunchEnv(t)
	script := `set -e
if [ -e "$BUSHOST_HOME/launch.sock" ]; then echo "a worker has the launch socket"; exit 9; fi
bushost fetch-main --repo repo
cd repo
echo "made by a worker" > work.txt
git add work.txt
git -c user.name=worker -c user.email=worker@example.com commit -q -m "work of a launched worker"
echo "head $(git rev-parse HEAD)"
bushost push-working --repo .
exit 5`
	id, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--memory", "512M", "--pids", "256", "--", "sh", "-c", script)
	id = strings.TrimSpace(id)
	if code != 0 || !strings.HasPrefix(id, "s-") {
		t.Fatalf("session launch: exit %d, %q\n%s", code, id, errOut)
	}
	out, errOut, code := e.as(t, e.lead, "session", "wait", id)
	if code != 5 {
		logs, logErr, _ := e.as(t, e.lead, "session", "logs", id)
		t.Fatalf("session wait: exit %d, want the session's 5\n%s%s\nlogs:\n%s%s", code, out, errOut, logs, logErr)
	}
	// grant list shows the lead's launch set, and the worker's grant as
	// launched by the lead, one launch deep.
	var gl struct {
		Grants []struct {
			ID          string              `json:"id"`
			Role        string              `json:"role"`
			Launch      map[string][]string `json:"launch"`
			LaunchedBy  string              `json:"launched_by"`
			LaunchDepth int64               `json:"launch_depth"`
		} `json:"grants"`
	}
	if err := json.Unmarshal([]byte(e.h.Must(t, "--json", "grant", "list", "--business", "acme", "--project", "web", "--task", "t1")), &gl); err != nil {
		t.Fatal(err)
	}
	leadID := ""
	for _, g := range gl.Grants {
		if g.Role == "lead" {
			leadID = g.ID
			if !slices.Equal(g.Launch["worker"], []string{"git.push.working"}) || len(g.Launch) != 1 {
				t.Fatalf("grant list shows the lead's launch set as %v", g.Launch)
			}
		}
	}
	workers := 0
	for _, g := range gl.Grants {
		if g.Role == "worker" && g.LaunchedBy == leadID && g.LaunchDepth == 1 && len(g.Launch) == 0 {
			workers++
		}
	}
	if leadID == "" || workers == 0 {
		t.Fatalf("grant list: no lead, or no worker launched by it: %+v", gl.Grants)
	}
	logs, _, code := e.as(t, e.lead, "session", "logs", "--follow", id)
	var head string
	for _, line := range strings.Split(logs, "\n") {
		if v, ok := strings.CutPrefix(line, "head "); ok {
			head = v
		}
	}
	if code != 0 || len(head) != 40 {
		t.Fatalf("session logs: exit %d, no head line:\n%s", code, logs)
	}
	if work := testGit(t, e.h.TaskRepo("acme", "web", "t1"), "rev-parse", "refs/work/t1"); work != head {
		t.Errorf("refs/work/t1 = %s, want the worker's commit %s", work, head)
	}
	if got := e.sessionEvents(t, id); strings.Join(got, ",") != "session.launched,session.ended" {
		t.Errorf("session events: %v, want session.launched then session.ended", got)
	}
	if evs := e.h.Must(t, "events", "--task", "t1", "--json"); !strings.Contains(evs, `"peak_memory":`) || !strings.Contains(evs, `"memory":"512M"`) {
		t.Errorf("the session's events lack its limits or peak memory:\n%s", evs)
	}
	rows := decodeSessions(t, e.h.Must(t, "session", "list", "--json"))
	if len(rows) != 1 || rows[0].ID != id || rows[0].State != "exited" || rows[0].Exit != 5 || rows[0].Role != "worker" || rows[0].UID == 0 {
		t.Errorf("session list: %+v", rows)
	}
	// The session's grant does not hold session.launch: it cannot launch.
	if _, err := os.Stat(filepath.Join(e.h.Home, "sessions", id, "run")); !os.IsNotExist(err) {
		t.Errorf("the run directory (with its token) was not reclaimed: %v", err)
	}

	// Output is kept bounded on disk: 16 MiB of each stream, then a note.
	big, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--", "sh", "-c", "yes x | head -c 20000000")
	big = strings.TrimSpace(big)
	if code != 0 {
		t.Fatalf("session launch: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "wait", big); code != 0 {
		t.Fatalf("session wait: exit %d\n%s", code, errOut)
	}
	st, err := os.Stat(filepath.Join(e.h.Home, "sessions", big, "stdout"))
	if err != nil || st.Size() > 16<<20+200 {
		t.Errorf("the session's stdout on disk: %v, want at most 16 MiB and a note", err)
	}
	if logs, _, _ := e.as(t, e.lead, "session", "logs", big); len(logs) > 1<<20 || !strings.Contains(logs, "[sandbox keep: 3222784 bytes beyond the first 16777216 dropped]") {
		t.Errorf("session logs of a session writing 20 MB: %d bytes ending %q", len(logs), tail(logs, 100))
	}

	// Refusals: each PermissionDenied LAUNCH_NOT_ALLOWED (exit 4), nothing
	// started, nothing in the log.
	before := e.h.Must(t, "events", "--json")
	dirs := e.sessionDirs(t)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"a role outside the set", []string{"--task", "t1", "--role", "reviewer", "--caps", "git.push.working"}, "role reviewer"},
		{"a capability outside the set", []string{"--task", "t1", "--role", "worker", "--caps", "git.push.working,review.verdict"}, "capability review.verdict"},
		{"session.launch beyond the depth", []string{"--task", "t1", "--role", "worker", "--caps", "session.launch"}, "session.launch"},
		{"another project's task", []string{"--project", "api", "--task", "a1", "--role", "worker", "--caps", "git.push.working"}, "acme/api"},
	} {
		args := append(append([]string{"--json", "session", "launch"}, c.args...), "--", "true")
		out, errOut, code := e.as(t, e.lead, args...)
		if code != 4 || !strings.Contains(errOut, "LAUNCH_NOT_ALLOWED") || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d\n%s%s; want exit 4, LAUNCH_NOT_ALLOWED naming %q", c.name, code, out, errOut, c.want)
		}
	}
	if after := e.h.Must(t, "events", "--json"); after != before {
		t.Errorf("refused launches changed the log:\n%s", strings.TrimPrefix(after, before))
	}
	if got := e.sessionDirs(t); strings.Join(got, ",") != strings.Join(dirs, ",") {
		t.Errorf("refused launches left session directories: %v, before %v", got, dirs)
	}
	// A grant without session.launch is refused too.
	worker := e.h.Grant(t, "acme", "web", "t1", "coder", "git.push.working")
	if _, errOut, code := e.as(t, worker, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--", "true"); code != 4 {
		t.Errorf("a grant without session.launch: exit %d\n%s", code, errOut)
	}
}

// TestLaunchLimit: with --max-sessions-per-grant 8, the ninth launch of one
// grant is refused (exit 7) while eight run.
func TestLaunchLimit(t *testing.T) {
	e := newLaunchEnv(t, "--max-sessions-per-grant", "8")
	var ids []string
	for i := range 8 {
		out, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--", "sleep", "600")
		if code != 0 {
			t.Fatalf("launch %d: exit %d\n%s", i+1, code, errOut)
		}
		ids = append(ids, strings.TrimSpace(out))
	}
	dirs := e.sessionDirs(t)
	_, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--", "sleep", "600")
	if code != 7 || !strings.Contains(errOut, "SESSION_LIMIT") {
		t.Errorf("ninth launch: exit %d, want 7 (SESSION_LIMIT)\n%s", code, errOut)
	}
	if got := e.sessionDirs(t); len(got) != len(dirs) {
		t.Errorf("the refused launch left a session directory: %v", got)
	}
	rows := decodeSessions(t, e.h.Must(t, "session", "list", "--json"))
	running := 0
	for _, r := range rows {
		if r.State == "running" {
			running++
		}
	}
	if running != 8 {
		t.Errorf("%d sessions running, want 8: %+v", running, rows)
	}
	for _, id := range ids {
		if out, errOut, code := e.as(t, e.lead, "session", "stop", id); code != 0 {
			t.Errorf("session stop %s: exit %d\n%s%s", id, code, out, errOut)
		}
	}
}

// TestLaunchSurvivesServeKill: sandbox serve killed with SIGKILL leaves
// its session running; a restarted one re-adopts it, lists it, waits for
// it with its status, and records session.ended once.
func TestLaunchSurvivesServeKill(t *testing.T) {
	e := newLaunchEnv(t)
	// Each session ends, with its status, once the test lets it: one after
	// the launcher is back, one while no launcher runs.
	launch := func(name string, status int) (id, ws string) {
		ws = filepath.Join(filepath.Dir(e.h.Home), name)
		if err := os.Mkdir(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
			"--workspace", ws, "--", "sh", "-c", "touch started; while [ ! -e go ]; do sleep 0.05; done; exit "+fmt.Sprint(status))
		if code != 0 {
			t.Fatalf("session launch: exit %d\n%s", code, errOut)
		}
		waitFor(t, filepath.Join(ws, "started"))
		return strings.TrimSpace(out), ws
	}
	id, ws := launch("ws", 3)
	early, earlyWS := launch("ws-early", 4)
	orphan, _ := launch("ws-orphan", 5)
	type record struct {
		PID      int `json:"pid"`
		BwrapPID int `json:"bwrap_pid"`
	}
	readRecord := func(id string) record {
		var rec record
		var b []byte
		if !testenv.Poll(30*time.Second, func() bool {
			rec = record{}
			b, _ = os.ReadFile(filepath.Join(e.h.Home, "sessions", id, "record.json"))
			return json.Unmarshal(b, &rec) == nil && rec.PID != 0 && rec.BwrapPID != 0
		}) {
			t.Fatalf("record.json of %s names no pid and bwrap pid: %s", id, b)
		}
		return rec
	}
	rec, orphanRec := readRecord(id), readRecord(orphan)
	e.serve.Process.Kill()
	e.serve.Wait()
	e.serve = nil
	if !alive(rec.PID) {
		t.Fatalf("the session (pid %d) died with sandbox serve", rec.PID)
	}
	// One loses its sandbox keep (and so its status) but not its bwrap:
	// the next launcher follows it, and records it lost.
	syscall.Kill(orphanRec.PID, syscall.SIGKILL)
	testenv.WaitFor(t, 30*time.Second, "sandbox keep to die of SIGKILL", func() bool { return !alive(orphanRec.PID) })
	if !alive(orphanRec.BwrapPID) {
		t.Fatalf("the orphaned session's bwrap (pid %d) died with its sandbox keep", orphanRec.BwrapPID)
	}
	// One ends while no launcher runs: sandbox keep leaves its status.
	if err := os.WriteFile(filepath.Join(earlyWS, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, filepath.Join(e.h.Home, "sessions", early, "exit"))
	e.start(t)
	rows := decodeSessions(t, e.h.Must(t, "session", "list", "--json"))
	states := map[string]string{}
	for _, r := range rows {
		states[r.ID] = r.State
	}
	if len(rows) != 3 || states[id] != "running" || states[orphan] != "running" || (states[early] != "exited" && states[early] != "running") {
		logs, logErr, _ := e.as(t, e.lead, "session", "logs", orphan)
		t.Fatalf("after the restart, session list: %+v\norphan's logs:\n%s%s", rows, logs, logErr)
	}
	if out, errOut, code := e.as(t, e.lead, "--json", "session", "stop", orphan); code != 0 || !strings.Contains(out, `"state":"lost"`) {
		t.Errorf("session stop of the orphaned session: exit %d, want it lost\n%s%s", code, out, errOut)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "wait", orphan); code != 1 || !strings.Contains(errOut, "lost") {
		t.Errorf("session wait of a lost session: exit %d, want 1 saying lost\n%s", code, errOut)
	}
	if alive(orphanRec.BwrapPID) {
		t.Errorf("the orphaned session's bwrap (pid %d) outlived session stop", orphanRec.BwrapPID)
	}
	if out, errOut, code := e.as(t, e.lead, "session", "wait", early); code != 4 {
		t.Fatalf("session wait of the session that ended while no launcher ran: exit %d, want 4\n%s%s", code, out, errOut)
	}
	if err := os.WriteFile(filepath.Join(ws, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := e.as(t, e.lead, "session", "wait", id); code != 3 {
		t.Fatalf("session wait after the restart: exit %d, want 3\n%s%s", code, out, errOut)
	}
	// A second restart finds it recorded and records nothing more.
	e.stop(t)
	e.start(t)
	if out, _, code := e.as(t, e.lead, "session", "wait", id); code != 3 {
		t.Errorf("session wait after a second restart: exit %d\n%s", code, out)
	}
	for _, x := range []string{id, early, orphan} {
		if got := e.sessionEvents(t, x); strings.Join(got, ",") != "session.launched,session.ended" {
			t.Errorf("session %s events: %v, want session.launched and one session.ended", x, got)
		}
	}
	if alive(rec.PID) {
		t.Errorf("pid %d still alive", rec.PID)
	}
}

// TestLaunchFromLeadSession: a lead session (sandbox run with
// session.launch and the launch socket) launches a worker from inside and
// waits for it, as the host would.
func TestLaunchFromLeadSession(t *testing.T) {
	e := newLaunchEnv(t)
	run, ws := e.prepareLead(t, e.lead)
	sb := bin(t, "sandbox")
	script := `set -e
id=$(bushost session launch --task t1 --role worker --caps git.push.working -- sh -c 'exit 6')
echo "launched $id"
set +e
bushost session wait "$id"
echo "waited $?"
bushost session launch --task t1 --role reviewer --caps review.verdict -- true
echo "refused $?"
echo "long $(bushost session launch --task t1 --role worker --caps git.push.working -- sleep 600)"`
	out, code := runCmd(t, sb, "run", "--run-dir", run, "--workspace", ws, "--role", "lead", "--caps", "session.launch",
		"--broker-socket", filepath.Join(e.h.Home, "broker.sock"), "--launch-socket", filepath.Join(e.h.Home, "launch.sock"),
		"--", "sh", "-c", script)
	if code != 0 || !strings.Contains(out, "launched s-") || !strings.Contains(out, "waited 6") || !strings.Contains(out, "refused 4") ||
		!strings.Contains(out, "LAUNCH_NOT_ALLOWED") {
		t.Fatalf("inside the lead session: exit %d, want a launch, its status 6, and a refusal (4)\n%s", code, out)
	}
	// The lead has ended (it had no cgroup: sandbox run --end-with): so
	// has the worker it left running.
	_, long, _ := strings.Cut(out, "long ")
	long, _, _ = strings.Cut(long, "\n")
	if _, errOut, code := e.h.Run(t, nil, "session", "wait", strings.TrimSpace(long)); code == 0 || code == 4 {
		t.Errorf("session wait of the worker the lead left running: exit %d, want it killed\n%s", code, errOut)
	}
	rows := decodeSessions(t, e.h.Must(t, "session", "list", "--json"))
	if len(rows) != 2 || rows[0].Role != "worker" || rows[0].Exit != 6 || rows[1].State == "running" {
		t.Errorf("session list: %+v", rows)
	}
}

// runCmd runs a command and returns its combined output and exit status.
func runCmd(t *testing.T, name string, args ...string) (string, int) {
	t.Helper()
	b, err := exec.Command(name, args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(b), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return string(b), 0
}
