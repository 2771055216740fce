package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/supervisor"
	"github.com/bushost/bushost/internal/testenv"
)

// helloServer is the website the supervised service runs: it answers HTTP
// and exits 1 while the file named by $BROKEN_FLAG exists.
const helloServer = `package main

import (
	"fmt"
	"net/http"
	"os"
	"time"
)

func broken() bool {
	_, err := os.Stat(os.Getenv("BROKEN_FLAG"))
	return err == nil
}

func main() {
	if broken() {
		fmt.Println("broken flag set")
		os.Exit(1)
	}
	go func() {
		for range time.Tick(50 * time.Millisecond) {
			if broken() {
				os.Exit(1)
			}
		}
	}()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	fmt.Println(http.ListenAndServe(os.Args[1], nil))
	os.Exit(1)
}
`

const serveV1 = `#!/bin/bash
echo "website v1 starting"
sleep 1000 &
exec "$HELLO" "$ADDR"
`

const houseRules = "# House rules\n\nNever edit infra/.\n"

var (
	helloOnce sync.Once
	helloPath string
	helloErr  error
)

// buildHello builds the website's server once, into the binaries directory
// that TestMain removes and that app can read.
func buildHello(t *testing.T) string {
	t.Helper()
	helloOnce.Do(func() {
		src := filepath.Join(binDir, "supervisor-hello.go")
		if helloErr = os.WriteFile(src, []byte(helloServer), 0o644); helloErr != nil {
			return
		}
		helloPath = filepath.Join(binDir, "supervisor-hello")
		if out, err := exec.Command("go", "build", "-o", helloPath, src).CombinedOutput(); err != nil {
			helloErr = fmt.Errorf("build hello server: %v\n%s", err, out)
		}
	})
	if helloErr != nil {
		t.Fatal(helloErr)
	}
	return helloPath
}

