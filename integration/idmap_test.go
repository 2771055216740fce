package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// Owners of workspace files in these tests: uids no passwd entry names,
// outside the session range.
const (
	wsOwner    = 4242
	otherOwner = 4343
)

// ownWorkspace gives e's workspace to wsOwner, with a file of another
// owner anyone may write and one of wsOwner's in another group.
func ownWorkspace(t *testing.T, e *sandboxEnv) {
	t.Helper()
	for _, f := range []struct {
		name     string
		uid, gid int
		mode     os.FileMode
	}{{"theirs.txt", otherOwner, otherOwner, 0o666}, {"grp.txt", wsOwner, otherOwner, 0o664}} {
		p := filepath.Join(e.ws, f.name)
		if err := os.WriteFile(p, []byte("before\n"), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, f.uid, f.gid); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(e.ws, wsOwner, wsOwner); err != nil {
		t.Fatal(err)
	}
}

// TestSandboxIDMapOwnership: a session sees its workspace, HOME and /tmp
// as its own; what it writes is the workspace owner's on disk; a file of
// another owner is the overflow uid inside and not writable even at 0666;
// no set-user-ID bit can be made; and nothing anywhere is left owned by
// the session's uid. The fallback (a build whose idmapped mounts are
// turned off, as on a kernel without them) hands the trees over and back,
// says so once, and leaves nothing either.
func TestSandboxIDMapOwnership(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	script := `id -u
echo new > made.txt && mkdir -p d/e && echo x > d/e/f && echo home > "$HOME/h" && echo tmp > /tmp/t
echo "own $(stat -c %u . made.txt "$HOME" /tmp | sort -u | tr '\n' ' ')"
echo "theirs $(stat -c '%u %g' theirs.txt) $(cat theirs.txt)"
(echo w >> theirs.txt) 2>/dev/null && echo wrote-theirs
(echo y >> grp.txt) 2>/dev/null && echo wrote-grp
chmod u+s made.txt 2>/dev/null || echo setuid-refused
`
	for _, mode := range []string{"idmap", "walk"} {
		t.Run(mode, func(t *testing.T) {
			e := newSandboxEnv(t)
			var env []string
			if mode == "walk" {
				e.sandbox = hookBin(t, "sandbox")
				env = []string{"BUSHOST_TESTHOOK_NO_IDMAP=1"}
			}
			ownWorkspace(t, e)
			args := append(append([]string{"run"}, e.flags("git.push.working")...), "--fresh-home", "--", "sh", "-c", script)
			out, errOut, code := runBin(t, e.sandbox, env, args...)
			if code != 0 {
				t.Fatalf("the session: exit %d\n%s%s", code, out, errOut)
			}
			uid, _, _ := strings.Cut(out, "\n")
			if !strings.Contains(out, "own "+uid+" \n") {
				t.Errorf("the workspace, its files, HOME and /tmp are not all the session's (uid %s) inside:\n%s", uid, out)
			}
			if !strings.Contains(out, "wrote-grp") || !strings.Contains(out, "setuid-refused") {
				t.Errorf("want the owner's file of another group written, and chmod u+s refused:\n%s", out)
			}
			saysWalk := strings.Contains(errOut, "no idmapped mounts here")
			if mode == "idmap" {
				if !strings.Contains(out, "theirs 65534 65534 before") || strings.Contains(out, "wrote-theirs") {
					t.Errorf("another owner's 0666 file: want it the overflow uid, readable and never written:\n%s", out)
				}
				if b, _ := os.ReadFile(filepath.Join(e.ws, "theirs.txt")); string(b) != "before\n" {
					t.Errorf("theirs.txt on disk: %q", b)
				}
				if saysWalk {
					t.Errorf("idmapped mounts work here, yet run says it walked:\n%s", errOut)
				}
			} else if strings.Count(errOut, "no idmapped mounts here") != 1 {
				t.Errorf("the fallback must say so once on stderr:\n%s", errOut)
			}
			if left := ownedBy(t, e.base, uid); len(left) > 0 {
				t.Errorf("files left owned by the session's uid %s: %v", uid, left)
			}
			for _, p := range []string{"made.txt", "d", "d/e", "d/e/f", "grp.txt"} {
				st, err := os.Lstat(filepath.Join(e.ws, p))
				if err != nil {
					t.Fatal(err)
				}
				if s := st.Sys().(*syscall.Stat_t); s.Uid != wsOwner || st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
					t.Errorf("%s after the session: uid %d mode %v, want the workspace owner's %d, no set-id bit", p, s.Uid, st.Mode(), wsOwner)
				}
			}
			if st, err := os.Stat(filepath.Join(e.ws, "made.txt")); err == nil && st.Sys().(*syscall.Stat_t).Gid != wsOwner {
				t.Errorf("made.txt's group is %d, want the workspace's %d", st.Sys().(*syscall.Stat_t).Gid, wsOwner)
			}
			for _, p := range []string{e.run, filepath.Join(e.run, "home", "h"), filepath.Join(e.run, "tmp", "t")} {
				if st, err := os.Lstat(p); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 {
					t.Errorf("%s after the session is not root's as it was: %v", p, err)
				}
			}
			if st, err := os.Stat(e.ws); err != nil || st.Mode().Perm() != 0o755 {
				t.Errorf("the workspace's mode after the session: %v %v, want 0755 as before", st.Mode(), err)
			}
		})
	}
}

