package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// noDefaults keeps sandbox serve from needing a cgroup or a tmpfs: these
// tests are about its homes.
var noDefaults = []string{"--default-memory", "none", "--default-pids", "none", "--default-cpu", "none", "--default-disk", "none"}

// sandbox serve runs as root in the home a flag (or $BUSHOST_HOME) names.
// A home someone else made or can change is refused before root makes,
// opens or changes anything in it: a home a user made in a directory
// anyone may write, one writable by others, a link, links planted
// where root makes its lock, its state directory and reads the admin
// token, and a --launch-state a user owns or reached through a link. Nothing outside is touched (a root directory's mode, a file
// made), nothing is left in the home but, in a home it trusts, the
// launcher's own lock.
func TestLaunchHomeAttack(t *testing.T) {
	testenv.NeedRoot(t, "sandbox serve runs as root")
	sb := bin(t, "sandbox")
	bin(t, "bushostd") // sandbox serve becomes the bushostd beside it
	base := baseDir(t)
	victim := filepath.Join(base, "victim") // stands for /root, /etc
	mkdirMode(t, victim, 0o700)
	mustWrite(t, filepath.Join(victim, "secret"), "root's secret\n", 0o600)
	token := "0123456789abcdef0123456789abcdef0123456789abcdef\n"

	serve := func(t *testing.T, env []string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(sb, append(append([]string{"serve"}, args...), noDefaults...)...)
		cmd.Env = append(cleanEnv(), env...)
		cmd.Dir = base
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-done
			t.Fatalf("sandbox serve served a hostile home:\n%s", out.String())
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}

	cases := []struct {
		name string
		// make builds the home and returns the flags naming it.
		make func(t *testing.T, dir string) (env []string, args []string)
		want string
	}{
		{"a user's home in a directory anyone may write", func(t *testing.T, dir string) ([]string, []string) {
			// /var/tmp is 1777: the user made it, and filled it.
			home := evilDir(t, base)
			mustWrite(t, filepath.Join(home, "admin.token"), token, 0o600)
			os.Symlink(victim, filepath.Join(home, "sessions"))
			os.Symlink(filepath.Join(victim, "made"), filepath.Join(home, "launch.lock"))
			chownAll(t, home, 65534)
			return nil, []string{"--home", home}
		}, "which anyone may write: anyone could have made it"},
		{"the same, named by $BUSHOST_HOME", func(t *testing.T, dir string) ([]string, []string) {
			home := evilDir(t, base)
			os.Symlink(victim, filepath.Join(home, "sessions"))
			chownAll(t, home, 65534)
			return []string{"BUSHOST_HOME=" + home}, nil
		}, "which anyone may write"},
		{"a home others may write", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o777)
			return nil, []string{"--home", dir}
		}, "is writable by group or others"},
		{"a home that is a link", func(t *testing.T, dir string) ([]string, []string) {
			os.Symlink(victim, dir)
			return nil, []string{"--home", dir}
		}, "is a symbolic link"},
		{"a relative home through a link", func(t *testing.T, dir string) ([]string, []string) {
			// Relative to sandbox serve's directory, base; dir/l -> victim.
			mkdirMode(t, dir, 0o700)
			os.Symlink(victim, filepath.Join(dir, "l"))
			return nil, []string{"--home", filepath.Base(dir) + "/l/x"}
		}, "l is a symbolic link"},
		{"a relative home with .. through a link", func(t *testing.T, dir string) ([]string, []string) {
			// The kernel would take dir/l/.. to victim's parent; the
			// launcher takes the path once, as written (dir), and finds it
			// others may write.
			mkdirMode(t, dir, 0o777)
			os.Symlink(victim, filepath.Join(dir, "l"))
			return nil, []string{"--home", filepath.Base(dir) + "/l/../"}
		}, "is writable by group or others"},
		{"launch.lock a link", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			os.Symlink(filepath.Join(victim, "made"), filepath.Join(dir, "launch.lock"))
			return nil, []string{"--home", dir}
		}, "launch.lock is a symbolic link"},
		{"sessions a link", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			mustWrite(t, filepath.Join(dir, "admin.token"), token, 0o600)
			os.Symlink(victim, filepath.Join(dir, "sessions"))
			return nil, []string{"--home", dir}
		}, "sessions is a symbolic link"},
		{"a state directory a user owns", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			mustWrite(t, filepath.Join(dir, "admin.token"), token, 0o600)
			evil := evilDir(t, base)
			chownAll(t, evil, 65534)
			return nil, []string{"--home", dir, "--launch-state", filepath.Join(evil, "state")}
		}, "belongs to another user, not root"},
		{"a state directory through a link", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			mustWrite(t, filepath.Join(dir, "admin.token"), token, 0o600)
			os.Symlink(victim, filepath.Join(dir, "l"))
			return nil, []string{"--home", dir, "--launch-state", filepath.Join(dir, "l", "state")}
		}, "l is a symbolic link"},
		{"admin.token a link to a root file", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			os.Symlink(filepath.Join(victim, "secret"), filepath.Join(dir, "admin.token"))
			return nil, []string{"--home", dir}
		}, "admin.token is a symbolic link"},
		{"a bus home a user made in a directory anyone may write", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			bus := evilDir(t, base)
			mustWrite(t, filepath.Join(bus, "admin.token"), token, 0o600)
			chownAll(t, bus, 65534)
			return nil, []string{"--home", dir, "--bus-home", bus}
		}, "--bus-home " + filepath.Dir(base)},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(base, "home"+string(rune('a'+i)))
			env, args := tc.make(t, dir)
			before := lsnap(t, base, filepath.Dir(base)+"/bh-evil*")
			out, code := serve(t, env, args...)
			if code != 1 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 1 and %q:\n%s", code, tc.want, out)
			}
			// Past the home's own checks, the launcher takes its lock
			// (root's, 0600) before it reads the rest: that may stay.
			if lock := filepath.Join(dir, "launch.lock"); !strings.Contains(before, lock+" ") {
				os.Remove(lock)
			}
			if after := lsnap(t, base, filepath.Dir(base)+"/bh-evil*"); after != before {
				t.Fatalf("sandbox serve changed what it refused:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("victim: %v %v", fi.Mode(), err)
			}
		})
	}

	t.Run("bushostd's home", func(t *testing.T) { launchOnUsersHome(t) })
}