// supEnv is one supervised workspace under a directory other users can
// traverse (t.TempDir's parents are 0700).
type supEnv struct {
	t        *testing.T
	base     string
	ws       string
	config   string
	seed     string
	flag     string
	addr     string
	cmd      *exec.Cmd
	out      *syncBuf
	exited   chan struct{}
	webPort  int
	maxFails int
	// initArgs are added to `supervisor init`'s command line; exe, when
	// set, is the supervisor run (a hooked build), env added to its
	// environment.
	initArgs []string
	exe      string
	env      []string
	// wrap, when set, runs the supervisor under it (prlimit ... --).
	wrap []string
	// The three users, named for this test only and removed after it.
	app, agent, svc string
	gitDir          string
}

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "the supervisor's init needs root (users, ownership)")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func mustWrite(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func newSupEnv(t *testing.T) *supEnv {
	t.Helper()
	requireRoot(t)
	base, err := os.MkdirTemp("/var/tmp", "bushost-supervisor-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(base, "tmp")
	if err := os.Mkdir(tmp, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	helloPath := buildHello(t)
	e := &supEnv{
		t: t, base: base, ws: filepath.Join(base, "ws"), config: filepath.Join(base, "supervisor.toml"),
		seed: filepath.Join(base, "seed"), flag: filepath.Join(base, "broken"),
		webPort: freePort(t), maxFails: 2,
		gitDir: filepath.Join(base, "state", "git"),
	}
	e.app, e.agent, e.svc = uniqueUsers(t)
	e.addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	mustWrite(t, filepath.Join(e.seed, "src", "website", "serve.sh"), serveV1, 0o755)
	mustWrite(t, filepath.Join(e.seed, "src", "website", "node_modules", "dep.js"), "dependency\n", 0o644)
	mustWrite(t, filepath.Join(e.seed, ".github", "workflows", "ci.yml"), "on: push\n", 0o644)
	mustWrite(t, filepath.Join(e.seed, ".git", "HEAD"), "ref: refs/heads/seed\n", 0o644)
	mustWrite(t, filepath.Join(e.seed, "infra", "AGENTS.md"), houseRules, 0o644)
	mustWrite(t, filepath.Join(e.seed, "infra", "deploy.sh"), "#!/bin/sh\n", 0o755)
	mustWrite(t, e.config, fmt.Sprintf(`
workspace = "ws"
git_dir = %q
app_user = %q
agent_user = %q
services_user = %q
watch = ["src"]
health_addr = %q
debounce = "100ms"
good_after = "2s"
crash_window = "5s"
crash_threshold = 3
max_failed_reverts = %d
restart_backoff = "50ms"
max_backoff = "500ms"
stop_grace = "1s"

[[service]]
name = "website"
command = ["bash", "./serve.sh"]
dir = "src/website"
env = ["HELLO=%s", "ADDR=127.0.0.1:%d", "BROKEN_FLAG=%s"]
[service.health]
http = "http://127.0.0.1:%d/"
interval = "50ms"
timeout = "500ms"
`, e.gitDir, e.app, e.agent, e.svc, e.addr, e.maxFails, helloPath, e.webPort, e.flag, e.webPort), 0o644)
	return e
}

// boot runs `supervisor init` (which becomes `supervisor run` as app) and
// waits for its health server.
func (e *supEnv) boot() {
	t := e.t
	t.Helper()
	e.out = &syncBuf{}
	exe := e.exe
	if exe == "" {
		exe = bin(t, "supervisor")
	}
	argv := append(append(append([]string{}, e.wrap...), exe, "init", "--config", e.config, "--seed", e.seed), e.initArgs...)
	e.cmd = exec.Command(argv[0], argv[1:]...)
	e.cmd.Env = append(append(os.Environ(), "TMPDIR="+filepath.Join(e.base, "tmp")), e.env...)
	e.cmd.Stdout, e.cmd.Stderr = e.out, e.out
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.exited = make(chan struct{})
	cmd, exited := e.cmd, e.exited
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		e.shutdown()
		if t.Failed() {
			t.Logf("supervisor output:\n%s", e.out.String())
		}
	})
	e.waitFor("health server", 20*time.Second, func() bool {
		select {
		case <-exited:
			t.Fatalf("supervisor exited early:\n%s", e.out.String())
		default:
		}
		resp, err := http.Get("http://" + e.addr + "/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
}

// shutdown stops the supervisor with SIGTERM, as a container runtime would.
func (e *supEnv) shutdown() {
	if e.cmd == nil || e.cmd.Process == nil {
		return
	}
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		e.cmd.Process.Kill()
		<-e.exited
	}
}

func (e *supEnv) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	testenv.WaitFor(e.t, timeout, what, cond)
}

func (e *supEnv) status() supervisor.Status {
	e.t.Helper()
	resp, err := http.Get("http://" + e.addr + "/status")
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st supervisor.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		e.t.Fatal(err)
	}
	return st
}

func (e *supEnv) healthz() int {
	e.t.Helper()
	resp, err := http.Get("http://" + e.addr + "/healthz")
	if err != nil {
		e.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// git runs git on the supervisor's own repository through gitcmd, as root
// on a git dir owned by app.
func (e *supEnv) git(sub string, flags []string, args ...string) string {
	e.t.Helper()
	r, err := gitcmd.New(filepath.Join(e.t.TempDir(), "githome"))
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := r.Line(context.Background(), gitcmd.Cmd{
		Dir: e.ws, GitDir: e.gitDir, Sub: sub, Flags: flags, Args: args,
		Config: []string{"safe.directory=" + e.ws},
	}, 16<<20)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// uniqueUsers returns names for the supervisor's three users that no other
// test uses, and removes the users (homes and groups too) when the test
// ends; init makes them.
func uniqueUsers(t *testing.T) (app, agent, svc string) {
	t.Helper()
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("bh%x", b)
	app, agent, svc = prefix+"-app", prefix+"-agent", prefix+"-svc"
	t.Cleanup(func() {
		for _, u := range []string{app, svc, agent} {
			if _, err := user.Lookup(u); err != nil {
				continue
			}
			if out, err := exec.Command("userdel", "--remove", u).CombinedOutput(); err != nil {
				t.Errorf("userdel %s: %v: %s", u, err, out)
			}
		}
		for _, g := range []string{app, svc, agent} {
			if _, err := user.LookupGroup(g); err == nil {
				if out, err := exec.Command("groupdel", g).CombinedOutput(); err != nil {
					t.Errorf("groupdel %s: %v: %s", g, err, out)
				}
			}
		}
	})
	return app, agent, svc
}

// asAgent runs a shell command as the agent user.
func (e *supEnv) asAgent(script string) (string, error) {
	e.t.Helper()
	out, err := exec.Command("su", "-s", "/bin/sh", e.agent, "-c", script).CombinedOutput()
	return string(out), err
}

// procStatus returns the fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func TestSupervisorEditGoodRevert(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })

	// The seed came without .git, .github and node_modules.
	for _, gone := range []string{".github", "src/website/node_modules"} {
		if _, err := os.Lstat(filepath.Join(e.ws, gone)); !os.IsNotExist(err) {
			t.Errorf("%s was seeded", gone)
		}
	}
	if b := e.git("symbolic-ref", nil, "HEAD"); b != "refs/heads/main" {
		t.Errorf("seed's .git was copied: HEAD -> %s", b)
	}

	// Healthy for good_after: refs/supervisor/good = HEAD.
	var first string
	e.waitFor("first good commit", 10*time.Second, func() bool {
		st := e.status()
		first = st.Head
		return st.Good != "" && st.Good == st.Head
	})
	if got := e.git("rev-parse", []string{"--verify"}, supervisor.GoodRef); got != first {
		t.Fatalf("%s = %s, status says %s", supervisor.GoodRef, got, first)
	}

	// An edit by the agent: one commit authored by agent, one restart.
	serve := filepath.Join(e.ws, "src", "website", "serve.sh")
	v2 := filepath.Join(e.base, "serve-v2.sh")
	mustWrite(t, v2, strings.Replace(serveV1, "v1", "v2", 1), 0o644)
	if out, err := e.asAgent("cp " + v2 + " " + serve); err != nil {
		t.Fatalf("agent edit: %v: %s", err, out)
	}
	var edit string
	e.waitFor("agent commit", 10*time.Second, func() bool {
		edit = e.status().Head
		return edit != first
	})
	if who := e.git("log", []string{"-1", "--format=%an <%ae>|%cn"}, edit); who != "agent <agent@localhost>|agent" {
		t.Errorf("edit commit by %q", who)
	}
	if n := e.git("rev-list", []string{"--count"}, first+".."+edit); n != "1" {
		t.Errorf("%s commits for one edit", n)
	}
	e.waitFor("restarted with v2", 10*time.Second, func() bool { return strings.Contains(e.out.String(), "website v2 starting") })
	if r := e.status().Services[0].Restarts; r != 1 {
		t.Errorf("restarts = %d after one edit", r)
	}
	e.waitFor("edit becomes good", 10*time.Second, func() bool { return e.status().Good == edit })

	// An edit that exits 1 at start: bricked, reverted by the supervisor.
	if out, err := e.asAgent("printf '#!/bin/bash\\necho broken\\nexit 1\\n' > " + serve); err != nil {
		t.Fatalf("agent edit: %v: %s", err, out)
	}
	var st supervisor.Status
	e.waitFor("revert", 15*time.Second, func() bool {
		st = e.status()
		return len(st.Reverts) > 0
	})
	rev := st.Reverts[0]
	if rev.Error != "" || rev.To != edit || rev.Service != "website" {
		t.Fatalf("revert %+v", rev)
	}
	if who := e.git("log", []string{"-1", "--format=%an <%ae>|%cn"}, rev.Commit); who != "supervisor <supervisor@localhost>|supervisor" {
		t.Errorf("revert commit by %q", who)
	}
	if a, b := e.git("rev-parse", nil, rev.Commit+"^{tree}"), e.git("rev-parse", nil, edit+"^{tree}"); a != b {
		t.Errorf("revert tree %s, good tree %s", a, b)
	}
	broken := e.git("rev-parse", nil, rev.Commit+"^")
	if who := e.git("log", []string{"-1", "--format=%an"}, broken); who != "agent" {
		t.Errorf("the breaking edit is by %q", who)
	}
	e.waitFor("healthy after revert", 10*time.Second, func() bool { return e.healthz() == 200 })
	if b, _ := os.ReadFile(serve); !strings.Contains(string(b), "v2 starting") {
		t.Errorf("serve.sh after revert:\n%s", b)
	}
	if len(e.status().Reverts) != 1 {
		t.Errorf("reverts: %+v", e.status().Reverts)
	}
}

// Operated as a service: a revert reaches the webhook of notify_url with
// its commits and is counted on /metrics; `init --log-format json` hands
// the format to `run`, so the log is JSON lines.
func TestSupervisorMetricsAndNotifications(t *testing.T) {
	e := newSupEnv(t)
	var mu sync.Mutex
	var got []supervisor.Notification
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n supervisor.Notification
		if err := json.NewDecoder(r.Body).Decode(&n); err != nil {
			t.Errorf("notification body: %v", err)
		}
		mu.Lock()
		got = append(got, n)
		mu.Unlock()
	}))
	defer hook.Close()
	cfg, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, e.config, fmt.Sprintf("notify_url = %q\n", hook.URL)+string(cfg), 0o644)
	e.initArgs = []string{"--log-format", "json"}
	e.boot()
	var good string
	e.waitFor("first good commit", 10*time.Second, func() bool {
		st := e.status()
		good = st.Good
		return good != "" && good == st.Head
	})

	serve := filepath.Join(e.ws, "src", "website", "serve.sh")
	if out, err := e.asAgent("printf '#!/bin/bash\\nexit 1\\n' > " + serve); err != nil {
		t.Fatalf("agent edit: %v: %s", err, out)
	}
	var rev supervisor.Notification
	e.waitFor("revert notification", 20*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range got {
			if n.Event == supervisor.EventRevert {
				rev = n
				return true
			}
		}
		return false
	})
	st := e.status()
	if len(st.Reverts) != 1 {
		t.Fatalf("reverts %+v", st.Reverts)
	}
	if rec := st.Reverts[0]; rev.Service != "website" || rev.To != good || rev.From != rec.From || rev.Commit != rec.Commit || rev.Commit == "" {
		t.Errorf("notification %+v, revert %+v", rev, rec)
	}
	resp, err := http.Get("http://" + e.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`bushost_supervisor_reverts_total{result="reverted",service="website"} 1`,
		`bushost_supervisor_service_exits_total{service="website",status="nonzero"} 3`,
		`bushost_build_info{`,
		`process_cpu_seconds_total `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	sawRevert := false
	for _, line := range strings.Split(e.out.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "reverted to the good commit" {
			sawRevert = true
		}
	}
	if !sawRevert {
		t.Errorf("no JSON log line for the revert:\n%s", e.out.String())
	}
}