// TestLaunchWorkerInLeadSubdir: a lead session launches a worker on a
// directory it made in its own workspace. The lead sees the workspace as
// its own uid's through an idmapped mount; on disk it is the owner's, and
// the launcher checks it against that owner. The worker writes there, as
// another uid, what the lead then reads as its own and the host finds the
// owner's. A directory of another owner, a link, and a directory outside
// the lead's trees are refused, and nothing is launched for them.
func TestLaunchWorkerInLeadSubdir(t *testing.T) {
	e := newLaunchEnv(t)
	run, ws := e.prepareLead(t, e.lead)
	if err := os.Chown(ws, wsOwner, wsOwner); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(ws, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, otherOwner, otherOwner); err != nil {
		t.Fatal(err)
	}
	sb := bin(t, "sandbox")
	launch := `bushost session launch --task t1 --role worker --caps git.push.working --workspace`
	script := `set -e
echo "lead $(id -u)"
mkdir sub && echo lead > sub/from-lead
ln -s / sub-link
id=$(` + launch + ` "$PWD/sub" -- sh -c 'cat from-lead && echo worker > from-worker && id -u > worker-uid')
bushost session wait "$id"
echo "worker wrote $(cat sub/from-worker), as $(cat sub/worker-uid), owned here by $(stat -c %u sub/from-worker)"
set +e
for w in "$PWD/theirs" "$PWD/sub-link" "` + filepath.Dir(run) + `"; do
	` + launch + ` "$w" -- true 2>&1 | tail -1; echo "refused $w"
done`
	out, code := runCmd(t, sb, "run", "--run-dir", run, "--workspace", ws, "--role", "lead", "--caps", "session.launch",
		"--broker-socket", filepath.Join(e.h.Home, "broker.sock"), "--launch-socket", filepath.Join(e.h.Home, "launch.sock"),
		"--", "sh", "-c", script)
	leadUID := ""
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "lead "); ok {
			leadUID = v
		}
	}
	if code != 0 || leadUID == "" || !strings.Contains(out, "worker wrote worker, as ") || !strings.Contains(out, "owned here by "+leadUID+"\n") {
		t.Fatalf("inside the lead session: exit %d, want the worker's file, the lead's own inside\n%s", code, out)
	}
	_, workerUID, _ := strings.Cut(out, "worker wrote worker, as ")
	workerUID, _, _ = strings.Cut(workerUID, ",")
	if workerUID == leadUID {
		t.Errorf("the worker ran as the lead's uid %s", leadUID)
	}
	for _, w := range []string{theirs, filepath.Join(ws, "sub-link"), filepath.Dir(run)} {
		if !strings.Contains(out, "refused "+w) {
			t.Errorf("no refusal of %s:\n%s", w, out)
		}
	}
	if n := strings.Count(out, "WORKSPACE_INVALID") + strings.Count(out, "PATH_UNSAFE"); n != 3 {
		t.Errorf("want 3 refusals (WORKSPACE_INVALID or PATH_UNSAFE), got %d:\n%s", n, out)
	}
	if rows := decodeSessions(t, e.h.Must(t, "session", "list", "--json")); len(rows) != 1 || rows[0].Exit != 0 {
		t.Errorf("session list: %+v, want the one worker, exit 0", rows)
	}
	st, err := os.Stat(filepath.Join(ws, "sub", "from-worker"))
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != wsOwner {
		t.Errorf("the worker's file on disk: %v, want it the workspace owner's %d", err, wsOwner)
	}
	if left := ownedBy(t, filepath.Dir(e.h.Home), leadUID, strings.TrimSpace(workerUID)); len(left) > 0 {
		t.Errorf("files left owned by a session uid: %v", left)
	}
	if _, err := strconv.Atoi(strings.TrimSpace(workerUID)); err != nil {
		t.Errorf("worker uid %q", workerUID)
	}
}

