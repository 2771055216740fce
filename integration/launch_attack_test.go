package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
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

// TestLaunchEndedSessionsKept: a lead that launches session after
// session, each leaving output behind, must not grow the launcher's disk
// and memory without end: only the latest ended sessions of a grant are
// kept (their directories and records), the older ones are forgotten,
// and a session still running is never.
func TestLaunchEndedSessionsKept(t *testing.T) {
	e := newLaunchEnv(t)
	const n = 20 // beyond the 16 kept by default
	var ids []string
	for i := 0; i < n; i++ {
		id, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working", "--",
			"sh", "-c", "head -c 65536 /dev/zero")
		id = strings.TrimSpace(id)
		if code != 0 {
			t.Fatalf("launch %d: exit %d\n%s", i, code, errOut)
		}
		if _, errOut, code := e.as(t, e.lead, "session", "wait", id); code != 0 {
			t.Fatalf("session wait %d: exit %d\n%s", i, code, errOut)
		}
		ids = append(ids, id)
	}
	// The last one's end is recorded once its wait returns; the launcher
	// forgets the oldest as each one ends.
	kept := func() []string {
		var out []string
		for _, id := range ids {
			if _, err := os.Stat(filepath.Join(e.h.Home, "sessions", id)); err == nil {
				out = append(out, id)
			}
		}
		return out
	}
	testenv.WaitFor(t, 30*time.Second, "the oldest ended sessions forgotten", func() bool { return len(kept()) <= 16 })
	if got := kept(); len(got) != 16 || got[0] != ids[n-16] {
		t.Errorf("session directories kept: %v, want the last 16 of %v", got, ids)
	}
	out, errOut, code := e.as(t, e.lead, "session", "list", "--json")
	if rows := decodeSessions(t, out); code != 0 || len(rows) != 16 {
		t.Errorf("session list: exit %d, %d sessions, want the 16 kept\n%s%s", code, len(rows), out, errOut)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "wait", ids[0]); code == 0 || !strings.Contains(errOut, "SESSION_NOT_FOUND") {
		t.Errorf("session wait of a forgotten session: exit %d\n%s", code, errOut)
	}
	// A restarted launcher keeps the same ones.
	e.stop(t)
	e.start(t)
	out, _, _ = e.as(t, e.lead, "session", "list", "--json")
	if rows := decodeSessions(t, out); len(rows) != 16 || len(kept()) != 16 {
		t.Errorf("after a restart: %d sessions listed, %d directories kept, want 16", len(rows), len(kept()))
	}
}