// launchOnUsersHome: the deployed layout, end to end. bushostd's user owns
// the home (0710, in a directory only root may write); the launcher keeps
// its state outside it, in a directory root alone may write, and a worker
// it launches runs to completion. The home's owner then plants links
// where the launcher's state used to lie (sessions/, launch.lock,
// probe-disk) and where sessions' directories were, while a session runs,
// after it ended, across a restart (re-adoption), a workspace sweep and
// session rm: root writes, mounts and removes nothing outside its state
// directory. Last it makes broker.sock a link to a socket of power: no
// session reaches that socket.
func launchOnUsersHome(t *testing.T) {
	lib, err := os.MkdirTemp("/var/lib", "bh-atk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(lib) })
	os.Chmod(lib, 0o755)
	victim := filepath.Join(lib, "victim") // stands for /root, /etc
	mkdirMode(t, filepath.Join(victim, "dir"), 0o700)
	mkdirMode(t, victim, 0o700)
	mustWrite(t, filepath.Join(victim, "secret"), "root's secret\n", 0o600)
	mustWrite(t, filepath.Join(victim, "dir", "keep"), "kept\n", 0o600)
	home := filepath.Join(lib, "home")
	mkdirMode(t, home, 0o700)
	const owner = 65534 // bushostd's user
	e := newLaunchEnvAt(t, home, func(e *launchEnv) {
		// bushostd (root in this test) made its files; the home is its
		// user's, its group the sockets' (sessions enter it).
		grp, err := user.LookupGroup(e.group)
		if err != nil {
			t.Fatal(err)
		}
		gid, _ := strconv.Atoi(grp.Gid)
		if err := os.Lchown(home, owner, gid); err != nil {
			t.Fatal(err)
		}
		os.Chmod(home, 0o710)
	}, "--keep-workspaces", "2s")
	testenv.WaitFor(t, time.Minute, "sandbox serve naming its state directory", func() bool {
		b, _ := os.ReadFile(e.log)
		_, st, ok := strings.Cut(string(b), ", state in ")
		st, _, nl := strings.Cut(st, "\n")
		if ok && nl {
			e.state = st
		}
		return ok && nl
	})
	if !strings.HasPrefix(e.state, "/var/lib/bushost-launch/") {
		t.Fatalf("state directory %q, want one of /var/lib/bushost-launch", e.state)
	}
	t.Cleanup(func() {
		os.RemoveAll(e.state)
		os.Remove(filepath.Dir(e.state)) // only if no other launcher's is there
	})
	for p := e.state; p != "/"; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() || fi.Sys().(*syscall.Stat_t).Uid != 0 || fi.Mode().Perm()&0o022 != 0 {
			t.Fatalf("%s: %v (%v), want a directory root alone may write", p, fi.Mode(), err)
		}
	}
	for _, name := range []string{"launch.lock", "launch.sock", "sessions", "probe-disk"} {
		want := name == "launch.sock" // the socket is where bushost finds it
		if _, err := os.Lstat(filepath.Join(home, name)); (err == nil) != want {
			t.Errorf("%s in the home: %v", name, err)
		}
		if _, err := os.Lstat(filepath.Join(e.state, name)); (err == nil) != (name == "launch.lock" || name == "sessions") {
			t.Errorf("%s in the state directory: %v", name, err)
		}
	}

	// (1) A worker runs a command to completion.
	id, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--", "sh", "-c", "echo made by a worker; exit 5")
	id = strings.TrimSpace(id)
	if code != 0 || !strings.HasPrefix(id, "s-") {
		t.Fatalf("session launch on bushostd's home: exit %d, %q\n%s", code, id, errOut)
	}
	if out, errOut, code := e.as(t, e.lead, "session", "wait", id); code != 5 {
		t.Fatalf("session wait: exit %d, want the session's 5\n%s%s", code, out, errOut)
	}
	if logs, _, _ := e.as(t, e.lead, "session", "logs", id); !strings.Contains(logs, "made by a worker") {
		t.Fatalf("session logs: %q", logs)
	}

	// (2) The home's owner plants links where root's state lay, for a
	// session running and one ended.
	before := lsnap(t, victim, "")
	// What it plants is its own (the uid alone: the group stays the
	// sockets', which sessions need).
	own := func(paths ...string) {
		t.Helper()
		for _, p := range paths {
			if err := os.Lchown(p, owner, -1); err != nil {
				t.Fatal(err)
			}
		}
	}
	plant := func(id string) {
		t.Helper()
		sess := filepath.Join(home, "sessions")
		os.Rename(sess, sess+".old")
		mkdirMode(t, sess, 0o755)
		own(sess)
		for _, p := range []string{id, "probe"} {
			os.Symlink(victim, filepath.Join(sess, p))
			own(filepath.Join(sess, p))
		}
		for _, name := range []string{"launch.lock", "probe-disk"} {
			os.Remove(filepath.Join(home, name))
			os.Symlink(filepath.Join(victim, "dir"), filepath.Join(home, name))
			own(filepath.Join(home, name))
		}
	}
	plant(id)
	run, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--", "sleep", "600")
	run = strings.TrimSpace(run)
	if code != 0 {
		t.Fatalf("session launch: exit %d\n%s", code, errOut)
	}
	plant(run)
	// The sessions' directory itself a link, to the victim.
	os.Rename(filepath.Join(home, "sessions"), filepath.Join(home, "sessions.2"))
	os.Symlink(victim, filepath.Join(home, "sessions"))
	own(filepath.Join(home, "sessions"))
	if out, errOut, code := e.as(t, e.lead, "session", "stop", run); code != 0 {
		t.Fatalf("session stop: exit %d\n%s%s", code, out, errOut)
	}
	e.as(t, e.lead, "session", "wait", run)
	// A restart re-adopts both from the state directory.
	e.stop(t)
	e.start(t)
	rows := decodeSessions(t, e.h.Must(t, "session", "list", "--json"))
	if len(rows) != 2 {
		t.Fatalf("session list after a restart: %+v, want the two sessions", rows)
	}
	// The sweep (--keep-workspaces 2s) removes both workspaces, then
	// session rm both sessions.
	testenv.WaitFor(t, time.Minute, "the workspaces swept", func() bool {
		for _, s := range []string{id, run} {
			b, _ := os.ReadFile(filepath.Join(e.state, "sessions", s, "record.json"))
			if !strings.Contains(string(b), `"workspace_removed": true`) {
				return false
			}
		}
		return true
	})
	for _, s := range []string{id, run} {
		if out, errOut, code := e.as(t, e.lead, "session", "rm", s); code != 0 {
			t.Fatalf("session rm %s: exit %d\n%s%s", s, code, out, errOut)
		}
		if _, err := os.Lstat(filepath.Join(e.state, "sessions", s)); !os.IsNotExist(err) {
			t.Errorf("session rm %s left its directory: %v", s, err)
		}
	}
	// (3) The home's owner makes broker.sock a link to another socket on
	// the host, one of a group of power (docker.sock's): root, resolving
	// it, bound that socket and gave sessions its group: they connected.
	// A launch is refused, naming the link; no session reaches it.
	const power = 54399
	powerSock := filepath.Join(lib, "power.sock")
	pl, err := net.Listen("unix", powerSock)
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	if err := os.Chown(powerSock, 0, power); err != nil {
		t.Fatal(err)
	}
	os.Chmod(powerSock, 0o660)
	broker := filepath.Join(home, "broker.sock")
	if err := os.Rename(broker, broker+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(powerSock, broker); err != nil {
		t.Fatal(err)
	}
	own(broker)
	// The session tries the socket (python3: this host's tools are bound).
	out, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--", "python3", "-c", fmt.Sprintf("import socket; socket.socket(socket.AF_UNIX).connect(%q); print('connected')", powerSock))
	if code == 0 {
		linked := strings.TrimSpace(out)
		e.as(t, e.lead, "session", "wait", linked)
		out, errOut, _ = e.as(t, e.lead, "session", "logs", linked)
		e.as(t, e.lead, "session", "rm", linked)
	}
	if strings.Contains(out, "connected") || !strings.Contains(errOut, "is a link") {
		t.Errorf("a launch with broker.sock a link to %s: exit %d, session said %q, %q; want refused naming the link", powerSock, code, out, errOut)
	}
	if err := os.Remove(broker); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(broker+".real", broker); err != nil {
		t.Fatal(err)
	}

	if after := lsnap(t, victim, ""); after != before {
		t.Errorf("root changed what the home's links named:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (strings.HasPrefix(f[4], lib+"/") || strings.HasPrefix(f[4], e.state+"/")) {
			t.Errorf("mounted: %s", line)
		}
	}
	// What the home's owner planted is still there, the owner's.
	for _, p := range []string{"sessions", "sessions.old", "sessions.2", "launch.lock", "probe-disk"} {
		if fi, err := os.Lstat(filepath.Join(home, p)); err != nil || fi.Sys().(*syscall.Stat_t).Uid != owner {
			t.Errorf("%s in the home: %v", p, err)
		}
	}
}

func mkdirMode(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

// chownAll gives dir and what is in it (links themselves) to uid.
func chownAll(t *testing.T, dir string, uid int) {
	t.Helper()
	filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			err = os.Lchown(p, uid, uid)
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
}

// evilDir is a directory of 65534's in base's parent (/var/tmp, 1777), as
// any user can make one; removed at the end of the test.
func evilDir(t *testing.T, base string) string {
	t.Helper()
	d := filepath.Join(filepath.Dir(base), "bh-evil"+randSuffix())
	mkdirMode(t, d, 0o700)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// lsnap lists root and the directories glob matches, following no link:
// each entry's path, mode, owner and link target or content.
func lsnap(t *testing.T, root, glob string) string {
	t.Helper()
	roots, _ := filepath.Glob(glob)
	var b strings.Builder
	for _, r := range append([]string{root}, roots...) {
		filepath.Walk(r, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %v %d", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
			switch {
			case fi.Mode()&os.ModeSymlink != 0:
				l, _ := os.Readlink(p)
				b.WriteString(" -> " + l)
			case fi.Mode().IsRegular():
				c, _ := os.ReadFile(p)
				fmt.Fprintf(&b, " %q", c)
			}
			b.WriteString("\n")
			return nil
		})
	}
	return b.String()
}