// TestSandboxIDMapRootSetIDRewrite: a root-owned workspace holding a
// set-user-ID and a set-group-ID file of root's. Through an idmapped mount
// the session would be their owner and could rewrite their content
// through a shared writable mapping, which (unlike write(2)) strips no
// set-id bit: a root set-user-ID program of the session's, which anyone on
// the host may run. No such file may be left with session content and its
// bit; each stays root's, and nothing is left owned by the session's uid.
func TestSandboxIDMapRootSetIDRewrite(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	e := newSandboxEnv(t)
	files := map[string]os.FileMode{"su": 0o755 | os.ModeSetuid, "sg": 0o755 | os.ModeSetgid}
	for name, mode := range files {
		p := filepath.Join(e.ws, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(e.ws, 0, 0); err != nil {
		t.Fatal(err)
	}
	script := `id -u; for f in su sg; do ` + e.helper + ` mmapwrite "$PWD/$f"; done; true`
	out, errOut, code := e.runIn(t, []string{"--fresh-home"}, "sh", "-c", script)
	if code != 0 {
		t.Fatalf("the session: exit %d\n%s%s", code, out, errOut)
	}
	uid, _, _ := strings.Cut(out, "\n")
	if strings.Contains(out, "ESCAPED") {
		t.Errorf("the session rewrote a set-id file of root's and kept its bit:\n%s", out)
	}
	for name := range files {
		p := filepath.Join(e.ws, name)
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(p)
		if strings.HasPrefix(string(data), "MARK") && st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
			t.Errorf("%s on disk: the session's content with mode %v", name, st.Mode())
		}
		if s := st.Sys().(*syscall.Stat_t); s.Uid != 0 {
			t.Errorf("%s on disk is uid %d's, want root's as before", name, s.Uid)
		}
	}
	if left := ownedBy(t, e.base, uid); len(left) > 0 {
		t.Errorf("files left owned by the session's uid %s: %v", uid, left)
	}
}

// TestSandboxIDMapRootModesLeftOpen: a session, owner of its workspace,
// HOME and /tmp inside, opens their roots to everyone (0777). After it
// they must have their modes back, as the walk's hand-back gives them:
// left so, the run directory's home/ and tmp/ (root's) and the owner's
// workspace would be world-writable on the host, for any local user to
// plant files and links in before root or the owner uses them again.
func TestSandboxIDMapRootModesLeftOpen(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	shareModes(t, func(t *testing.T, walk bool, sandbox string) {
		e := newSandboxEnv(t)
		e.sandbox = sandbox
		ownWorkspace(t, e)
		want := map[string]os.FileMode{}
		for _, p := range []string{e.ws, filepath.Join(e.run, "home"), filepath.Join(e.run, "tmp")} {
			st, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			want[p] = st.Mode()
		}
		out, errOut, code := e.runIn(t, []string{"--fresh-home"}, "sh", "-c", `chmod 0777 . "$HOME" /tmp && stat -c '%a %n' . "$HOME" /tmp`)
		if code != 0 || strings.Count(out, "777 ") != 3 {
			t.Fatalf("the session: exit %d, want its three roots opened inside\n%s%s", code, out, errOut)
		}
		for p, m := range want {
			st, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode() != m {
				t.Errorf("%s after the session: mode %v, want %v as before", p, st.Mode(), m)
			}
		}
	})
}

// TestSandboxIDMapModesAfterLauncherDied: as above, but the session's
// sandbox run is killed while it runs (the session outlives it), so it
// cannot give the roots their modes back itself. The next launcher that
// takes the uid, once the session is gone, does, from the lock file's
// record, as it hands a walk's trees back: until then the owner's
// workspace and root's HOME would stay open to every local user.
func TestSandboxIDMapModesAfterLauncherDied(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	e := newSandboxEnv(t)
	ownWorkspace(t, e)
	roots := []string{e.ws, filepath.Join(e.run, "home")}
	want := map[string]os.FileMode{}
	for _, p := range roots {
		st, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		want[p] = st.Mode()
	}
	const rng = "65500-65519"
	mark := "3600." + strconv.Itoa(os.Getpid()) + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	args := append(append([]string{"run"}, e.flags("git.push.working")...), "--uid-range", rng, "--fresh-home", "--",
		"sh", "-c", `chmod 0777 . "$HOME" && exec sleep `+mark)
	cmd := exec.Command(e.sandbox, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var pid int
	testenv.WaitFor(t, 20*time.Second, "the session's command to start", func() bool {
		pids := withArg(t, mark)
		if len(pids) == 1 {
			pid = pids[0]
		}
		return pid > 0
	})
	testenv.WaitFor(t, 10*time.Second, "the session to open its workspace to everyone", func() bool {
		st, err := os.Lstat(e.ws)
		return err == nil && st.Mode().Perm() == 0o777
	})
	cmd.Process.Kill()
	cmd.Wait()
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	uid, pid1 := "", 0
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			pid1, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid = strings.Fields(v)[0]
		}
	}
	if pid1 <= 1 || uid == "" {
		t.Fatalf("no pid 1 or uid for the session's command %d", pid)
	}
	syscall.Kill(pid1, syscall.SIGKILL)
	testenv.WaitFor(t, 10*time.Second, "the orphaned session to end", func() bool { return !alive(pid) && !alive(pid1) })
	// Another run (on another workspace: sandbox run refuses one left
	// writable by others) takes the uid.
	out, errOut, code := newSandboxEnv(t).runIn(t, []string{"--uid-range", uid + "-" + uid, "--fresh-home"}, "id", "-u")
	if code != 0 || strings.TrimSpace(out) != uid {
		t.Fatalf("launch on the reclaimed uid %s: exit %d %q %s", uid, code, out, errOut)
	}
	for _, p := range roots {
		if st, err := os.Lstat(p); err != nil || st.Mode() != want[p] {
			t.Errorf("%s after the reclaim: %v %v, want mode %v as before the session", p, st.Mode(), err, want[p])
		}
	}
}

