package supervisor

import (
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The launcher protocol end to end: a service under the shim with its
// output, an exit status, a signal to a group, and the launcher's death
// counted as a kill. (init starts it as the services' user; here, as root,
// it runs as root: the test is about the protocol.)
func TestLauncherStartsSignalsAndReports(t *testing.T) {
	requireRoot(t)
	runtime.LockOSThread() // the launcher's parent-death signal follows this thread
	defer runtime.UnlockOSThread()
	fd, lpid, err := startLauncher(os.Args[0], Account{Name: "root", UID: 0, GID: 0, Groups: []int{0}}, os.Environ())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(launcherEnv, "")
	t.Setenv(launcherPidEnv, "")
	os.Setenv(launcherEnv, strconv.Itoa(fd))
	os.Setenv(launcherPidEnv, strconv.Itoa(lpid))
	run, err := launcherFromEnv()
	if err != nil || run == nil {
		t.Fatalf("launcherFromEnv: %v %v", run, err)
	}
	if _, ok := os.LookupEnv(launcherEnv); ok {
		t.Error("the launcher's descriptor stays in the environment")
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	pid, done, err := run.start(true, []string{"sh", "-c", "echo hello from $$; exit 3"}, "/", os.Environ(), w)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r)
	r.Close()
	if code := wait(t, done); code != 3 {
		t.Errorf("exit status %d, want 3", code)
	}
	if !strings.HasPrefix(string(out), "hello from ") || pid <= 0 {
		t.Errorf("output %q, pid %d", out, pid)
	}

	r, w, _ = os.Pipe()
	pid, done, err = run.start(true, []string{"sleep", "100"}, "/", os.Environ(), w)
	w.Close()
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	run.signal(pid, syscall.SIGTERM)
	if code := wait(t, done); code != 128+int(syscall.SIGTERM) {
		t.Errorf("status after SIGTERM %d", code)
	}

	// A start without a command is refused by the launcher, not run.
	r, w, _ = os.Pipe()
	_, _, err = run.start(false, []string{""}, "/", nil, w)
	w.Close()
	r.Close()
	if err == nil {
		t.Error("an empty command was started")
	}

	// The launcher gone: what it ran counts as killed, and nothing new starts.
	r, w, _ = os.Pipe()
	_, done, err = run.start(true, []string{"sleep", "100"}, "/", os.Environ(), w)
	w.Close()
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	run.conn.Close()
	if code := wait(t, done); code != 128+int(syscall.SIGKILL) {
		t.Errorf("status after the launcher went %d", code)
	}
	if _, _, err := run.start(false, []string{"true"}, "/", nil, os.Stderr); err == nil {
		t.Error("started without a launcher")
	}
	// Its parent (here the test, in init the supervisor) waited for it:
	// no zombie is left.
	waitFor(t, "the launcher reaped", 10*time.Second, func() bool {
		_, err := os.Stat("/proc/" + strconv.Itoa(lpid))
		return os.IsNotExist(err)
	})
}

func wait(t *testing.T, done <-chan int) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(20 * time.Second):
		t.Fatal("no exit reported")
		return -1
	}
}
