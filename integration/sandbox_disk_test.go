package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/bushost/bushost/internal/testenv"
)

// TestSandboxDisk: `sandbox run --disk` as the host runs it by hand. A run
// directory on the host's own disk is refused before anything starts;
// one on a tmpfs of the size (mounted as docs/sandbox.md says) bounds
// HOME, /tmp and /dev/shm together, with ENOSPC past it, while the
// caller's own workspace elsewhere is outside it.
func TestSandboxDisk(t *testing.T) {
	testenv.NeedRoot(t, "mounts a tmpfs")
	e := newSandboxEnv(t)
	snap := e.snapshot(t)
	out, errOut, code := e.runIn(t, []string{"--disk", "16M"}, "true")
	if code != 125 || !strings.Contains(errOut, "LIMIT_UNAVAILABLE: --disk 16777216: the run directory "+e.run+" is not on a tmpfs of at most that size") {
		t.Errorf("--disk with the run directory on the host's disk: exit %d, want 125 naming it\n%s%s", code, out, errOut)
	}
	e.assertUnchanged(t, snap)

	run := tmpfsRunDir(t, e, "size=16M,mode=0711")
	flags := e.flags("git.push.working")
	flags[slices.Index(flags, "--run-dir")+1] = run
	out, errOut, code = runSandbox(t, e.sandbox, append(append([]string{"run"}, flags...), "--disk", "16M", "--", "sh", "-c", `
head -c 6291456 /dev/zero > /tmp/a; echo "tmp=$?"
head -c 6291456 /dev/zero > "$HOME/b"; echo "home=$?"
head -c 6291456 /dev/zero > /dev/shm/c; echo "shm=$?"
head -c 6291456 /dev/zero > ws-file; echo "ws=$?"
rm -f ws-file`)...)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"tmp=0", "home=0", "shm=1", "No space left on device", "ws=0"} {
		if !strings.Contains(out+errOut, want) {
			t.Errorf("6 MB each to /tmp, HOME, /dev/shm (all on a 16M disk) and the caller's workspace: no %q\n%s%s", want, out, errOut)
		}
	}
	out, _, _ = runSandbox(t, e.sandbox, append(append([]string{"explain"}, flags...), "--disk", "16M")...)
	if !strings.Contains(out, "the workspace "+e.ws+" is the caller's own, outside it") {
		t.Errorf("explain does not say the caller's workspace is outside --disk:\n%s", out)
	}
}

// TestSandboxDiskUnboundedTmpfs: the run directory is on a tmpfs mounted
// with size=0, which tmpfs reads as no bound at all (statfs says 0
// blocks). `sandbox run --disk 16M` must refuse it before anything
// starts, as a run directory on the host's disk is: the session could
// write past 16M there (the session here tries 24 MB in /tmp).
func TestSandboxDiskUnboundedTmpfs(t *testing.T) {
	testenv.NeedRoot(t, "mounts a tmpfs")
	e := newSandboxEnv(t)
	run := tmpfsRunDir(t, e, "size=0,mode=0711")
	snap := e.snapshot(t)
	flags := e.flags("git.push.working")
	flags[slices.Index(flags, "--run-dir")+1] = run
	out, errOut, code := runSandbox(t, e.sandbox, append(append([]string{"run"}, flags...), "--disk", "16M", "--", "sh", "-c",
		`head -c 25165824 /dev/zero > /tmp/a; echo "tmp=$?"`)...)
	if code != 125 || !strings.Contains(errOut, "LIMIT_UNAVAILABLE: --disk 16777216: the run directory "+run+" is not on a tmpfs of at most that size") {
		t.Errorf("--disk 16M with the run directory on an unbounded tmpfs: exit %d, want 125 naming it\n%s%s", code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(run, "tmp", "a")); err == nil {
		t.Errorf("the session wrote past --disk 16M: %s", filepath.Join(run, "tmp", "a"))
	}
	e.assertUnchanged(t, snap)
}

// tmpfsRunDir mounts a tmpfs with opts under the test's base (unmounted
// at its end) and makes a run directory in it.
func tmpfsRunDir(t *testing.T, e *sandboxEnv, opts string) string {
	t.Helper()
	disk := filepath.Join(e.base, "disk")
	if err := os.Mkdir(disk, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", disk, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(disk, syscall.MNT_DETACH) })
	run := filepath.Join(disk, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(run, "session.json"), []byte(`{"task":"t1"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return run
}