// TestSandboxIDMapRootGroupWorkspace: a workspace of another user's in
// group root (what `chown USER DIR` of a directory root made leaves), with
// files of root's that only group root may read. Its owner cannot read
// them; through an idmapped mount mapping the workspace's group to the
// session's gid, the session would be in group root there and could.
func TestSandboxIDMapRootGroupWorkspace(t *testing.T) {
	testenv.NeedRoot(t, "only root gives a session a uid of its own")
	e := newSandboxEnv(t)
	secret := randomHex(t)
	if err := os.Mkdir(filepath.Join(e.ws, "rootdir"), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"secret", "rootdir/secret"} {
		if err := os.WriteFile(filepath.Join(e.ws, p), []byte(secret+"\n"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(e.ws, wsOwner, 0); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := e.runIn(t, []string{"--fresh-home"}, "sh", "-c", "id -u; cat secret rootdir/secret; ls rootdir; true")
	if code != 0 {
		t.Fatalf("the session: exit %d\n%s%s", code, out, errOut)
	}
	uid, _, _ := strings.Cut(out, "\n")
	if strings.Contains(out, secret) {
		t.Errorf("the session read root's group-only files its workspace's owner (uid %d, not in group root) cannot:\n%s", wsOwner, out)
	}
	if left := ownedBy(t, e.base, uid); len(left) > 0 {
		t.Errorf("files left owned by the session's uid %s: %v", uid, left)
	}
	for _, p := range []string{"secret", "rootdir/secret"} {
		if st, err := os.Lstat(filepath.Join(e.ws, p)); err != nil || st.Sys().(*syscall.Stat_t).Uid != 0 || st.Mode().Perm() != 0o640 {
			t.Errorf("%s after the session: %v, want root's 0640 as before", p, err)
		}
	}
}
