package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/testenv"
)

// launchedEvent returns the data of the session.launched event of
// session id.
func (e *launchEnv) launchedEvent(t *testing.T, id string) map[string]any {
	t.Helper()
	out := e.h.Must(t, "events", "--task", "t1", "--json")
	for _, line := range strings.Split(out, "\n") {
		var ev struct {
			Type string         `json:"type"`
			Data map[string]any `json:"data"`
		}
		if json.Unmarshal([]byte(line), &ev) == nil && ev.Type == "session.launched" && ev.Data["session_id"] == id {
			return ev.Data
		}
	}
	t.Fatalf("no session.launched of %s in:\n%s", id, out)
	return nil
}

// prepareLead makes the run directory and workspace of a lead session of
// task t1 with session.launch and the grant in tok, for the host to run
// with sandbox run.
func (e *launchEnv) prepareLead(t *testing.T, tok string) (run, ws string) {
	t.Helper()
	base := filepath.Dir(e.h.Home)
	run, ws = filepath.Join(base, "lead-run"), filepath.Join(base, "lead-ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, code := runCmd(t, bin(t, "sandbox"), "prepare", "--run-dir", run, "--business", "acme", "--project", "web", "--task", "t1",
		"--role", "lead", "--caps", "session.launch", "--token-file", tok); code != 0 {
		t.Fatalf("sandbox prepare: exit %d\n%s", code, out)
	}
	return run, ws
}

// refusedLaunch runs a launch that must be refused LAUNCH_NOT_ALLOWED
// (exit 4) naming want, and checks it started nothing: no session
// directory, nothing in the log.
func (e *launchEnv) refusedLaunch(t *testing.T, tok, want string, args ...string) {
	t.Helper()
	before := e.h.Must(t, "events", "--json")
	dirs := e.sessionDirs(t)
	out, errOut, code := e.as(t, tok, append(append([]string{"--json", "session", "launch"}, args...), "--", "true")...)
	if code != 4 || !strings.Contains(errOut, "LAUNCH_NOT_ALLOWED") || !strings.Contains(errOut, want) {
		t.Errorf("launch %v: exit %d\n%s%s; want exit 4, LAUNCH_NOT_ALLOWED naming %q", args, code, out, errOut, want)
	}
	if after := e.h.Must(t, "events", "--json"); after != before {
		t.Errorf("refused launch %v changed the log:\n%s", args, strings.TrimPrefix(after, before))
	}
	if got := e.sessionDirs(t); strings.Join(got, ",") != strings.Join(dirs, ",") {
		t.Errorf("refused launch %v left session directories: %v, before %v", args, got, dirs)
	}
}

