package integration

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// mounted reports whether path is a mount point in this mount namespace.
func mounted(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// hostBytes is what the files under dir take on dir's own file system,
// not counting what is mounted below it.
func hostBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var root syscall.Stat_t
	if err := syscall.Stat(dir, &root); err != nil {
		t.Fatal(err)
	}
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		var st syscall.Stat_t
		if err != nil || syscall.Lstat(p, &st) != nil {
			return nil
		}
		if st.Dev != root.Dev {
			return filepath.SkipDir
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}

// TestLaunchDisk: --disk 64M is one bound for the session's /tmp, HOME
// and the workspace the launcher made: 30 MB to each, the third write
// fails with ENOSPC; 200 MB to /tmp alone fails; nothing of it lands on
// the host's file system; the workspace is kept --keep-workspaces after
// the session ended and then removed, or removed by session rm at once;
// a disk over the grant's ceiling is refused.
func TestLaunchDisk(t *testing.T) {
	e := newLaunchEnv(t, "--keep-workspaces", "3s")
	launch := func(disk, script string) string {
		t.Helper()
		id, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
			"--disk", disk, "--", "sh", "-c", script)
		id = strings.TrimSpace(id)
		if code != 0 || !strings.HasPrefix(id, "s-") {
			t.Fatalf("session launch: exit %d, %q\n%s", code, id, errOut)
		}
		if out, errOut, code := e.as(t, e.lead, "session", "wait", id); code != 0 {
			t.Fatalf("session wait %s: exit %d\n%s%s", id, code, out, errOut)
		}
		return id
	}
	logs := func(id string) string {
		out, errOut, _ := e.as(t, e.lead, "session", "logs", id)
		return out + errOut
	}
	var before syscall.Statfs_t
	if err := syscall.Statfs(e.h.Home, &before); err != nil {
		t.Fatal(err)
	}

	three := launch("64M", `
head -c 1048576 /dev/zero > /dev/shm/s && [ -f /tmp/s ]; echo "shm=$?"
touch /dev/x 2>/dev/null; echo "dev=$?"
head -c 31457280 /dev/zero > /tmp/a; echo "tmp=$?"
head -c 31457280 /dev/zero > "$HOME/b"; echo "home=$?"
head -c 31457280 /dev/zero > "$PWD/c"; echo "ws=$?"
exit 0`)
	out := logs(three)
	// /dev/shm is on the disk too, and /dev's own tmpfs is read-only.
	if !strings.Contains(out, "shm=0") || !strings.Contains(out, "dev=1") {
		t.Errorf("/dev/shm on the disk, /dev not writable: want shm=0 and dev=1:\n%s", out)
	}
	if !strings.Contains(out, "tmp=0") || !strings.Contains(out, "home=0") || !strings.Contains(out, "ws=1") || !strings.Contains(out, "No space left on device") {
		t.Fatalf("30 MB each to /tmp, HOME and the workspace on a 64M disk: want the third refused with ENOSPC:\n%s", out)
	}
	dir := filepath.Join(e.h.Home, "sessions", three)
	disk := filepath.Join(dir, "disk")
	var st syscall.Statfs_t
	if err := syscall.Statfs(disk, &st); err != nil || st.Type != 0x01021994 || st.Blocks*uint64(st.Bsize) != 64<<20 {
		t.Fatalf("the session's disk %s: %v, type %#x, %d bytes; want a tmpfs of 64M", disk, err, st.Type, st.Blocks*uint64(st.Bsize))
	}
	// What the session wrote is on its disk, not on the host's: the
	// session's directory there holds its record and output only.
	if n := hostBytes(t, dir); n > 1<<20 {
		t.Errorf("the session left %d bytes on the host's file system", n)
	}
	var after syscall.Statfs_t
	if err := syscall.Statfs(e.h.Home, &after); err != nil {
		t.Fatal(err)
	}
	// Others share this machine's disk: its free space is logged, the
	// bound is the session's own bytes above.
	t.Logf("the host's free space: %d MB before, %d MB after (other work shares it)", before.Bavail*uint64(before.Bsize)>>20, after.Bavail*uint64(after.Bsize)>>20)

	big := launch("64M", `head -c 209715200 /dev/zero > /tmp/big; echo "big=$?"; ls -l /tmp/big`)
	if out := logs(big); !strings.Contains(out, "big=1") || !strings.Contains(out, "No space left on device") {
		t.Fatalf("200 MB to /tmp on a 64M disk:\n%s", out)
	}

	// A disk over the grant's ceiling (sandbox serve's --default-disk
	// 1G) is refused, and nothing is made.
	dirs := e.sessionDirs(t)
	if _, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--disk", "2G", "--", "true"); code != 4 || !strings.Contains(errOut, "--disk 2G (above sandbox serve --default-disk") {
		t.Errorf("--disk 2G: exit %d, want LAUNCH_NOT_ALLOWED naming it\n%s", code, errOut)
	}
	if got := e.sessionDirs(t); strings.Join(got, ",") != strings.Join(dirs, ",") {
		t.Errorf("a refused launch left %v (was %v)", got, dirs)
	}

	// session rm: at once, the whole session; a running one is refused.
	if _, errOut, code := e.as(t, e.lead, "session", "rm", big); code != 0 {
		t.Fatalf("session rm: exit %d\n%s", code, errOut)
	}
	bigDir := filepath.Join(e.h.Home, "sessions", big)
	if _, err := os.Stat(bigDir); !os.IsNotExist(err) || mounted(t, filepath.Join(bigDir, "disk")) {
		t.Errorf("session rm left %s: %v", bigDir, err)
	}
	if out, _, _ := e.as(t, e.lead, "session", "list", "--json"); strings.Contains(out, big) {
		t.Errorf("session rm: still listed:\n%s", out)
	}
	running, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--disk", "8M", "--", "sleep", "600")
	running = strings.TrimSpace(running)
	if code != 0 {
		t.Fatalf("session launch: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "rm", running); code != 1 || !strings.Contains(errOut, "SESSION_RUNNING") {
		t.Errorf("session rm of a running session: exit %d, want 1 SESSION_RUNNING\n%s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(e.h.Home, "sessions", running, "disk", "ws")); err != nil {
		t.Errorf("a refused rm took the running session's workspace: %v", err)
	}
	e.as(t, e.lead, "session", "stop", running)

	// --keep-workspaces 3s after it ended, the first session's disk (its
	// workspace with it) is unmounted and gone; its record stays.
	testenv.WaitFor(t, 60*time.Second, "the workspace removed --keep-workspaces after the session", func() bool {
		_, err := os.Stat(disk)
		return os.IsNotExist(err) && !mounted(t, disk)
	})
	if _, err := os.Stat(filepath.Join(dir, "record.json")); err != nil {
		t.Errorf("the record went with the workspace: %v", err)
	}
}
