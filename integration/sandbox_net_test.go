package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// requireTools fails under CI and skips elsewhere when a program a session
// runs is missing at its system path (the session sees /usr, not a user's
// pyenv or ~/bin).
func requireTools(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			testenv.Missing(t, p, "the session's network (scripts/deps.sh installs it)")
		}
	}
}

// countingServer serves "hello from P" on the host's 127.0.0.1 and counts
// the requests it answered.
func countingServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		fmt.Fprintf(w, "hello from %s\n", l.Addr())
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), &n
}

func egressDirs(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(os.TempDir(), "sandbox-egress-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSandboxNetwork: --net=proxy enforces its allow-list through a relay
// the session cannot go around; --net=none has no route and no relay.
func TestSandboxNetwork(t *testing.T) {
	requireTools(t, "/usr/bin/curl", "/usr/bin/python3")
	e := newSandboxEnv(t)
	allowed, allowedHits := countingServer(t)
	other, otherHits := countingServer(t)
	hosts := filepath.Join(e.base, "hosts")
	// Names the proxy resolves to the host's loopback and a private and
	// the metadata address: refused although their domain is allowed.
	if err := os.WriteFile(hosts, []byte("127.0.0.1 loop.allowed.test\n10.1.2.3 private.allowed.test\n169.254.169.254 metadata.allowed.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := egressDirs(t)
	_, port, _ := net.SplitHostPort(allowed)
	// With the server's port: a name alone opens 443 and 80 only.
	proxy := []string{"--net=proxy", "--allow-host", allowed, "--allow-domain", "*.allowed.test:" + port, "--allow-domain", "localhost:" + port, "--resolve-file", hosts}

	t.Run("proxy", func(t *testing.T) {
		script := `
curl -sS http://` + allowed + `/; echo "via-relay=$?"
curl -sS -x socks5h://127.0.0.1:3128 http://` + allowed + `/; echo "via-socks=$?"
curl -sS --noproxy '*' -m 5 http://` + allowed + `/; echo "noproxy=$?"
/usr/bin/python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 5)' ` + port + ` 2>/dev/null; echo "raw=$?"
curl -sS -w ' code=%{http_code}' http://` + other + `/; echo " other=$?"
curl -sS -x socks5h://127.0.0.1:3128 http://` + other + `/ 2>/dev/null; echo "other-socks=$?"
for name in loop private metadata; do curl -sS -w ' code=%{http_code}' http://$name.allowed.test:` + port + `/; echo " $name=$?"; done
curl -sS -w ' code=%{http_code}' http://localhost:` + port + `/; echo " localhost=$?"
`
		out, errOut, code := e.runIn(t, proxy, "sh", "-c", script)
		if code != 0 {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
		for _, want := range []string{
			"hello from " + allowed + "\nvia-relay=0",
			"hello from " + allowed + "\nvia-socks=0",
			"noproxy=7", // curl: could not connect: no route, nothing listens
			"raw=1",
			"EGRESS_DENIED: " + other + " is not named by --allow-host\n code=403 other=0",
			"other-socks=97", // SOCKS reply 2: not allowed by the ruleset
			"EGRESS_DENIED: loop.allowed.test resolves to 127.0.0.1, in 127.0.0.0/8",
			"EGRESS_DENIED: private.allowed.test resolves to 10.1.2.3, in 10.0.0.0/8",
			"EGRESS_DENIED: metadata.allowed.test resolves to 169.254.169.254, in 169.254.0.0/16",
			"EGRESS_DENIED: localhost resolves to",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("session output lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
			}
		}
		if n := allowedHits.Load(); n != 2 {
			t.Errorf("the allowed server answered %d requests, want 2 (relay and SOCKS)", n)
		}
		if n := otherHits.Load(); n != 0 {
			t.Errorf("the server not allowed answered %d requests", n)
		}
		// Without --audit-token-file the decisions go to run's stderr.
		for _, want := range []string{
			"network.egress allowed " + allowed,
			"network.egress denied " + other + ": EGRESS_DENIED",
			"network.egress closed " + allowed,
		} {
			if !strings.Contains(errOut, want) {
				t.Errorf("run's stderr lacks %q:\n%s", want, errOut)
			}
		}
	})

	t.Run("none", func(t *testing.T) {
		out, errOut, code := e.runIn(t, nil, "sh", "-c", `
env | grep -i _proxy; echo "env=$?"
curl -sS -m 5 http://`+allowed+`/; echo "direct=$?"
curl -sS -m 5 -x http://127.0.0.1:3128 http://`+allowed+`/; echo "relay=$?"
`)
		if code != 0 {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
		for _, want := range []string{"env=1", "direct=7", "relay=7"} {
			if !strings.Contains(out, want) {
				t.Errorf("--net=none: output lacks %q:\n%s%s", want, out, errOut)
			}
		}
	})

	t.Run("flags", func(t *testing.T) {
		for _, bad := range [][]string{
			{"--net=proxy", "--allow-domain", "*"},
			{"--net=proxy", "--allow-host", "example.com"},
			{"--net=none", "--allow-host", allowed},
			{"--net=sideways"},
		} {
			if out, errOut, code := e.runIn(t, bad, "true"); code != 2 {
				t.Errorf("%q: exit %d, want 2 (usage)\n%s%s", bad, code, out, errOut)
			}
		}
		out, errOut, code := runSandbox(t, e.sandbox, append(append([]string{"explain"}, e.flags("git.push.working")...), proxy...)...)
		if code != 0 {
			t.Fatalf("explain: exit %d\n%s%s", code, out, errOut)
		}
		for _, want := range []string{"network: proxy:", "relay: 127.0.0.1:3128", "allowed: --allow-host " + allowed, "allowed: --allow-domain *.allowed.test:" + port, "hands it to the egress proxy",
			"egress limits: at most 64 connections at once", "egress decisions: to sandbox run's stderr"} {
			if !strings.Contains(out, want) {
				t.Errorf("explain lacks %q:\n%s", want, out)
			}
		}
	})

	// Nothing left behind: the proxy's socket directory goes with the
	// session.
	for _, d := range egressDirs(t) {
		if !slices.Contains(before, d) {
			t.Errorf("left behind: %s", d)
		}
	}
}

// hostAddress is an address of one of the host's interfaces other than
// loopback, one in no private or reserved range if there is one.
func hostAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	found := ""
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil || n.IP.IsLoopback() {
			continue
		}
		if found == "" || net.ParseIP(found).IsPrivate() && !n.IP.IsPrivate() {
			found = n.IP.String()
		}
	}
	if found == "" {
		testenv.Missing(t, "a non-loopback IPv4 address on this host", "to resolve a name to")
	}
	return found
}

// anyServer serves "hello from PORT" on every address of the host
// (0.0.0.0), as a host service bound to all interfaces does, and counts
// the requests; it returns the port.
func anyServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		fmt.Fprintf(w, "hello from %s\n", port)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return port, &n
}

// TestSandboxNetworkHostAddress: a name the allow-list allows that
// resolves to one of the host's own addresses (not loopback: the
// interface a service bound to 0.0.0.0 answers on) is refused, unless
// --allow-host-address names it; and NAME:PORT reaches that port alone.
func TestSandboxNetworkHostAddress(t *testing.T) {
	requireTools(t, "/usr/bin/curl")
	e := newSandboxEnv(t)
	addr := hostAddress(t)
	named, namedHits := anyServer(t)
	other, otherHits := anyServer(t)
	hosts := filepath.Join(e.base, "hosts-self")
	if err := os.WriteFile(hosts, []byte(addr+" self.host.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `
curl -sS -w ' code=%{http_code}' http://self.host.test:` + named + `/; echo " named=$?"
curl -sS -w ' code=%{http_code}' http://self.host.test:` + other + `/; echo " other=$?"
`
	base := []string{"--net=proxy", "--allow-domain", "self.host.test:" + named, "--resolve-file", hosts}

	out, errOut, code := e.runIn(t, base, "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "EGRESS_DENIED: self.host.test resolves to "+addr) || !strings.Contains(out, "code=403 named=0") {
		t.Errorf("a name resolving to the host's %s was not refused:\n%s\nstderr:\n%s", addr, out, errOut)
	}
	if namedHits.Load() != 0 || otherHits.Load() != 0 {
		t.Fatalf("the host's services were reached: %d and %d requests", namedHits.Load(), otherHits.Load())
	}
	t.Logf("refused: %s", out)

	out, errOut, code = e.runIn(t, append(base, "--allow-host-address", addr), "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"hello from " + named + "\n code=200 named=0",
		"EGRESS_DENIED: self.host.test:" + other + " is not named by --allow-domain",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("with --allow-host-address %s: output lacks %q:\n%s\nstderr:\n%s", addr, want, out, errOut)
		}
	}
	if namedHits.Load() != 1 || otherHits.Load() != 0 {
		t.Errorf("requests: %d to the port named, %d to the other; want 1 and 0", namedHits.Load(), otherHits.Load())
	}
}

// tempGroup makes a group (for bushostd's sockets, so that a session's
// uid may connect) and removes it at the end of the test.
func tempGroup(t *testing.T, prefix string) string {
	t.Helper()
	group := prefix + randSuffix()
	if out, err := exec.Command("groupadd", group).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("groupdel", group).CombinedOutput(); err != nil {
			t.Errorf("groupdel %s: %v\n%s", group, err, out)
		}
	})
	return group
}

// TestSandboxNetworkAudit: with --audit-token-file every egress decision
// is in the broker as network.egress on the session's task, recorded by
// the launcher; the session's own grant cannot record that type.
func TestSandboxNetworkAudit(t *testing.T) {
	testenv.NeedRoot(t, "makes a group and runs the session as a uid of its own")
	requireTools(t, "/usr/bin/curl")
	h := startHostWith(t, hostOpts{Args: []string{"--socket-group", tempGroup(t, "bh-net-")}})
	h.AddProject(t, "acme", "web")
	sessionToken := h.Grant(t, "acme", "web", "t1", "coder", "event.record")
	auditToken := filepath.Join(filepath.Dir(h.Home), "audit-"+randSuffix())
	h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "launcher",
		"--cap", "network.audit", "--out", auditToken)

	base := filepath.Dir(h.Home)
	ws, run := filepath.Join(base, "ws"), filepath.Join(base, "run")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	sb := bin(t, "sandbox")
	if out, errOut, code := runSandbox(t, sb, "prepare", "--run-dir", run, "--business", "acme", "--project", "web",
		"--task", "t1", "--role", "coder", "--caps", "event.record", "--token-file", sessionToken,
		"--allow-domain", "*.from-session.test"); code != 0 {
		t.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
	}
	allowed, _ := countingServer(t)
	other, otherHits := countingServer(t)
	flags := []string{"run", "--run-dir", run, "--workspace", ws, "--role", "coder", "--caps", "event.record",
		"--broker-socket", filepath.Join(h.Home, "broker.sock"), "--bushost", bin(t, "bushost"),
		"--net=proxy", "--allow-host", allowed, "--audit-token-file", auditToken, "--"}
	explain := append([]string{"explain"}, flags[1:len(flags)-1]...)
	if out, errOut, code := runSandbox(t, sb, explain...); code != 0 || !strings.Contains(out, "allowed: --allow-domain *.from-session.test: from session.json") {
		t.Errorf("explain does not list session.json's allow-list: exit %d\n%s%s", code, out, errOut)
	}
	started := time.Now()
	out, errOut, code := runSandbox(t, sb, append(flags, "sh", "-c", `
curl -sS http://`+allowed+`/; echo "allowed=$?"
curl -sS -w ' code=%{http_code}' http://`+other+`/; echo " other=$?"
bushost event record --type network.egress --data '{"decisions":[]}'; echo "forge=$?"
bushost event record --type network.other; echo "reserved=$?"
`)...)
	t.Logf("the audited session took %s", time.Since(started))
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"hello from " + allowed + "\nallowed=0", "EGRESS_DENIED", "code=403 other=0", "forge=4", "reserved=4"} {
		if !strings.Contains(out, want) {
			t.Errorf("session output lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
	if !strings.Contains(errOut, "network.audit") || !strings.Contains(errOut, "EVENT_TYPE_RESERVED") {
		t.Errorf("the session's network.* records were not refused by capability and by type:\n%s", errOut)
	}
	if otherHits.Load() != 0 {
		t.Errorf("the server not allowed was reached")
	}
	// With audit the decisions are the broker's, not stderr's.
	if strings.Contains(errOut, "network.egress allowed") {
		t.Errorf("decisions on stderr although audited:\n%s", errOut)
	}
	// One event per decision and one per close, each with the launcher
	// as its actor; the close names the connection its decision did.
	events := h.Must(t, "events", "--task", "t1", "--json")
	type egressData struct {
		Conn      int64  `json:"conn"`
		Host      string `json:"host"`
		Port      int    `json:"port"`
		Decision  string `json:"decision"`
		Rule, Why string
		BytesIn   *int64 `json:"bytes_in"`
		BytesOut  *int64 `json:"bytes_out"`
		Decisions any    `json:"decisions"`
	}
	var egress []egressData
	for _, line := range strings.Split(strings.TrimSpace(events), "\n") {
		var ev struct {
			Type, Actor string
			Data        egressData
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events --json: %v: %s", err, line)
		}
		if ev.Type != "network.egress" {
			continue
		}
		if ev.Data.Decisions != nil || ev.Data.Decision == "" {
			t.Errorf("a network.egress event that is not one decision: %s", line)
		}
		if ev.Actor == "" || strings.Contains(line, `"decisions":[]`) {
			t.Errorf("the session's own network.egress was recorded: %s", line)
		}
		egress = append(egress, ev.Data)
	}
	allowedPort, _ := strconv.Atoi(allowed[strings.LastIndex(allowed, ":")+1:])
	otherPort, _ := strconv.Atoi(other[strings.LastIndex(other, ":")+1:])
	find := func(decision string, port int) *egressData {
		for i := range egress {
			if egress[i].Decision == decision && egress[i].Port == port {
				return &egress[i]
			}
		}
		t.Errorf("no network.egress %s for port %d:\n%s", decision, port, events)
		return nil
	}
	ok, denied, closed := find("allowed", allowedPort), find("denied", otherPort), find("closed", allowedPort)
	if len(egress) != 3 {
		t.Errorf("%d network.egress events, want 3 (allowed, denied, closed):\n%s", len(egress), events)
	}
	if ok != nil && (ok.Host != "127.0.0.1" || ok.Rule != "--allow-host "+allowed || ok.Conn == 0) {
		t.Errorf("allowed: %+v", *ok)
	}
	if denied != nil && ok != nil && (!strings.Contains(denied.Why, "EGRESS_DENIED: "+other+" is not named by --allow-host") || denied.Conn == ok.Conn) {
		t.Errorf("denied: %+v", *denied)
	}
	if closed != nil && ok != nil && (closed.Conn != ok.Conn || closed.BytesIn == nil || *closed.BytesIn == 0 || closed.BytesOut == nil || *closed.BytesOut == 0) {
		t.Errorf("closed: %+v, want conn %d and bytes each way", *closed, ok.Conn)
	}

	// An audit token the session could read is refused before the launch.
	inside := filepath.Join(ws, "audit.token")
	if err := copyFile(auditToken, inside); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(inside)
	bad := slices.Clone(flags)
	bad[slices.Index(bad, auditToken)] = inside
	if out, errOut, code := runSandbox(t, sb, append(bad, "true")...); code != 125 || !strings.Contains(errOut, "which the session sees") {
		t.Errorf("audit token in the workspace: exit %d, want 125\n%s%s", code, out, errOut)
	}
}

// holdServer listens on the host's 127.0.0.1 and holds each connection
// open, saying nothing, until its client closes it; it sends on ended
// each time one has ended.
func holdServer(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{}, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(io.Discard, c)
				ended <- struct{}{}
			}()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l.Addr().String(), ended
}

// egressClient is run in a session: it opens connections through the
// relay to the host:port in argv[1] with CONNECT and prints what the
// proxy answered, then does what argv[2] says.
const egressClient = `
import socket, sys, time
target, mode = sys.argv[1], sys.argv[2]
def connect():
    s = socket.create_connection(("127.0.0.1", 3128), 10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    s.settimeout(30)
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(4096)
        if not b:
            break
        head += b
    return s, head.decode(errors="replace")
if mode == "limit":
    held = []
    for i in range(2):
        s, head = connect()
        print("conn%d: %s" % (i, head.split("\r\n")[0]))
        held.append(s)
    s, head = connect()
    print("over: " + head.replace("\r\n", " | "))
    rest = s.recv(4096).decode(errors="replace")
    print("over-body: " + rest.strip())
    s.close()
    # One closed, its slot is free again: the proxy releases it once
    # both ends are done, so try until it is (bounded by the test).
    held.pop().close()
    for attempt in range(200):
        s, head = connect()
        if head.startswith("HTTP/1.1 200"):
            print("after-close: 200")
            break
        s.close()
        time.sleep(0.05)
    else:
        print("after-close: never")
elif mode == "idle":
    s, head = connect()
    print("idle-conn: " + head.split("\r\n")[0])
    # Silent both ways: the proxy closes it after --egress-idle (and at
    # most 1.5x); the 30 s timeout is the test's bound, not its wait.
    try:
        print("idle-read: %r" % s.recv(1))
    except socket.timeout:
        print("idle-read: still open after 30s")
`

// TestSandboxNetworkLimits: the egress proxy refuses a connection over
// --egress-conns with its reason, takes one again once a slot is free,
// and cuts a connection idle for --egress-idle both ways.
func TestSandboxNetworkLimits(t *testing.T) {
	requireTools(t, "/usr/bin/python3")
	e := newSandboxEnv(t)
	target, ended := holdServer(t)
	before := egressDirs(t)

	t.Run("conns", func(t *testing.T) {
		out, errOut, code := e.runIn(t, []string{"--net=proxy", "--allow-host", target, "--egress-conns", "2"},
			"/usr/bin/python3", "-c", egressClient, target, "limit")
		if code != 0 {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
		for _, want := range []string{
			"conn0: HTTP/1.1 200 Connection established",
			"conn1: HTTP/1.1 200 Connection established",
			"over: HTTP/1.1 503 Service Unavailable",
			"EGRESS_CONNECTIONS_EXHAUSTED: the session holds 2 connections, the most --egress-conns allows",
			"after-close: 200",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("session output lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
			}
		}
		if !strings.Contains(errOut, "network.egress denied connection 3: EGRESS_CONNECTIONS_EXHAUSTED: over --egress-conns 2") {
			t.Errorf("the refusal is not among run's decisions:\n%s", errOut)
		}
	})

	t.Run("idle", func(t *testing.T) {
		// Drain what the first subtest's connections left.
		for len(ended) > 0 {
			<-ended
		}
		out, errOut, code := e.runIn(t, []string{"--net=proxy", "--allow-host", target, "--egress-idle", "1s"},
			"/usr/bin/python3", "-c", egressClient, target, "idle")
		if code != 0 {
			t.Fatalf("exit %d\n%s%s", code, out, errOut)
		}
		for _, want := range []string{"idle-conn: HTTP/1.1 200 Connection established", "idle-read: b''"} {
			if !strings.Contains(out, want) {
				t.Errorf("session output lacks %q (the idle connection was not cut):\n%s\nstderr:\n%s", want, out, errOut)
			}
		}
		// The host's end was closed too, not only the session's.
		select {
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Errorf("the server's end of the idle connection is still open")
		}
		if !strings.Contains(errOut, "network.egress closed "+target+": 0 bytes out, 0 bytes in") {
			t.Errorf("run's stderr lacks the idle connection's close:\n%s", errOut)
		}
	})

	for _, d := range egressDirs(t) {
		if !slices.Contains(before, d) {
			t.Errorf("left behind: %s", d)
		}
	}
}

// auditedSession starts bushostd with args, prepares a session on task t1
// with event.record, and returns the host and `sandbox run`'s flags up to
// "--": --net=proxy allowing the returned server, decisions recorded with
// a network.audit grant.
func auditedSession(t *testing.T, args ...string) (*Host, []string, string) {
	t.Helper()
	h := startHostWith(t, hostOpts{Args: append([]string{"--socket-group", tempGroup(t, "bh-net-")}, args...)})
	h.AddProject(t, "acme", "web")
	sessionToken := h.Grant(t, "acme", "web", "t1", "coder", "event.record")
	base := filepath.Dir(h.Home)
	auditToken := filepath.Join(base, "audit-"+randSuffix())
	h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "launcher",
		"--cap", "network.audit", "--out", auditToken)
	ws, run := filepath.Join(base, "ws"), filepath.Join(base, "run")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := runSandbox(t, bin(t, "sandbox"), "prepare", "--run-dir", run, "--business", "acme", "--project", "web",
		"--task", "t1", "--role", "coder", "--caps", "event.record", "--token-file", sessionToken); code != 0 {
		t.Fatalf("prepare: exit %d\n%s%s", code, out, errOut)
	}
	allowed, _ := countingServer(t)
	return h, []string{"run", "--run-dir", run, "--workspace", ws, "--role", "coder", "--caps", "event.record",
		"--broker-socket", filepath.Join(h.Home, "broker.sock"), "--bushost", bin(t, "bushost"),
		"--net=proxy", "--allow-host", allowed, "--audit-token-file", auditToken, "--"}, allowed
}

// egressEvents returns the data of task t1's network.egress events and
// the peers that recorded them.
func egressEvents(t *testing.T, h *Host) (decisions []map[string]any, peers map[string]bool) {
	t.Helper()
	peers = map[string]bool{}
	for _, line := range strings.Split(h.Must(t, "events", "--task", "t1", "--json"), "\n") {
		var ev struct {
			Type, Peer string
			Data       map[string]any
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events --json: %v: %s", err, line)
		}
		if ev.Type != "network.egress" {
			continue
		}
		decisions = append(decisions, ev.Data)
		pid, _, _ := strings.Cut(ev.Peer, ",")
		peers[pid] = true
	}
	return decisions, peers
}

// TestSandboxNetworkAuditBatched: a chatty session's decisions are each
// an event of their own, written in batches (one bushost call, so one
// peer, holds many), and counted against network.egress's own bound: the
// session past its own event quota (--event-rate 1) loses none of them.
func TestSandboxNetworkAuditBatched(t *testing.T) {
	testenv.NeedRoot(t, "makes a group and runs the session as a uid of its own")
	requireTools(t, "/usr/bin/curl")
	h, flags, allowed := auditedSession(t, "--event-rate", "1")
	other, otherHits := countingServer(t)
	const n = 40
	out, errOut, code := runSandbox(t, bin(t, "sandbox"), append(flags, "sh", "-c", `
bushost event record --type note >/dev/null; echo "note1=$?"
bushost event record --type note >/dev/null 2>&1; echo "note2=$?"
curl -sS http://`+allowed+`/ >/dev/null; echo "allowed=$?"
i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do curl -s -o /dev/null -w '%{http_code}\n' http://`+other+`/; i=$((i+1)); done | sort | uniq -c
`)...)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"note1=0", "note2=7", "allowed=0", strconv.Itoa(n) + " 403"} {
		if !strings.Contains(out, want) {
			t.Errorf("session output lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
	if otherHits.Load() != 0 {
		t.Errorf("the server not allowed was reached")
	}
	if strings.Contains(errOut, "unrecorded") {
		t.Errorf("decisions the broker refused:\n%s", errOut)
	}
	decisions, peers := egressEvents(t, h)
	denied, summarised, connEvents := 0, 0, 0
	for _, d := range decisions {
		switch d["decision"] {
		case "denied":
			denied++
		case "denied_summary":
			n, _ := d["denied"].(float64)
			summarised += int(n)
		default:
			connEvents++
		}
	}
	// Each denial is an event of its own, or counted in the summary of
	// its second past the bound of those.
	if denied+summarised != n || connEvents != 2 {
		t.Errorf("%d denials one by one and %d in summaries, want %d in all; %d events of the allowed connection, want 2", denied, summarised, n, connEvents)
	}
	// Each bushost call the launcher made is one peer: fewer calls than
	// events means the writes were batched.
	if len(peers) >= len(decisions) {
		t.Errorf("%d events in %d calls: not batched", len(decisions), len(peers))
	}
	t.Logf("%d network.egress events in %d RecordEvents calls", len(decisions), len(peers))
}

// TestSandboxNetworkAuditOverBound: past network.egress's own bound
// (--egress-event-rate 4), a batch the broker refuses is not lost: each of
// its decisions is a line on run's stderr, so every decision is in the
// log or there, and the session's connections go on as before.
func TestSandboxNetworkAuditOverBound(t *testing.T) {
	testenv.NeedRoot(t, "makes a group and runs the session as a uid of its own")
	requireTools(t, "/usr/bin/curl")
	h, flags, _ := auditedSession(t, "--egress-event-rate", "4")
	other, _ := countingServer(t)
	const n = 10
	out, errOut, code := runSandbox(t, bin(t, "sandbox"), append(flags, "sh", "-c", `
i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do curl -s -o /dev/null -w '%{http_code}\n' http://`+other+`/; i=$((i+1)); done | sort | uniq -c
`)...)
	if code != 0 || !strings.Contains(out, strconv.Itoa(n)+" 403") {
		t.Fatalf("exit %d: want %d refusals\n%s%s", code, n, out, errOut)
	}
	decisions, _ := egressEvents(t, h)
	inLog, told := 0, -1.0
	for _, d := range decisions {
		switch d["decision"] {
		case "denied":
			inLog++
		case "unrecorded":
			told, _ = d["dropped"].(float64)
		}
	}
	onStderr := strings.Count(errOut, `network.egress unrecorded {"conn":`)
	if inLog+onStderr != n || onStderr == 0 || !strings.Contains(errOut, "EVENT_RATE_EXCEEDED") {
		t.Errorf("%d decisions in the log and %d on stderr, want %d in all, some refused EVENT_RATE_EXCEEDED:\n%s", inLog, onStderr, n, errOut)
	}
	// The log says how many it lacks, when the bound left room for that.
	if told != -1 && int(told) != onStderr {
		t.Errorf("the log says %v decisions were not recorded; stderr has %d", told, onStderr)
	}
	t.Logf("%d decisions in the log, %d on stderr; events: %v", inLog, onStderr, decisions)
}

// floodClient, in a session, sends denied CONNECTs from four threads for
// 14 s and, 7 s in, one GET through the proxy to the allowed server; it
// prints the GET's status and how many denials the threads saw.
const floodClient = `
import socket, sys, threading, time, urllib.request
allowed, denied = sys.argv[1], sys.argv[2]
end = time.time() + 14
counts = [0, 0, 0, 0]
def flood(i):
    while time.time() < end:
        try:
            s = socket.create_connection(("127.0.0.1", 3128), 10)
            s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (denied, denied)).encode())
            s.settimeout(30)
            if s.recv(4096).startswith(b"HTTP/1.1 403"):
                counts[i] += 1
            s.close()
        except OSError:
            pass
threads = [threading.Thread(target=flood, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
time.sleep(7)
try:
    body = urllib.request.urlopen("http://%s/" % allowed, timeout=30).read().decode()
    print("get: 200 %s" % body.strip())
except Exception as e:
    print("get: %s" % e)
for t in threads:
    t.join()
print("denials: %d" % sum(counts))
`

// TestSandboxNetworkAuditFlood: denied CONNECTs from four threads for
// 14 s cannot make the audit lose the allowed GET made in the middle: its
// allowed and closed events are in the log, every denial is an event or
// counted in a denied_summary, and none of it was dropped. With the
// broker unreachable, the allowed connection is not made at all.
func TestSandboxNetworkAuditFlood(t *testing.T) {
	testenv.NeedRoot(t, "makes a group and runs the session as a uid of its own")
	requireTools(t, "/usr/bin/python3")
	h, flags, allowed := auditedSession(t)
	other, otherHits := countingServer(t)
	out, errOut, code := runSandbox(t, bin(t, "sandbox"), append(flags, "/usr/bin/python3", "-c", floodClient, allowed, other)...)
	if code != 0 || !strings.Contains(out, "get: 200 hello from "+allowed) {
		t.Fatalf("exit %d: want the allowed GET answered\n%s%s", code, out, errOut)
	}
	var sent int64
	if _, err := fmt.Sscanf(out[strings.Index(out, "denials: "):], "denials: %d", &sent); err != nil || sent == 0 {
		t.Fatalf("no denials counted: %v\n%s", err, out)
	}
	if otherHits.Load() != 0 {
		t.Errorf("the server not allowed was reached")
	}
	decisions, _ := egressEvents(t, h)
	allowedPort, _ := strconv.Atoi(allowed[strings.LastIndex(allowed, ":")+1:])
	var nAllowed, nClosed, nDenied, summarised, summaries int64
	for _, d := range decisions {
		port, _ := d["port"].(float64)
		switch d["decision"] {
		case "allowed":
			if int(port) == allowedPort {
				nAllowed++
			}
		case "closed":
			if int(port) == allowedPort {
				nClosed++
			}
		case "denied":
			nDenied++
		case "denied_summary":
			summaries++
			n, _ := d["denied"].(float64)
			summarised += int64(n)
			if top, _ := d["top"].([]any); len(top) == 0 || !strings.Contains(fmt.Sprint(top[0]), other) {
				t.Errorf("a summary without the denied destination first: %v", d)
			}
		default:
			t.Errorf("unexpected event %v", d)
		}
	}
	if nAllowed != 1 || nClosed != 1 {
		t.Errorf("the allowed GET: %d allowed and %d closed events, want 1 each", nAllowed, nClosed)
	}
	if nDenied+summarised != sent || summaries == 0 {
		t.Errorf("%d denials seen by the session; the log has %d one by one and %d in %d summaries", sent, nDenied, summarised, summaries)
	}
	if strings.Contains(errOut, "unrecorded") {
		t.Errorf("decisions the broker did not take:\n%s", errOut)
	}
	t.Logf("%d denials in 14 s (paced): %d events of their own, %d in %d summaries; %d network.egress events in all", sent, nDenied, summarised, summaries, len(decisions))

	// The broker gone (its socket left behind, as a crash leaves it): the
	// allowed connection cannot be recorded, so it is not made.
	h.Kill()
	second, secondHits := countingServer(t)
	flags = append(slices.Clone(flags[:len(flags)-1]), "--allow-host", second, "--")
	out, errOut, code = runSandbox(t, bin(t, "sandbox"), append(flags, "sh", "-c",
		`curl -sS -w ' code=%{http_code}' http://`+second+`/; echo " get=$?"`)...)
	if code != 0 || !strings.Contains(out, "EGRESS_UNRECORDED") || !strings.Contains(out, "code=503 get=0") {
		t.Errorf("with the broker unreachable: exit %d, want the allowed GET refused 503 EGRESS_UNRECORDED\n%s%s", code, out, errOut)
	}
	if !strings.Contains(errOut, "network.egress refused "+second+": EGRESS_UNRECORDED") {
		t.Errorf("the refusal is not on stderr:\n%s", errOut)
	}
	if n := secondHits.Load(); n != 0 {
		t.Errorf("the server was reached %d times although the connection could not be recorded", n)
	}
}

// hostileClient is run in a --net=proxy session and tries to get at the
// relay: the descriptor pid 1 sent it over (fdRelay, 8), the listening
// socket itself in any session process, a second socket on 3128 with
// SO_REUSEADDR/SO_REUSEPORT, and a flood of silent connections; then it
// checks the proxy still serves.
const hostileClient = `
import os, socket, sys, errno, time
target = sys.argv[1]
try:
    os.fstat(8)
    print("fd8: open")
except OSError as e:
    print("fd8: %s" % errno.errorcode[e.errno])
inode = None
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    f = line.split()
    if f[1] == "0100007F:0C38" and f[3] == "0A":
        inode = f[9]
print("listening: %s" % ("yes" if inode else "no"))
held, unreadable = [], 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        fds = os.listdir("/proc/%s/fd" % pid)
    except OSError:
        unreadable += 1
        continue
    for fd in fds:
        try:
            if os.readlink("/proc/%s/fd/%s" % (pid, fd)) == "socket:[%s]" % inode:
                held.append("%s/%s" % (pid, fd))
        except OSError:
            pass
print("held-in-session: %s" % (held or "none"))
print("unreadable: %d" % unreadable)
for fam, addr in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0")):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((addr, 3128))
        s.listen(1)
        print("bind %s: taken" % addr)
    except OSError as e:
        print("bind %s: %s" % (addr, errno.errorcode[e.errno]))
    s.close()
flood = []
for i in range(300):
    try:
        flood.append(socket.create_connection(("127.0.0.1", 3128), 10))
    except OSError as e:
        print("flood %d: %s" % (i, e))
        break
print("flooded: %d" % len(flood))
for s in flood:
    s.close()
for attempt in range(200):
    # While the flood's slots are still being freed a connection may be
    # refused, or reset when the proxy drops a refusal it cannot hold:
    # both mean "try again".
    try:
        s = socket.create_connection(("127.0.0.1", 3128), 10)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        s.settimeout(30)
        head = s.recv(4096).decode(errors="replace")
        s.close()
    except OSError:
        head = ""
    if head.startswith("HTTP/1.1 200"):
        print("after-flood: 200")
        break
    time.sleep(0.05)
else:
    print("after-flood: never")
`

// TestSandboxNetworkHostile: a session cannot reach the relay's socket
// or the pair it came over, cannot bind a second socket to 3128, and a
// flood of silent connections over --egress-conns neither stops the
// proxy nor keeps `sandbox run` from ending with the session.
func TestSandboxNetworkHostile(t *testing.T) {
	requireTools(t, "/usr/bin/python3")
	e := newSandboxEnv(t)
	target, _ := holdServer(t)
	before := egressDirs(t)
	out, errOut, code := e.runIn(t, []string{"--net=proxy", "--allow-host", target, "--egress-conns", "2"},
		"/usr/bin/python3", "-c", hostileClient, target)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("session:\n%s", out)
	for _, want := range []string{
		"fd8: EBADF",
		"listening: yes",
		"held-in-session: none",
		"bind 127.0.0.1: EADDRINUSE",
		"bind 0.0.0.0: EADDRINUSE",
		"flooded: 300",
		"after-flood: 200",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("session output lacks %q:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
	for _, d := range egressDirs(t) {
		if !slices.Contains(before, d) {
			t.Errorf("left behind: %s", d)
		}
	}
}