// TestLaunchBeyondGrant: a launch asking for a network mode its grant
// does not name, a limit over its ceiling, or another task is refused
// (exit 4) with nothing started; one naming no limits gets the host's
// defaults, as session.launched shows; a grant's launch bounds show in
// grant list and widen what it may ask.
func TestLaunchBeyondGrant(t *testing.T) {
	e := newLaunchEnv(t)
	e.h.Must(t, "task", "add", "--business", "acme", "--project", "web", "--task", "t2")
	e.refusedLaunch(t, e.lead, "--net=host", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--net=host")
	e.refusedLaunch(t, e.lead, "--net=proxy", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--net=proxy")
	e.refusedLaunch(t, e.lead, "--memory 64G", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--memory", "64G")
	e.refusedLaunch(t, e.lead, "--timeout 3h", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--timeout", "3h")
	e.refusedLaunch(t, e.lead, "task t2", "--task", "t2", "--role", "worker", "--caps", "git.push.working")

	// Naming no limits: the host's defaults, all of them. The session
	// lives until the launcher has seen its bwrap and recorded its
	// cgroup, one directory per controller the defaults need (to remove
	// it if its sandbox run dies first); a session that ends at once may
	// end before the launcher looks.
	id, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--", "sleep", "600")
	id = strings.TrimSpace(id)
	if code != 0 {
		t.Fatalf("session launch: exit %d\n%s", code, errOut)
	}
	var rec struct {
		Cgroup []string `json:"cgroup"`
	}
	testenv.WaitFor(t, time.Minute, "the launcher records the session's cgroup", func() bool {
		b, err := os.ReadFile(filepath.Join(e.h.Home, "sessions", id, "record.json"))
		return err == nil && json.Unmarshal(b, &rec) == nil && len(rec.Cgroup) > 0
	})
	if len(rec.Cgroup) != 3 {
		t.Errorf("record.json of a session with the default limits: cgroup %v", rec.Cgroup)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "stop", id); code != 0 {
		t.Fatalf("session stop: exit %d\n%s", code, errOut)
	}
	e.as(t, e.lead, "session", "wait", id)
	data := e.launchedEvent(t, id)
	limits, _ := data["limits"].(map[string]any)
	for _, l := range bounds.Limits {
		n, _ := l.Parse(l.Default)
		if limits[l.Name] != l.Format(n) {
			t.Errorf("session.launched limits %v: %s is not the default %s", limits, l.Name, l.Format(n))
		}
	}
	if data["net"] != "none" {
		t.Errorf("session.launched net %v, want none", data["net"])
	}

	// Every limit of sandbox run can be asked for through the launcher.
	all, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--memory", "128M", "--pids", "64", "--cpu", "0.5", "--nofile", "64", "--fsize", "1M", "--timeout", "10m", "--disk", "64M", "--", "sh", "-c", "echo nofile $(ulimit -n) fsize $(ulimit -f)")
	all = strings.TrimSpace(all)
	if code != 0 {
		t.Fatalf("session launch with every limit: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "wait", all); code != 0 {
		t.Fatalf("session wait: exit %d\n%s", code, errOut)
	}
	if logs := e.h.Must(t, "session", "logs", all); !strings.Contains(logs, "nofile 64 fsize 2048") {
		t.Errorf("a session launched with --nofile 64 --fsize 1M sees:\n%s", logs)
	}
	if got, _ := e.launchedEvent(t, all)["limits"].(map[string]any); fmt.Sprint(got) != "map[cpu:0.5 disk:64M fsize:1M memory:128M nofile:64 pids:64 timeout:10m0s]" {
		t.Errorf("session.launched limits %v", got)
	}

	// A grant naming bounds: they show in grant list, and are what it may ask.
	wide := filepath.Join(filepath.Dir(e.h.Home), "wide.token")
	e.h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead2", "--cap", "session.launch",
		"--launch", "worker=git.push.working", "--launch-net", "none,proxy", "--launch-max-pids", "64", "--launch-tasks", "t*",
		"--launch-allow-domain", "*.example.com", "--out", wide)
	var gl struct {
		Grants []struct {
			Role         string        `json:"role"`
			LaunchBounds bounds.Launch `json:"launch_bounds"`
		} `json:"grants"`
	}
	if err := json.Unmarshal([]byte(e.h.Must(t, "--json", "grant", "list", "--task", "t1", "--business", "acme", "--project", "web")), &gl); err != nil {
		t.Fatal(err)
	}
	shown := false
	for _, g := range gl.Grants {
		if g.Role == "lead2" {
			lb := g.LaunchBounds
			shown = strings.Join(lb.Nets, ",") == "none,proxy" && lb.Max["pids"] == "64" && lb.Tasks == "t*" && strings.Join(lb.AllowDomains, ",") == "*.example.com"
		}
	}
	if !shown {
		t.Errorf("grant list does not show lead2's launch bounds: %+v", gl.Grants)
	}
	if out := e.h.Must(t, "grant", "list", "--task", "t1", "--business", "acme", "--project", "web"); !strings.Contains(out, "net=none,proxy;max-pids=64;tasks=t*") {
		t.Errorf("grant list's text does not show the launch bounds:\n%s", out)
	}
	e.refusedLaunch(t, wide, "--pids 65", "--task", "t2", "--role", "worker", "--caps", "git.push.working", "--pids", "65")
	e.refusedLaunch(t, wide, "--allow-domain example.org", "--task", "t2", "--role", "worker", "--caps", "git.push.working", "--net=proxy", "--allow-domain", "example.org")
	id2, errOut, code := e.as(t, wide, "session", "launch", "--task", "t2", "--role", "worker", "--caps", "git.push.working", "--net=proxy", "--", "true")
	if code != 0 {
		t.Fatalf("a launch within the wider grant: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := e.as(t, wide, "session", "wait", strings.TrimSpace(id2)); code != 0 {
		t.Fatalf("session wait: exit %d\n%s", code, errOut)
	}
}

// TestLaunchFromBoundedLead: a lead run with --net=none --pids 40
// --memory 256M, whose grant would allow host networking and 1000 pids,
// cannot launch a --net=host worker or one asking more pids than it has;
// the worker it launches has no network and shares the lead's 40 tasks
// (its cgroup nests in the lead's); a worker still running when the lead
// ends ends with it.
func TestLaunchFromBoundedLead(t *testing.T) {
	e := newLaunchEnv(t)
	base := filepath.Dir(e.h.Home)
	leadTok := filepath.Join(base, "bounded-lead.token")
	e.h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead", "--cap", "session.launch",
		"--launch", "worker=git.push.working", "--launch-net", "none,proxy,host", "--launch-max-pids", "1000", "--out", leadTok)
	// A service on the host's loopback the worker must not reach.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var reached atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	run, ws := e.prepareLead(t, leadTok)
	sb := bin(t, "sandbox")
	// The worker tries the host's loopback service, then starts sleeps
	// until a fork fails (dash then gives up): each "started" line is one.
	worker := fmt.Sprintf(`python3 -c 'import socket
try:
    socket.create_connection(("127.0.0.1", %d), 3); print("net reached")
except OSError as e:
    print("net refused", e)'
for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40; do sleep 60 & echo started; done`, port)
	script := `bushost session launch --task t1 --role worker --caps git.push.working --net=host -- true; echo "host refused $?"
bushost session launch --task t1 --role worker --caps git.push.working --pids 100 -- true; echo "pids refused $?"
for i in 1 2 3 4 5 6 7 8 9 10; do sleep 600 & done
id=$(bushost session launch --task t1 --role worker --caps git.push.working -- sh -c '` + strings.ReplaceAll(worker, "'", `'"'"'`) + `')
echo "worker $id"
bushost session wait "$id"
echo "waited $?"
long=$(bushost session launch --task t1 --role worker --caps git.push.working -- sleep 600)
echo "long $long"`
	out, code := runCmd(t, sb, "run", "--run-dir", run, "--workspace", ws, "--role", "lead", "--caps", "session.launch",
		"--broker-socket", filepath.Join(e.h.Home, "broker.sock"), "--launch-socket", filepath.Join(e.h.Home, "launch.sock"),
		"--net=none", "--pids", "40", "--memory", "256M", "--", "sh", "-c", script)
	if code != 0 || !strings.Contains(out, "host refused 4") || !strings.Contains(out, "pids refused 4") || !strings.Contains(out, "calling session has --net=none") ||
		!strings.Contains(out, "above the calling session's own 40") {
		t.Fatalf("the lead: exit %d, want both launches refused (4) naming the lead's own bounds\n%s", code, out)
	}
	field := func(prefix string) string {
		for _, l := range strings.Split(out, "\n") {
			if v, ok := strings.CutPrefix(l, prefix); ok {
				return strings.TrimSpace(v)
			}
		}
		t.Fatalf("no %q line in the lead's output:\n%s", prefix, out)
		return ""
	}
	id, long := field("worker "), field("long ")
	logs := e.h.Must(t, "session", "logs", id)
	if !strings.Contains(logs, "net refused") || reached.Load() != 0 {
		t.Errorf("the worker of a --net=none lead reached the host's loopback (%d connections):\n%s", reached.Load(), logs)
	}
	started := strings.Count(logs, "started")
	t.Logf("the worker started %d sleeps beside the lead's 10", started)
	// The lead holds 10 sleeps, its shell, bwrap and pid 1; the worker its
	// shell, bwrap and pid 1: with the worker's cgroup nested in the
	// lead's, at most 40-16 sleeps fit. Alone it would get over 30.
	if started == 0 || started > 24 {
		t.Errorf("the worker started %d processes beside a lead holding 13 of its 40\n%s", started, logs)
	}
	data := e.launchedEvent(t, id)
	if limits, _ := data["limits"].(map[string]any); limits["pids"] != "40" || limits["memory"] != "256M" {
		t.Errorf("session.launched of the lead's worker: limits %v, want the lead's pids 40 and memory 256M", data["limits"])
	}
	// The lead has ended: so has the worker it left running.
	if _, errOut, code := e.h.Run(t, nil, "session", "wait", long); code == 0 {
		t.Errorf("session wait of the worker the lead left: exit 0, want it killed\n%s", errOut)
	}
	rows := decodeSessions(t, e.h.Must(t, "session", "list", "--json"))
	for _, r := range rows {
		if r.State == "running" {
			t.Errorf("session %s still running after its lead ended", r.ID)
		}
	}
}

// TestLaunchedGrantEndsWithSession: a launched session's token is refused
// (GRANT_REVOKED, exit 4) once the session has ended, been stopped, or
// been found ended by a restarted launcher; its token file is gone.
func TestLaunchedGrantEndsWithSession(t *testing.T) {
	e := newLaunchEnv(t)
	base := filepath.Dir(e.h.Home)
	// Each worker prints its token, then waits for its workspace's "go".
	launch := func(name string) (id, ws string) {
		ws = filepath.Join(base, name)
		if err := os.Mkdir(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
			"--workspace", ws, "--", "sh", "-c", `echo "token $(cat "$BUS_TOKEN_FILE")"; touch started; while [ ! -e go ]; do sleep 0.05; done`)
		if code != 0 {
			t.Fatalf("session launch: exit %d\n%s", code, errOut)
		}
		waitFor(t, filepath.Join(ws, "started"))
		return strings.TrimSpace(out), ws
	}
	tokenOf := func(id string) string {
		logs := e.h.Must(t, "session", "logs", id)
		for _, l := range strings.Split(logs, "\n") {
			if v, ok := strings.CutPrefix(l, "token "); ok {
				f := filepath.Join(base, "leaked-"+id)
				if err := os.WriteFile(f, []byte(v+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
				return f
			}
		}
		t.Fatalf("session %s printed no token:\n%s", id, logs)
		return ""
	}
	works := func(tok string) {
		t.Helper()
		if _, errOut, code := e.as(t, tok, "task", "show"); code != 0 {
			t.Fatalf("the running session's token: exit %d\n%s", code, errOut)
		}
	}
	refused := func(what, id, tok string) {
		t.Helper()
		if out, errOut, code := e.as(t, tok, "--json", "task", "show"); code != 4 || !strings.Contains(errOut, "GRANT_REVOKED") {
			t.Errorf("%s: its token: exit %d\n%s%s; want exit 4, GRANT_REVOKED", what, code, out, errOut)
		}
		if _, err := os.Stat(filepath.Join(e.h.Home, "sessions", id, "run", "token")); !os.IsNotExist(err) {
			t.Errorf("%s: its token file is still there: %v", what, err)
		}
	}

	ended, endedWS := launch("ws-ended")
	endedTok := tokenOf(ended)
	works(endedTok)
	if err := os.WriteFile(filepath.Join(endedWS, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "wait", ended); code != 0 {
		t.Fatalf("session wait: exit %d\n%s", code, errOut)
	}
	refused("a session that ended", ended, endedTok)

	stopped, _ := launch("ws-stopped")
	stoppedTok := tokenOf(stopped)
	works(stoppedTok)
	if _, errOut, code := e.as(t, e.lead, "session", "stop", stopped); code != 0 {
		t.Fatalf("session stop: exit %d\n%s", code, errOut)
	}
	refused("a stopped session", stopped, stoppedTok)

	// Ended while no launcher ran: the restarted one finds it ended.
	orphan, orphanWS := launch("ws-orphan")
	orphanTok := tokenOf(orphan)
	e.serve.Process.Kill()
	e.serve.Wait()
	e.serve = nil
	if err := os.WriteFile(filepath.Join(orphanWS, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, filepath.Join(e.h.Home, "sessions", orphan, "exit"))
	works(orphanTok) // no launcher ran to revoke it
	e.start(t)
	if _, errOut, code := e.as(t, e.lead, "session", "wait", orphan); code != 0 {
		t.Fatalf("session wait after the restart: exit %d\n%s", code, errOut)
	}
	refused("a session found ended after a restart", orphan, orphanTok)
}

// TestLaunchSockFlood: one uid holding 15,000 idle connections to
// launch.sock takes its own share only: another grant's launch, from
// another uid, is served within seconds, and the launcher stays under
// 128 MiB.
func TestLaunchSockFlood(t *testing.T) {
	e := newLaunchEnv(t)
	gid := groupID(t, e.group)
	// The attacker's 15,000 descriptors: its limit is inherited from here.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < 15100 {
		testenv.Missing(t, "an fd limit of 15100", "the hard RLIMIT_NOFILE is %d", lim.Max)
	}
	old := lim
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	he := &hostileEnv{h: e.h, group: e.group, gid: gid, hostile: testdataBin(t, "hostile")}
	_, attacker := makeUser(t, e.group)
	_, other := makeUser(t, e.group)
	before := rssKiB(t, e.serve.Process.Pid)
	he.attack(t, attacker, "conns", filepath.Join(e.h.Home, "launch.sock"), "15000")

	tok := filepath.Join(filepath.Dir(e.h.Home), "other-lead.token")
	e.h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead", "--cap", "session.launch",
		"--launch", "worker=git.push.working", "--out", tok)
	start := time.Now()
	id, errOut, code := he.asUser(t, other, tok, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--", "true")
	if code != 0 {
		b, _ := os.ReadFile(e.log)
		t.Fatalf("another grant's launch under the flood: exit %d after %s\n%s\n%s", code, time.Since(start), errOut, tail(string(b), 2000))
	}
	t.Logf("another grant's launch under the flood took %s", time.Since(start))
	if _, errOut, code := he.asUser(t, other, tok, "session", "wait", strings.TrimSpace(id)); code != 0 {
		t.Errorf("session wait: exit %d\n%s", code, errOut)
	}
	kb := rssKiB(t, e.serve.Process.Pid)
	t.Logf("launcher RSS %d KiB under 15,000 connections of one uid (%d KiB before)", kb, before)
	if kb <= 0 || kb > 128<<10 {
		t.Errorf("launcher RSS %d KiB, want under 128 MiB", kb)
	}
}

// rssKiB is the resident memory of pid, VmRSS of /proc/PID/status.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// TestLaunchFromProxyLead: a --net=proxy lead's worker gets an allow-list
// within the lead's and the grant's: a domain or host:port outside the
// lead's is refused even where the grant allows it, and a worker asking
// none gets the lead's entries the grant covers.
func TestLaunchFromProxyLead(t *testing.T) {
	e := newLaunchEnv(t)
	base := filepath.Dir(e.h.Home)
	leadTok := filepath.Join(base, "proxy-lead.token")
	e.h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead", "--cap", "session.launch",
		"--launch", "worker=git.push.working", "--launch-net", "none,proxy,host",
		"--launch-allow-domain", "*.example.com", "--launch-allow-host", "db.internal:5432", "--launch-allow-host", "db.internal:5433", "--out", leadTok)
	run, ws := e.prepareLead(t, leadTok)
	sb := bin(t, "sandbox")
	script := `launch() { bushost session launch --task t1 --role worker --caps git.push.working "$@" -- true; }
launch --net=host; echo "host refused $?"
launch --net=proxy --allow-domain www.example.com; echo "domain refused $?"
launch --net=proxy --allow-host db.internal:5433; echo "port refused $?"
echo "worker $(launch --net=proxy)"`
	out, code := runCmd(t, sb, "run", "--run-dir", run, "--workspace", ws, "--role", "lead", "--caps", "session.launch",
		"--broker-socket", filepath.Join(e.h.Home, "broker.sock"), "--launch-socket", filepath.Join(e.h.Home, "launch.sock"),
		"--net=proxy", "--allow-domain", "api.example.com", "--allow-domain", "example.org", "--allow-host", "db.internal:5432",
		"--", "sh", "-c", script)
	for _, want := range []string{"host refused 4", "domain refused 4", "port refused 4", "--allow-domain www.example.com (not in the calling session's allow-list)",
		"--allow-host db.internal:5433 (not in the calling session's allow-list)", "worker s-"} {
		if !strings.Contains(out, want) {
			t.Errorf("the proxy lead's output lacks %q (exit %d):\n%s", want, code, out)
		}
	}
	_, id, _ := strings.Cut(out, "worker ")
	id, _, _ = strings.Cut(id, "\n")
	if _, errOut, code := e.h.Run(t, nil, "session", "wait", strings.TrimSpace(id)); code != 0 {
		t.Fatalf("session wait: exit %d\n%s", code, errOut)
	}
	data := e.launchedEvent(t, strings.TrimSpace(id))
	if data["net"] != "proxy" || fmt.Sprint(data["allow_domains"]) != "[api.example.com]" || fmt.Sprint(data["allow_hosts"]) != "[db.internal:5432]" {
		t.Errorf("session.launched of the proxy lead's worker: %v", data)
	}
}

// TestLaunchFromLaunchedSession: with --max-launch-depth 2, a session the
// launcher started with --pids 64 and session.launch is bounded as a lead
// run by the host is: more pids than its own are refused, and its worker
// gets its 64 and ends with it.
func TestLaunchFromLaunchedSession(t *testing.T) {
	e := newLaunchEnv(t, "--max-launch-depth", "2")
	base := filepath.Dir(e.h.Home)
	tok := filepath.Join(base, "deep-lead.token")
	e.h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead", "--cap", "session.launch",
		"--launch", "sub=session.launch", "--launch", "worker=git.push.working", "--out", tok)
	script := `launch() { bushost session launch --task t1 --role worker --caps git.push.working "$@"; }
launch --pids 100 -- true; echo "pids refused $?"
echo "worker $(launch -- sleep 600)"`
	sub, errOut, code := e.as(t, tok, "session", "launch", "--task", "t1", "--role", "sub", "--caps", "session.launch", "--pids", "64", "--", "sh", "-c", script)
	sub = strings.TrimSpace(sub)
	if code != 0 {
		t.Fatalf("session launch of the sub-lead: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := e.as(t, tok, "session", "wait", sub); code != 0 {
		logs, _, _ := e.h.Run(t, nil, "session", "logs", sub)
		t.Fatalf("session wait of the sub-lead: exit %d\n%s\n%s", code, errOut, logs)
	}
	logs, logErr, _ := e.h.Run(t, nil, "session", "logs", sub)
	if !strings.Contains(logs, "pids refused 4") || !strings.Contains(logErr, "above the calling session's own 64") {
		t.Errorf("the sub-lead's launch over its own pids was not refused:\n%s%s", logs, logErr)
	}
	_, id, _ := strings.Cut(logs, "worker ")
	id, _, _ = strings.Cut(id, "\n")
	id = strings.TrimSpace(id)
	if limits, _ := e.launchedEvent(t, id)["limits"].(map[string]any); limits["pids"] != "64" {
		t.Errorf("the sub-lead's worker: limits %v, want its pids 64", limits)
	}
	if _, errOut, code := e.h.Run(t, nil, "session", "wait", id); code == 0 || code == 4 {
		t.Errorf("session wait of the worker the sub-lead left running: exit %d, want it killed\n%s", code, errOut)
	}
}

// TestLaunchFromUnknownSandbox: a lead whose bounds the launcher cannot
// read (a sandbox run --user session: no uid of its own, no record) is
// refused, whatever its grant allows.
func TestLaunchFromUnknownSandbox(t *testing.T) {
	e := newLaunchEnv(t)
	run, ws := e.prepareLead(t, e.lead)
	if err := os.Chown(ws, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	dirs := e.sessionDirs(t)
	out, code := runCmd(t, bin(t, "sandbox"), "run", "--user", "nobody", "--run-dir", run, "--workspace", ws, "--role", "lead", "--caps", "session.launch",
		"--broker-socket", filepath.Join(e.h.Home, "broker.sock"), "--launch-socket", filepath.Join(e.h.Home, "launch.sock"),
		"--", "sh", "-c", `bushost session launch --task t1 --role worker --caps git.push.working -- true; echo "refused $?"`)
	if !strings.Contains(out, "refused 4") || !strings.Contains(out, "LAUNCH_NOT_ALLOWED") || !strings.Contains(out, "another pid namespace") {
		t.Errorf("a launch from a sandbox run --user session: exit %d\n%s", code, out)
	}
	if got := e.sessionDirs(t); strings.Join(got, ",") != strings.Join(dirs, ",") {
		t.Errorf("the refused launch left session directories: %v", got)
	}
}
