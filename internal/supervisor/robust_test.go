package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/gitcmd"
)

// mkdirChain makes depth nested directories "d" under dir through
// descriptors (a path that long is past PATH_MAX), with a file at the
// bottom, holding two descriptors at a time.
func mkdirChain(t *testing.T, dir string, depth int) {
	t.Helper()
	cur, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		if err := unix.Mkdirat(cur, "d", 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			t.Fatal(err)
		}
		next, err := unix.Openat(cur, "d", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			t.Fatal(err)
		}
		cur = next
	}
	fd, err := unix.Openat(cur, "bottom.txt", unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o644)
	unix.Close(cur)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
}

func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A 1,100-level tree is walked to its bottom and removed whole, and the
// walk never holds more than heldDirs descriptors of its own.
func TestWalkTreeHoldsFewDescriptorsAtAnyDepth(t *testing.T) {
	const depth = 1100
	dir := t.TempDir()
	mkdirChain(t, dir, depth)
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	base, most, deepest, bottom := openFds(t), 0, 0, ""
	err = walkTree(root, walkFuncs{visit: func(_ int, rel, name string, st *unix.Stat_t, d int) (bool, error) {
		if d%50 == 0 || name == "bottom.txt" {
			most = max(most, openFds(t)-base)
		}
		deepest = max(deepest, d)
		if name == "bottom.txt" {
			bottom = rel
		}
		return true, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if deepest != depth+1 || strings.Count(bottom, "/") != depth {
		t.Fatalf("walk reached depth %d, bottom %.40q..., want %d", deepest, bottom, depth+1)
	}
	// heldDirs, plus the one readNames and the /proc listing hold.
	if most > heldDirs+2 {
		t.Errorf("the walk held %d descriptors, want at most %d", most, heldDirs+2)
	}
	if err := removeAllAt(root, "d", "d"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "d")); !os.IsNotExist(err) {
		t.Errorf("the tree survived removeAllAt: %v", err)
	}
	if got := openFds(t); got != base {
		t.Errorf("%d descriptors open after the walk, %d before", got, base)
	}
}

// A directory deeper than maxTreeDepth is refused by name: no commit takes
// part of the tree. The supervisor reports it (/status degraded, the
// webhook), retries, and records the edit once the tree is removed; the
// health of the services is not what it is about.
func TestSupervisorReportsATreeTooDeep(t *testing.T) {
	rcv := newReceiver(t, 0)
	r := startSupervisor(t, fmt.Sprintf("notify_url = %q\n", rcv.srv.URL)+fmt.Sprintf(webService, "/nonexistent"))
	waitFor(t, "first good commit", 5*time.Second, func() bool { return r.s.Status().Good != "" })
	head := r.s.Status().Head

	deep := filepath.Join(r.ws, "src", "web", "deep")
	if err := os.Mkdir(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	mkdirChain(t, deep, maxTreeDepth+20)
	writeFile(t, filepath.Join(r.ws, "src", "web", "beside.txt"), "an edit beside it\n")
	waitFor(t, "the tree reported", 10*time.Second, func() bool {
		return strings.Contains(r.s.Status().Unrecorded, fmt.Sprintf("more than %d directories below src", maxTreeDepth))
	})
	st := r.s.Status()
	if st.State != "degraded" || st.Head != head || !strings.Contains(st.Unrecorded, "src/web/deep/d/d/") {
		t.Errorf("status %q, head %s (was %s), unrecorded %q", st.State, st.Head, head, st.Unrecorded)
	}
	if code := r.healthz(t); code != 200 {
		t.Errorf("/healthz = %d: an unrecorded edit is no service's failure", code)
	}
	waitFor(t, "commit_blocked notification", 5*time.Second, func() bool { _, ok := rcv.find(EventCommitBlocked); return ok })
	if n, _ := rcv.find(EventCommitBlocked); !strings.Contains(n.Reason, "src/web/deep") {
		t.Errorf("commit_blocked %+v", n)
	}

	if err := removeAllAt(unixOpen(t, filepath.Join(r.ws, "src", "web")), "deep", "deep"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the edit recorded", 10*time.Second, func() bool { st := r.s.Status(); return st.Unrecorded == "" && st.Head != head })
	if st := r.s.Status(); st.State == "halted" {
		t.Errorf("state %q after the edit was recorded", st.State)
	}
	if n := len(rcv.events()); n != 1 {
		t.Errorf("%d notifications, want the one commit_blocked: %+v", n, rcv.events())
	}
}

func unixOpen(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// A revert removes what the good commit does not hold at any depth: a
// 1,100-level implant goes, and the trees end exactly as the good commit.
func TestRepoRevertRemovesADeepTree(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "good\n")
	good, _, err := r.InitialCommit(ctx, testSup)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "bad\n")
	if err := os.Mkdir(filepath.Join(ws, "src", "implant"), 0o755); err != nil {
		t.Fatal(err)
	}
	mkdirChain(t, filepath.Join(ws, "src", "implant"), 1100)
	var be *BlockedError
	if _, _, err := r.CommitPending(ctx, testAgent); !errors.As(err, &be) {
		t.Fatalf("commit with a 1,100-level tree: %v, want it refused by name", err)
	}
	if _, _, err := r.Revert(ctx, good, testAgent, testSup, "deep implant"); err != nil {
		t.Fatal(err)
	}
	if got := filesUnderTree(t, filepath.Join(ws, "src")); got != "a.txt" {
		t.Errorf("after the revert the tree holds %q, want a.txt alone", got)
	}
	if b, _ := os.ReadFile(filepath.Join(ws, "src", "a.txt")); string(b) != "good\n" {
		t.Errorf("a.txt = %q", b)
	}
}

func filesUnderTree(t *testing.T, dir string) string {
	t.Helper()
	var got []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != dir {
			rel, _ := filepath.Rel(dir, p)
			got = append(got, rel)
		}
		return nil
	})
	return strings.Join(got, " ")
}

// One git dir, two workspaces: the second supervisor refuses, naming the
// first; once the first workspace is gone, the refusal says so and how to
// move the history, instead of git's "fatal: Invalid path".
func TestRepoGitDirKeepsItsWorkspace(t *testing.T) {
	ctx := context.Background()
	r, ws := newTestRepo(t)
	writeFile(t, filepath.Join(ws, "src", "a.txt"), "a\n")
	if _, _, err := r.InitialCommit(ctx, testSup); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other")
	r2 := NewRepo(r.git, other, r.gitDir, r.watch, r.ignore, r.log)
	err := r2.Ensure(ctx)
	if err == nil || !strings.Contains(err.Error(), "holds the history of another workspace, "+ws) {
		t.Fatalf("a second workspace on one git_dir: %v", err)
	}
	if _, err := os.Stat(other); !os.IsNotExist(err) {
		t.Errorf("the refused workspace was made: %v", err)
	}
	if err := os.RemoveAll(ws); err != nil {
		t.Fatal(err)
	}
	err = r2.Ensure(ctx)
	if err == nil || !strings.Contains(err.Error(), "which no longer exists") || strings.Contains(err.Error(), "Invalid path") {
		t.Fatalf("a git_dir whose workspace is gone: %v", err)
	}
	// The remedy the message names works.
	if err := r.git.Run(ctx, gitCmdConfig(r.gitDir, other)); err != nil {
		t.Fatal(err)
	}
	if err := r2.Ensure(ctx); err != nil {
		t.Errorf("after recording the move: %v", err)
	}
}

// A first commit of files the supervisor has no history of (the git dir
// is new, and init did not seed them) is said loudly, on /status and to
// the webhook, and does not become good before `supervisor ack`, however
// healthy; the wait survives a restart.
func TestSupervisorWaitsForAckOfAdoptedFiles(t *testing.T) {
	rcv := newReceiver(t, 0)
	unseeded := func(s *Supervisor) { os.Remove(filepath.Join(s.cfg.GitDir, seededFile)) }
	r := startSupervisorWith(t, fmt.Sprintf("notify_url = %q\n", rcv.srv.URL)+fmt.Sprintf(webService, "/nonexistent"), Options{}, unseeded)
	head := r.s.Status().Head
	if st := r.s.Status(); st.AwaitingAck != head || head == "" {
		t.Fatalf("awaiting_ack %q, head %q", st.AwaitingAck, head)
	}
	if !strings.Contains(r.log.String(), "HISTORY MISSING") {
		t.Error("the adoption was not said loudly")
	}
	waitFor(t, "history_missing notification", 5*time.Second, func() bool { _, ok := rcv.find(EventHistoryMissing); return ok })
	waitFor(t, "healthy", 5*time.Second, func() bool { return r.healthz(t) == 200 })
	// good_after is 1.5s: three times that, healthy, and still not good.
	deadline := time.Now().Add(4500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if g := r.s.Status().Good; g != "" {
			t.Fatalf("the adopted commit became good (%s) without an acknowledgement", g)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if p, err := loadState(r.s.cfg.GitDir); err != nil || p.AwaitingAck != head {
		t.Errorf("persisted %+v %v", p, err)
	}
	got, err := Ack(r.s.cfg)
	if err != nil || got != head {
		t.Fatalf("Ack = %q %v", got, err)
	}
	waitFor(t, "good after the acknowledgement", 5*time.Second, func() bool { return r.s.Status().Good == head })
	if st := r.s.Status(); st.AwaitingAck != "" {
		t.Errorf("awaiting_ack %q after the acknowledgement", st.AwaitingAck)
	}
	if got, err := Ack(r.s.cfg); got != "" || err != nil {
		t.Errorf("a second Ack = %q %v, want nothing to acknowledge", got, err)
	}
}

// The health endpoints stay answered, and an edit is still committed,
// while 1,200 connections are held on health_addr with the supervisor's
// descriptors limited to 1,024: the listener holds a bounded number of
// them, and health_socket keeps its own.
func TestSupervisorHealthPortCannotBeStarved(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	saved := lim
	lim.Cur = 1024
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Setrlimit(unix.RLIMIT_NOFILE, &saved) })
	sock := filepath.Join(t.TempDir(), "health.sock")
	r := startSupervisor(t, fmt.Sprintf("health_socket = %q\n", sock)+fmt.Sprintf(webService, "/nonexistent"))
	waitFor(t, "first good commit", 5*time.Second, func() bool { return r.s.Status().Good != "" })
	head := r.s.Status().Head

	// The connections come from another process, as the agent's would.
	holder := exec.Command(os.Args[0], "-test.run=^$")
	holder.Env = append(os.Environ(), holdEnv+"="+r.addr+",1200")
	stdin, _ := holder.StdinPipe()
	stdout, _ := holder.StdoutPipe()
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); holder.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "held ") {
		t.Fatalf("holder: %q %v", line, err)
	}

	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	for range 3 {
		resp, err := client.Get("http://supervisor/healthz")
		if err != nil {
			t.Fatalf("health_socket while health_addr is flooded: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("/healthz on health_socket: %s", resp.Status)
		}
	}
	writeFile(t, filepath.Join(r.ws, "src", "web", "edit.txt"), "made while flooded\n")
	waitFor(t, "the edit committed while flooded", 10*time.Second, func() bool { st := r.s.Status(); return st.Head != head && st.Unrecorded == "" })
	if n := openFds(t); n > 512 {
		t.Errorf("%d descriptors open in the supervisor's process while flooded", n)
	}
}