func TestSupervisorUsersAndOwnership(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })

	app, err := user.Lookup(e.app)
	if err != nil {
		t.Fatal(err)
	}
	agentGroup, err := user.LookupGroup(e.agent)
	if err != nil {
		t.Fatal(err)
	}
	// The supervisor runs as app, in the agent group, with nothing left.
	ps := procStatus(t, e.cmd.Process.Pid)
	if uids := strings.Fields(ps["Uid"]); len(uids) != 4 || uids[0] != app.Uid || uids[1] != app.Uid || uids[2] != app.Uid || uids[3] != app.Uid {
		t.Errorf("supervisor Uid = %q, want all %s", ps["Uid"], app.Uid)
	}
	if !strings.Contains(" "+ps["Groups"]+" ", " "+agentGroup.Gid+" ") {
		t.Errorf("supervisor groups %q lack agent (%s)", ps["Groups"], agentGroup.Gid)
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if strings.Trim(ps[k], "0") != "" {
			t.Errorf("%s = %s", k, ps[k])
		}
	}
	if ps["NoNewPrivs"] != "1" {
		t.Errorf("NoNewPrivs = %q", ps["NoNewPrivs"])
	}
	// The service runs as the services' user, in no group of app's.
	svcUser, err := user.Lookup(e.svc)
	if err != nil {
		t.Fatal(err)
	}
	svc := e.status().Services[0]
	sps := procStatus(t, svc.PID)
	if uids := strings.Fields(sps["Uid"]); len(uids) != 4 || uids[0] != svcUser.Uid || uids[1] != svcUser.Uid || uids[2] != svcUser.Uid || uids[3] != svcUser.Uid {
		t.Errorf("service Uid = %q, want all %s (%s)", sps["Uid"], svcUser.Uid, e.svc)
	}
	for _, g := range strings.Fields(sps["Groups"]) {
		if strings.Contains(" "+ps["Groups"]+" ", " "+g+" ") || g == strings.Fields(ps["Gid"])[0] {
			t.Errorf("service group %s is also the supervisor's (%s)", g, ps["Groups"])
		}
	}

	// What the agent may and may not write.
	for _, tc := range []struct {
		name, script string
		allowed      bool
	}{
		{"write infra/AGENTS.md", "echo pwned >> infra/AGENTS.md", false},
		{"create in infra", "touch infra/new", false},
		{"rename infra", "mv infra infra.old", false},
		{"create at the workspace root", "touch rootfile", false},
		{"replace AGENTS.md", "rm -f AGENTS.md", false},
		{"write the config", "echo x >> " + e.config, false},
		{"write src", "echo hi > src/website/page.html && mkdir -p src/website/new/deep && echo x > src/website/new/deep/f", true},
		{"write AGENTS.md", "echo '- a note' >> AGENTS.md", true},
		{"keep a git of its own in .git", "touch .git/agent-was-here && git init -q . && git status --short >/dev/null", true},
		{"write the supervisor's git dir", "touch " + e.gitDir + "/x", false},
		{"read the supervisor's history", "git --git-dir=" + e.gitDir + " log --oneline -1", true},
		{"write the supervisor's refs", "git --git-dir=" + e.gitDir + " update-ref refs/supervisor/good HEAD~0", false},
	} {
		out, err := e.asAgent("cd " + e.ws + " && " + tc.script)
		if (err == nil) != tc.allowed {
			t.Errorf("agent %s: allowed=%v, want %v (%s)", tc.name, err == nil, tc.allowed, out)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(e.ws, "infra", "AGENTS.md")); string(b) != houseRules {
		t.Errorf("infra/AGENTS.md changed: %q", b)
	}
	// The supervisor (app) commits what the agent wrote, new directories too.
	e.waitFor("commit of the new tree", 10*time.Second, func() bool {
		return strings.Contains(e.git("ls-tree", []string{"-r", "--name-only"}, "HEAD"), "src/website/new/deep/f")
	})
	if st := e.status(); st.LastError != "" {
		t.Errorf("last error: %s", st.LastError)
	}

	// AGENTS.md: rules from infra above the sentinel, the agent's notes below.
	b, err := os.ReadFile(filepath.Join(e.ws, "AGENTS.md"))
	if err != nil {
		t.Fatal(err)
	}
	rules, notes, ok := strings.Cut(string(b), supervisor.AgentsSentinel+"\n")
	if !ok || !strings.HasPrefix(rules, strings.TrimSpace(houseRules)) || !strings.HasSuffix(notes, "- a note\n") {
		t.Errorf("AGENTS.md:\n%s", b)
	}
}

