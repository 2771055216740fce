package supervisor

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/testenv"
)

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "it changes ownership")
}

// A directory of the agent's swapped for a link to a root-only directory
// while the ownership walk runs, 200 times: the target never changes owner
// or mode.
func TestSetOwnershipFollowsNoLinkUnderRace(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	dir := filepath.Join(ws, "src", "d")
	aside := filepath.Join(ws, "src", "d.aside")
	for i := range 100 {
		writeFile(t, filepath.Join(dir, fmt.Sprintf("f%03d", i)), "x\n")
	}
	target := filepath.Join(base, "target")
	writeFile(t, filepath.Join(target, "secret"), "root's\n")
	for _, p := range []string{target, filepath.Join(target, "secret")} {
		if err := os.Chmod(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func() string {
		var b strings.Builder
		for _, p := range []string{target, filepath.Join(target, "secret")} {
			var st syscall.Stat_t
			if err := syscall.Lstat(p, &st); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %d:%d %o\n", p, st.Uid, st.Gid, st.Mode)
		}
		return b.String()
	}
	before := snapshot()
	agent := Account{Name: "nobody-agent", UID: 54321, GID: 54321}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	wsfd, err := unix.Open(ws, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wsfd)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if os.Rename(dir, aside) == nil {
				os.Symlink(target, dir)
				os.Remove(dir)
				os.Rename(aside, dir)
			}
		}
	}()
	for round := range 200 {
		if err := setOwnership(wsfd, ws, []string{"src"}, agent, log); err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("round %d: %v", round, err)
		}
		if got := snapshot(); got != before {
			close(stop)
			wg.Wait()
			t.Fatalf("round %d: the link's target changed:\n%s\nwas\n%s", round, got, before)
		}
	}
	close(stop)
	wg.Wait()
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dir, "f000"), &st); err != nil || st.Uid != 54321 {
		t.Errorf("the agent's file was not handed over: uid %d, %v", st.Uid, err)
	}
}

// A hard link in the agent's tree to a fifo root owns outside the
// workspace (on the same filesystem) stays root's, as a hard-linked
// regular file does; a fifo of the agent's own is handed over.
func TestSetOwnershipLeavesHardLinkedFifo(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	if err := os.MkdirAll(filepath.Join(ws, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Outside the walk: the walk would hand root's part of the workspace
	// back to root, hiding the chown.
	roots := filepath.Join(base, "fifo")
	if err := unix.Mkfifo(roots, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(roots, filepath.Join(ws, "src", "fifo")); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(ws, "src", "own")
	if err := unix.Mkfifo(own, 0o600); err != nil {
		t.Fatal(err)
	}
	wsfd, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(wsfd)
	agent := Account{Name: "nobody-agent", UID: 54321, GID: 54321}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := setOwnership(wsfd, ws, []string{"src"}, agent, log); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(roots, &st); err != nil || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("root's hard-linked fifo was handed over: %d:%d, %v", st.Uid, st.Gid, err)
	}
	if err := syscall.Lstat(own, &st); err != nil || st.Uid != 54321 {
		t.Errorf("the agent's fifo was not handed over: uid %d, %v", st.Uid, err)
	}
}

func TestRefuseAgentProcessesNamesOne(t *testing.T) {
	requireRoot(t)
	agent := Account{Name: "test-agent", UID: 54322, GID: 54322}
	if err := refuseAgentProcesses(agent); err != nil {
		t.Fatalf("no process of uid 54322 runs, yet: %v", err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 54322, Gid: 54322}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	err := refuseAgentProcesses(agent)
	if errdefs.ReasonOf(err) != errdefs.AgentProcessRunning || !strings.Contains(err.Error(), fmt.Sprintf("process %d (sleep)", cmd.Process.Pid)) {
		t.Fatalf("refusal %v", err)
	}
}
