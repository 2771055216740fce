package integration

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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

// TestSandboxRunHandOverEntrySwap: the hand-over walks the workspace and
// gives the session's uid what the workspace's owner owns there. The
// owner, still holding the workspace, exchanges an entry of its own with
// a file of root's it was left (a root-owned file in a directory of the
// user's, as sudo leaves them) between the walk's look at the entry and
// its chown (a hooked build swaps at that exact point). The session must
// not be given root's file, and nothing may be left with the session's
// uid or with another owner than before.
func TestSandboxRunHandOverEntrySwap(t *testing.T) {
	testenv.NeedRoot(t, "sandbox run hands the workspace to a uid of its own")
	base := baseDir(t)
	_, uid := otherUser(t)
	ws := filepath.Join(base, "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	mine, secret := filepath.Join(ws, "f"), "root-only-"+randomHex(t)
	if err := os.WriteFile(mine, []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{ws, mine} {
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(mine+".swap", []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(base, "broker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if err := os.Chmod(l.Addr().String(), 0o666); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(base, "token")
	if err := os.WriteFile(tok, []byte("t0k3n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(base, "run")
	if out, code := runCmd(t, bin(t, "sandbox"), "prepare", "--run-dir", run, "--business", "acme", "--project", "web", "--task", "t1",
		"--role", "worker", "--caps", "git.push.working", "--token-file", tok); code != 0 {
		t.Fatalf("sandbox prepare: exit %d\n%s", code, out)
	}
	// The walk is the fallback where idmapped mounts are missing: the
	// hooked build is told to take it.
	out, code := runBounded(t, []string{"BUSHOST_TESTHOOK_SWAP=walk.entry=" + mine, "BUSHOST_TESTHOOK_NO_IDMAP=1"}, hookBin(t, "sandbox"), "run", "--run-dir", run,
		"--workspace", ws, "--role", "worker", "--caps", "git.push.working", "--broker-socket", l.Addr().String(), "--",
		"sh", "-c", "cat f f.swap; id -u")
	t.Logf("sandbox run: exit %d\n%s", code, out)
	if strings.Contains(out, secret) {
		t.Errorf("the session read root's file swapped in during the hand-over:\n%s", out)
	}
	// Whichever name each has now: root's file is root's, 0600, as it
	// was; the user's is the user's; nothing else is anyone else's.
	err = filepath.Walk(base, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		b, _ := os.ReadFile(p)
		switch {
		case fi.Mode().IsRegular() && strings.Contains(string(b), secret):
			if st.Uid != 0 || fi.Mode().Perm() != 0o600 {
				t.Errorf("root's file %s is now uid %d's, mode %v", p, st.Uid, fi.Mode())
			}
		case strings.HasPrefix(p, ws) && st.Uid != uint32(uid):
			t.Errorf("%s of the workspace is uid %d's, want the user's %d", p, st.Uid, uid)
		case st.Uid != 0 && st.Uid != uint32(uid):
			t.Errorf("%s left with uid %d", p, st.Uid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLaunchWorkerInLeadWorkspace: where trees are handed over by a walk
// (no idmapped mounts: the hooked build is told so), a lead session names
// a directory of its own workspace (its uid's, as the launcher asks) as a
// worker's workspace. Handing it to the worker's uid would leave two
// hand-backs racing over one tree when the lead ends, so the worker's
// sandbox run refuses a tree a session uid owns: the worker never runs,
// and nothing stays with either uid. (Through idmapped mounts nothing is
// handed over, and the worker runs: TestLaunchWorkerInLeadSubdir.)
func TestLaunchWorkerInLeadWorkspace(t *testing.T) {
	e := newLaunchEnv(t)
	noIDMap := "BUSHOST_TESTHOOK_NO_IDMAP=1"
	e.stop(t)
	// The hooked launcher runs the bushostd, and binds the bushost,
	// beside it.
	hookBin(t, "bushostd")
	hookBin(t, "bushost")
	e.sandbox, e.env = hookBin(t, "sandbox"), []string{noIDMap}
	e.start(t)
	run, ws := e.prepareLead(t, e.lead)
	script := `mkdir sub
id=$(bushost session launch --task t1 --role worker --caps git.push.working --workspace "$PWD/sub" -- sh -c 'touch a; echo ran')
echo "worker $id"
bushost session wait "$id"
echo "waited $?"
bushost session logs "$id"
echo "uid $(id -u)"`
	out, code := runBounded(t, []string{noIDMap}, hookBin(t, "sandbox"), "run", "--run-dir", run, "--workspace", ws, "--role", "lead", "--caps", "session.launch",
		"--broker-socket", filepath.Join(e.h.Home, "broker.sock"), "--launch-socket", filepath.Join(e.h.Home, "launch.sock"),
		"--pids", "200", "--", "sh", "-c", script)
	if code != 0 || !strings.Contains(out, "worker s-") || !strings.Contains(out, "waited 125") || strings.Contains(out, "\nran") ||
		!strings.Contains(out, "another session's") {
		t.Fatalf("the lead: exit %d, want its worker refused (125) for a tree of another session's uid\n%s", code, out)
	}
	var leadUID, id string
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "worker "); ok {
			id = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "uid "); ok {
			leadUID = strings.TrimSpace(v)
		}
	}
	var rec struct {
		UID int `json:"uid"`
	}
	b, err := os.ReadFile(filepath.Join(e.h.Home, "sessions", id, "record.json"))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		t.Fatalf("the worker's record: %v\n%s", err, b)
	}
	ids := []string{leadUID}
	if rec.UID > 0 {
		ids = append(ids, strconv.Itoa(rec.UID))
	}
	if left := ownedBy(t, filepath.Dir(ws), ids...); len(left) > 0 {
		t.Errorf("left with the session uids %v: %v", ids, left)
	}
}
