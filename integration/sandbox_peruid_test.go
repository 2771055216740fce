package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// connHolder runs in a session: it opens argv[2] connections to the broker
// socket argv[1] and holds them (bushostd counts a connection at accept,
// by its peer's uid), records an event with bushost as the session's
// grant and prints its exit status and stderr, then says "ready" in the
// workspace and holds on until the test says "release".
const connHolder = `
import os, socket, subprocess, sys, time
sock, n, who = sys.argv[1], int(sys.argv[2]), sys.argv[3]
held = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    held.append(s)
def record(what):
    r = subprocess.run(["bushost", "event", "record", "--type", "note", "--data", '{"who":"%s"}' % what],
                       capture_output=True, text=True)
    print("%s=%d %s" % (what, r.returncode, r.stderr.strip().replace("\n", " ")), flush=True)
record(who)
open("ready", "w").close()
for i in range(1200):
    if os.path.exists("release"):
        break
    time.sleep(0.05)
for s in held:
    s.close()
record(who + "-after")
`

// TestSandboxSessionConnsPerUID: two sessions at once, each as a uid of
// its own, count against bushostd's --max-conns-per-uid each on its own:
// session A at its limit is refused TOO_MANY_CONNECTIONS_PER_UID while
// session B, holding as many, still connects; once A lets go, A connects
// again.
func TestSandboxSessionConnsPerUID(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	requireTools(t, "/usr/bin/python3")
	const limit = 2
	h := startHostWith(t, hostOpts{Args: []string{"--socket-group", tempGroup(t, "bh-uid-"), "--max-conns-per-uid", strconv.Itoa(limit)}})
	h.AddProject(t, "acme", "web")
	sb, broker := bin(t, "sandbox"), filepath.Join(h.Home, "broker.sock")
	base := filepath.Dir(h.Home)

	type session struct {
		name, ws string
		cmd      *exec.Cmd
		out      strings.Builder
	}
	start := func(name string, hold int) *session {
		s := &session{name: name, ws: filepath.Join(base, "ws-"+name)}
		run := filepath.Join(base, "run-"+name)
		if err := os.Mkdir(s.ws, 0o755); err != nil {
			t.Fatal(err)
		}
		tok := h.Grant(t, "acme", "web", name, "coder", "event.record")
		if out, errOut, code := runSandbox(t, sb, "prepare", "--run-dir", run, "--business", "acme", "--project", "web",
			"--task", name, "--role", "coder", "--caps", "event.record", "--token-file", tok); code != 0 {
			t.Fatalf("prepare %s: exit %d\n%s%s", name, code, out, errOut)
		}
		s.cmd = exec.Command(sb, "run", "--run-dir", run, "--workspace", s.ws, "--role", "coder", "--caps", "event.record",
			"--broker-socket", broker, "--bushost", bin(t, "bushost"), "--",
			"/usr/bin/python3", "-c", connHolder, broker, strconv.Itoa(hold), name)
		s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.out
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			os.WriteFile(filepath.Join(s.ws, "release"), nil, 0o644)
			s.cmd.Wait()
		})
		return s
	}
	ready := func(s *session) {
		t.Helper()
		waitUntil(t, 60*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(s.ws, "ready"))
			return err == nil
		}, "session "+s.name+" never got to its call")
	}
	finish := func(s *session) string {
		t.Helper()
		if err := os.WriteFile(filepath.Join(s.ws, "release"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := s.cmd.Wait(); err != nil {
			t.Fatalf("session %s: %v\n%s", s.name, err, s.out.String())
		}
		return s.out.String()
	}

	// A holds its limit, so its own call is one too many.
	a := start("ta", limit)
	ready(a)
	// B, while A holds its two, holds one and calls: two of its own.
	b := start("tb", limit-1)
	ready(b)
	outB := finish(b)
	outA := finish(a)
	for _, c := range []struct{ out, want string }{
		{outA, "ta=7 "},
		{outA, "TOO_MANY_CONNECTIONS_PER_UID"},
		{outA, "ta-after=0"},
		{outB, "tb=0"},
		{outB, "tb-after=0"},
	} {
		if !strings.Contains(c.out, c.want) {
			t.Errorf("session output lacks %q:\n%s", c.want, c.out)
		}
	}
	if strings.Contains(outB, "TOO_MANY") {
		t.Errorf("session B was refused although A holds A's connections, not B's:\n%s", outB)
	}

	// The log shows who called: each session as its own uid from the
	// dynamic range, and A's refused call is not in it.
	uidOf := map[string]string{}
	peerUID := regexp.MustCompile(`uid=(\d+)`)
	for _, line := range strings.Split(h.Must(t, "events", "--business", "acme", "--project", "web", "--json"), "\n") {
		var ev struct {
			Type, Peer string
			Data       struct{ Who string }
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events --json: %v: %s", err, line)
		}
		if ev.Type != "note" {
			continue
		}
		m := peerUID.FindStringSubmatch(ev.Peer)
		if m == nil {
			t.Fatalf("event without a peer uid: %s", line)
		}
		uidOf[ev.Data.Who] = m[1]
	}
	if _, ok := uidOf["ta"]; ok {
		t.Errorf("A's refused call was recorded: %v", uidOf)
	}
	ua, ub := uidOf["ta-after"], uidOf["tb"]
	if ua == "" || ub == "" || ua == ub || uidOf["tb-after"] != ub {
		t.Fatalf("want A and B each as a uid of its own: %v", uidOf)
	}
	for _, u := range []string{ua, ub} {
		if n, _ := strconv.Atoi(u); n < 61184 || n > 65519 {
			t.Errorf("session uid %s is outside 61184-65519", u)
		}
	}
	if left := ownedBy(t, base, ua, ub); len(left) > 0 {
		t.Errorf("files left owned by a session uid: %v", left)
	}
}
