package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// A launched session's grant is the session's: what it launches is held
// to the session's own bounds, wherever the call comes from. A sub-lead
// launched with --pids 64 --net=none copies its token out of the sandbox
// into its workspace; a process on the host (root here, any uid that
// reads it there) uses it to launch a worker with --pids 100 --net=host,
// which the grant's launch set allows and the sub-lead itself does not
// have; so does another session, one the host runs with --net=host. Both
// launches are refused, nothing launched, nothing logged.
func TestLaunchedTokenOutsideItsSession(t *testing.T) {
	e := newLaunchEnv(t, "--max-launch-depth", "2")
	base := filepath.Dir(e.h.Home)
	tok := filepath.Join(base, "deep-lead.token")
	e.h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead", "--cap", "session.launch",
		"--launch", "sub=session.launch", "--launch", "worker=git.push.working", "--launch-net", "none,host",
		"--launch-max-pids", "1000", "--out", tok)
	sub, errOut, code := e.as(t, tok, "session", "launch", "--task", "t1", "--role", "sub", "--caps", "session.launch",
		"--pids", "64", "--net=none", "--", "sh", "-c", `cp "$BUS_TOKEN_FILE" stolen.new && chmod 644 stolen.new && mv stolen.new stolen.token; exec sleep 600`)
	sub = strings.TrimSpace(sub)
	if code != 0 {
		t.Fatalf("session launch of the sub-lead: exit %d\n%s", code, errOut)
	}
	defer e.h.Run(t, nil, "session", "stop", sub)
	// The workspace the launcher made: ws/, or disk/ws/ on its --disk.
	var stolen string
	if !testenv.Poll(time.Minute, func() bool {
		for _, p := range []string{"ws", "disk/ws"} {
			if _, err := os.Stat(filepath.Join(e.h.Home, "sessions", sub, p, "stolen.token")); err == nil {
				stolen = filepath.Join(e.h.Home, "sessions", sub, p, "stolen.token")
			}
		}
		return stolen != ""
	}) {
		logs, logErr, _ := e.h.Run(t, nil, "session", "logs", sub)
		t.Fatalf("the sub-lead did not copy its token to its workspace:\n%s%s", logs, logErr)
	}
	// On the host.
	e.refusedLaunch(t, stolen, "it launches only from inside that session",
		"--task", "t1", "--role", "worker", "--caps", "git.push.working", "--pids", "100", "--net=host")
	// From inside another session, one the host runs with --net=host.
	run, ws := e.prepareLead(t, e.lead)
	b, err := os.ReadFile(stolen)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(ws, "stolen.token"), string(b), 0o644)
	before := e.h.Must(t, "events", "--json")
	dirs := e.sessionDirs(t)
	out, code := runCmd(t, bin(t, "sandbox"), "run", "--run-dir", run, "--workspace", ws, "--role", "lead", "--caps", "session.launch",
		"--broker-socket", filepath.Join(e.h.Home, "broker.sock"), "--launch-socket", filepath.Join(e.h.Home, "launch.sock"), "--net=host",
		"--", "bushost", "--token-file", "stolen.token", "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--net=host", "--", "true")
	if code != 4 || !strings.Contains(out, "it launches only from inside that session") {
		t.Errorf("the sub-lead's token used in another session: exit %d, want 4 naming the session\n%s", code, out)
	}
	if after := e.h.Must(t, "events", "--json"); after != before {
		t.Errorf("the refused launch changed the log:\n%s", strings.TrimPrefix(after, before))
	}
	if got := e.sessionDirs(t); strings.Join(got, ",") != strings.Join(dirs, ",") {
		t.Errorf("the refused launch left session directories: %v, before %v", got, dirs)
	}
}