// holdEnv makes the test binary hold connections: "addr,count".
const holdEnv = "BUSHOST_TEST_HOLD_CONNS"

// holdConns opens count connections to addr (those the server does not
// accept wait in its backlog), says "held N", and keeps them until stdin
// closes.
func holdConns(spec string) {
	addr, n, _ := strings.Cut(spec, ",")
	count, _ := strconv.Atoi(n)
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	var conns []net.Conn
	for range count {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	fmt.Printf("held %d\n", len(conns))
	bufio.NewReader(os.Stdin).ReadString('\n')
}

// A lone SIGTERM to the pid /status gives stops the service: the shim
// passes it to the command.
func TestSupervisorStatusPidStopsOnSigterm(t *testing.T) {
	r := startSupervisor(t, fmt.Sprintf(webService, "/nonexistent"))
	waitFor(t, "running", 5*time.Second, func() bool { return r.service("web").PID != 0 })
	pid := r.service("web").PID
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the service's exit", 5*time.Second, func() bool { return len(r.service("web").RecentExits) > 0 })
	if ex := r.service("web").RecentExits[0]; ex.Code != 128+int(syscall.SIGTERM) {
		t.Errorf("exit %+v, want the command's SIGTERM", ex)
	}
	waitFor(t, "the old group gone", 5*time.Second, func() bool { return len(groupMembers(pid)) == 0 })
}

// As PID 1 (here: a subreaper, which orphans reach the same way), init
// reaps: 200 orphans of its child leave no zombie behind, and it exits
// with its child's status.
func TestReaperLeavesNoZombie(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), reapEnv+"=1")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stdout)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "orphaned") {
		t.Fatalf("reaper: %q %v", line, err)
	}
	reaper := cmd.Process.Pid
	// The orphans sleep 0.2s; the child waits until it is told to go.
	waitFor(t, "no zombie under the reaper", 10*time.Second, func() bool { return len(childrenOf(reaper, "Z")) == 0 && len(childrenOf(reaper, "")) == 1 })
	syscall.Kill(reaper, syscall.SIGTERM)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("reaper exit %v, want the child's 7", err)
	}
}