// A second boot keeps the agent's notes and the workspace; a file without the
// sentinel is salvaged, not lost.
func TestSupervisorRebootKeepsAgentNotes(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	if out, err := e.asAgent("echo '- remember the cache' >> " + filepath.Join(e.ws, "AGENTS.md")); err != nil {
		t.Fatal(err, out)
	}
	e.shutdown()
	mustWrite(t, filepath.Join(e.ws, "infra", "AGENTS.md"), "# House rules v2\n", 0o644)
	mustWrite(t, filepath.Join(e.seed, "src", "website", "reseeded.txt"), "must not appear\n", 0o644)
	e.boot()
	b, _ := os.ReadFile(filepath.Join(e.ws, "AGENTS.md"))
	if !strings.HasPrefix(string(b), "# House rules v2\n\n"+supervisor.AgentsSentinel+"\n") || !strings.HasSuffix(string(b), "- remember the cache\n") {
		t.Errorf("second boot AGENTS.md:\n%s", b)
	}
	if _, err := os.Stat(filepath.Join(e.ws, "src", "website", "reseeded.txt")); !os.IsNotExist(err) {
		t.Error("an existing workspace was seeded again")
	}
	e.shutdown()
	if out, err := e.asAgent("echo 'notes without a sentinel' > " + filepath.Join(e.ws, "AGENTS.md")); err != nil {
		t.Fatal(err, out)
	}
	// Without its sentinel the file's rules cannot be told from its
	// notes: none of it is kept in the file (it could carry forged
	// rules), the notes start afresh saying where it went, and what the
	// agent wrote is kept whole beside it, for the agent to read.
	e.boot()
	b, _ = os.ReadFile(filepath.Join(e.ws, "AGENTS.md"))
	if !strings.HasPrefix(string(b), "# House rules v2\n\n"+supervisor.AgentsSentinel+"\n") || strings.Contains(string(b), "notes without a sentinel") ||
		!strings.Contains(string(b), supervisor.UnkeptAgents) {
		t.Errorf("AGENTS.md after a boot that found no sentinel:\n%s", b)
	}
	if out, err := e.asAgent("cat " + filepath.Join(e.ws, supervisor.UnkeptAgents)); err != nil || out != "notes without a sentinel\n" {
		t.Errorf("the agent reading %s: %v %q", supervisor.UnkeptAgents, err, out)
	}
}

