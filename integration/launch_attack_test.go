package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLaunchSockStalledLogs: a lead that asks launch.sock for a
// session's logs on connections that grant no receive window, one call at
// a time (so that no bound on calls in flight is met), must not make the
// launcher hold every answer it cannot send: the launcher stays under
// 128 MiB, as under the connection flood, and the host's own calls are
// still served.
func TestLaunchSockStalledLogs(t *testing.T) {
	e := newLaunchEnv(t)
	gid := groupID(t, e.group)
	// A session with 1 MiB on each stream: the most a Logs answer holds.
	id, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--",
		"sh", "-c", "head -c 1048576 /dev/zero | tr '\\0' o; head -c 1048576 /dev/zero | tr '\\0' e >&2")
	id = strings.TrimSpace(id)
	if code != 0 {
		t.Fatalf("session launch: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "wait", id); code != 0 {
		t.Fatalf("session wait: exit %d\n%s", code, errOut)
	}
	tok, err := os.ReadFile(e.lead)
	if err != nil {
		t.Fatal(err)
	}
	he := &hostileEnv{h: e.h, group: e.group, gid: gid, hostile: testdataBin(t, "hostile")}
	_, attacker := makeUser(t, e.group)
	before := rssKiB(t, e.serve.Process.Pid)
	// 12 connections of 16 streams: fewer than one uid may hold.
	lines := he.attack(t, attacker, "logs", filepath.Join(e.h.Home, "launch.sock"), strings.TrimSpace(string(tok)), id, "12", "16")
	t.Logf("hostile: %s", <-lines)
	kb := rssKiB(t, e.serve.Process.Pid)
	t.Logf("launcher RSS %d KiB after 192 Logs calls whose answers are not read (%d KiB before)", kb, before)
	if kb > 128<<10 {
		t.Errorf("launcher RSS %d KiB with stalled Logs answers, want under 128 MiB", kb)
	}
	if out, errOut, code := e.h.Run(t, nil, "session", "list"); code != 0 {
		t.Errorf("the host's session list under the attack: exit %d\n%s%s", code, out, errOut)
	}
}