// reapEnv makes the test binary a subreaper running reapChild.
const reapEnv = "BUSHOST_TEST_REAPER"

func runReaper() int {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// The child makes 200 orphans, says so, then exits 7 on SIGTERM
	// (which the reaper forwards).
	script := `(for i in $(seq 200); do sleep 0.2 & done); echo orphaned; trap 'exit 7' TERM; while :; do sleep 0.05; done`
	code, err := reapChild("/bin/bash", []string{"bash", "-c", script})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}

// childrenOf lists the children of pid in state (any state for "").
func childrenOf(pid int, state string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ppid, _, ok := procStat(p)
		if ok && ppid == pid && (state == "" || st == state) {
			out = append(out, p)
		}
	}
	return out
}

// gitCmdConfig records workspace as gitDir's work tree, as the refusal
// tells an operator to.
func gitCmdConfig(gitDir, workspace string) gitcmd.Cmd {
	return gitcmd.Cmd{Dir: "/", Sub: "config", Flags: []string{"--file=" + filepath.Join(gitDir, "config")}, Args: []string{"core.worktree", workspace}}
}

// Edits made while the supervisor was stopped are committed at its start,
// and each service starts once: none is started twice, or restarted for
// an edit older than itself.
func TestSupervisorBootCommitsEditsStartsOnce(t *testing.T) {
	r := startSupervisor(t, fmt.Sprintf(webService, "/nonexistent"))
	waitFor(t, "running", 5*time.Second, func() bool { return r.service("web").PID != 0 })
	head, cfg := r.s.Status().Head, r.s.cfg
	r.stop()
	writeFile(t, filepath.Join(r.ws, "src", "web", "while-stopped.txt"), "edit\n")

	log := &syncBuffer{}
	ready := make(chan string, 1)
	s, err := New(cfg, Options{Shim: []string{os.Args[0]}, Log: log, Ready: func(a string) { ready <- a }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	<-ready
	st := s.Status()
	if st.Head == head || st.Unrecorded != "" {
		t.Errorf("the edit made while stopped: head %s (was %s), unrecorded %q", st.Head, head, st.Unrecorded)
	}
	waitFor(t, "web running", 5*time.Second, func() bool { return s.Status().Services[0].PID != 0 })
	if svc := s.Status().Services[0]; svc.Restarts != 0 {
		t.Errorf("web started %d times more at the start, want once:\n%s", svc.Restarts, log.String())
	}
}

// With no notify_url, or the example's placeholder, the start says loudly
// that nobody hears of a revert; with a real one it says nothing of it.
func TestSupervisorSaysWhenNobodyHears(t *testing.T) {
	for _, tc := range []struct{ notify, want string }{
		{"", "NO WEBHOOK: notify_url is not set"},
		{`notify_url = "https://replace-me.invalid/bushost-webhook"` + "\n", "NO WEBHOOK: notify_url is a placeholder"},
		{`notify_url = "http://127.0.0.1:9/hook"` + "\n", ""},
	} {
		r := startSupervisor(t, tc.notify+fmt.Sprintf(webService, "/nonexistent"))
		log := r.log.String()
		if tc.want != "" && !strings.Contains(log, tc.want) || tc.want == "" && strings.Contains(log, "NO WEBHOOK") {
			t.Errorf("notify %q: log\n%s\nwant %q", tc.notify, log, tc.want)
		}
		r.stop()
	}
}

// The loop holds the supervisor's lock for the length of each git command,
// and the agent can make one last the whole gitTimeout: a file grown to a
// sparse terabyte between the walk that bounds sizes and git's read of it,
// or a gigabyte of files touched at once. The health endpoints answer
// meanwhile (a container's health check gives up after 3 s), with the
// state as of before the command; /metrics too, or scrapes held on
// health_addr's 64 connections would starve it. The test holds the lock as such a
// command would: a real one's length is not something a test can wait for.
func TestSupervisorHealthAnswersWhileGitRuns(t *testing.T) {
	r := startSupervisor(t, fmt.Sprintf(webService, "/nonexistent"))
	waitFor(t, "healthy", 5*time.Second, func() bool { return r.healthz(t) == 200 })
	// A scrape before, as Prometheus makes them all the time.
	if resp, err := http.Get("http://" + r.addr + "/metrics"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}

	r.s.mu.Lock()
	locked := true
	defer func() {
		if locked {
			r.s.mu.Unlock()
		}
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	for _, p := range []string{"/healthz", "/status", "/metrics"} {
		resp, err := client.Get("http://" + r.addr + p)
		if err != nil {
			t.Fatalf("%s while the loop runs git: %v", p, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s while the loop runs git: %s", p, resp.Status)
		}
	}
	r.s.mu.Unlock()
	locked = false
	if st := r.s.Status(); st.State != "ok" {
		t.Errorf("state %q once the loop is free", st.State)
	}
}

// A directory's names cost the agent a directory entry each (a hard link
// makes one without an inode); a walk that listed them all before going
// on held them all in memory, in init (root, at every boot) as in the
// supervisor: three million long names are more than a container's
// gigabyte, and the boot died every time. The walk reads a directory a
// bounded batch at a time: in the middle of a directory of 100,000 names
// of 240 bytes (24 MB of names), it holds a small part of them.
func TestWalkTreeMemoryFlatInAWideDirectory(t *testing.T) {
	const n = 100000
	dir := t.TempDir()
	wide := filepath.Join(dir, "wide")
	// Two files, each linked under half the names (ext4 allows 65,000
	// links to one inode).
	writeFile(t, filepath.Join(wide, "f0"), "x")
	writeFile(t, filepath.Join(wide, "f1"), "x")
	wfd := unixOpen(t, wide)
	long := strings.Repeat("w", 234)
	for i := range n {
		if err := unix.Linkat(wfd, fmt.Sprintf("f%d", i%2), wfd, fmt.Sprintf("%s%06d", long, i), 0); err != nil {
			t.Fatal(err)
		}
	}
	root := unixOpen(t, dir)
	var before, during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	seen := 0
	err := walkTree(root, walkFuncs{visit: func(_ int, _, _ string, _ *unix.Stat_t, _ int) (bool, error) {
		if seen++; seen == n/2 {
			runtime.GC()
			runtime.ReadMemStats(&during)
		}
		return true, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if seen != n+3 {
		t.Fatalf("the walk saw %d entries, want %d", seen, n+3)
	}
	if grew := int64(during.HeapAlloc) - int64(before.HeapAlloc); grew > 4<<20 {
		t.Errorf("half way through the directory the walk holds %d MB more heap, want under 4 MB", grew>>20)
	}
	if err := removeAllAt(root, "wide", "wide"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(wide); !os.IsNotExist(err) {
		t.Errorf("the wide directory survived removeAllAt: %v", err)
	}
}