// A failure outside the agent's edits: nothing to revert. No revert
// commit and no revert webhook; it says so and halts once, and the halt
// survives a restart.
func TestSupervisorHaltsWithNothingToRevert(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("first good commit", 10*time.Second, func() bool { return e.status().Good != "" })
	head := e.status().Head

	// Broken by something no revert can undo.
	mustWrite(t, e.flag, "x", 0o644)
	e.waitFor("halted", 20*time.Second, func() bool { return e.status().State == "halted" })
	if code := e.healthz(); code != 503 {
		t.Errorf("/healthz = %d while halted", code)
	}
	st := e.status()
	if len(st.Reverts) != 0 || st.Head != head || !strings.Contains(st.HaltReason, "nothing to revert") {
		t.Errorf("%d reverts, head %s (was %s), halt reason %q", len(st.Reverts), st.Head, head, st.HaltReason)
	}
	log := e.git("log", []string{"--format=%an %s"}, "HEAD")
	if n := strings.Count(log, "supervisor supervisor: revert to"); n != 0 {
		t.Errorf("%d revert commits with nothing to revert:\n%s", n, log)
	}
	if st.Services[0].State != supervisor.StateBricked {
		t.Errorf("halted status %+v", st)
	}
	if n := strings.Count(e.out.String(), `msg="RECOVERY HALTED`); n != 1 {
		t.Errorf("the halt said %d times, want once, loudly", n)
	}

	// A restart does not forget the halt.
	e.shutdown()
	e.boot()
	st = e.status()
	if st.State != "halted" || !strings.Contains(st.HaltReason, "nothing to revert") {
		t.Errorf("after a restart: state %q, halt reason %q", st.State, st.HaltReason)
	}
}

func TestSupervisorKill9LeavesNoServiceProcess(t *testing.T) {
	e := newSupEnv(t)
	e.boot()
	e.waitFor("/healthz 200", 10*time.Second, func() bool { return e.healthz() == 200 })
	pgid := e.status().Services[0].PID
	members := groupOf(pgid)
	if len(members) < 3 {
		t.Fatalf("service group %d has %v, want shim, server and sleep", pgid, members)
	}
	if err := e.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-e.exited
	e.waitFor("service group gone", 5*time.Second, func() bool { return len(groupOf(pgid)) == 0 })
	for _, pid := range members {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z ") {
			t.Errorf("process %d survived: %s", pid, b)
		}
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", e.webPort), time.Second); err == nil {
		c.Close()
		t.Error("the website still answers")
	}
}

// groupOf lists the live processes of process group pg.
func groupOf(pg int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + ent.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pg) {
			pids = append(pids, pid)
		}
	}
	return pids
}
