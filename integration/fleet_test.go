package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/pgtest"
	"github.com/bushost/bushost/internal/testenv"
)

// Issue 32: no host can stop the fleet. Hosts share one PostgreSQL; a
// host frozen or cut off, a stopped database, a killed export must cost
// the others nothing, and each fault comes back named as one.

// commitIn makes an empty commit in the repository work and returns it.
func commitIn(t *testing.T, work, msg string) string {
	t.Helper()
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", msg)
	return testGit(t, work, "rev-parse", "HEAD")
}

// workRef is refs/work/<task> in h's repository of business/project/task
// ("" when the task has no repository or no such ref).
func workRef(h *Host, business, project, task string) string {
	out, _ := exec.Command("git", "--git-dir", h.TaskRepo(business, project, task), "rev-parse", "--verify", "--quiet", "refs/work/"+task).Output()
	return strings.TrimSpace(string(out))
}

// errReason is the reason of a --json error on stderr.
func errReason(stderr string) string {
	var e struct {
		Error struct{ Reason string } `json:"error"`
	}
	json.Unmarshal([]byte(strings.TrimSpace(stderr)), &e)
	return e.Error.Reason
}

// Host b is frozen (SIGSTOP, as a paused VM or a partition) inside the
// write transaction of a push's record, holding the fleet's write lock.
// Host a's push to its own project and its log verify each complete within
// 20 s (the client's own deadline): the server ends b's idle transaction
// (--broker-idle-in-transaction-timeout) and verify reads a snapshot. Host
// b, continued, recovers without a restart: its interrupted push is either
// recorded once with its ref moved, or refused with nothing kept; pushed
// again it lands once.
func TestFrozenHostCannotHoldTheFleet(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "frozen", "a host frozen holding the write lock of a shared PostgreSQL")
	held := filepath.Join(baseDir(t), "held")
	keys := sharedLogKeys(t, 2)
	a := startHostWith(t, hostOpts{Args: append([]string{"--broker-dsn", dsn}, keys[0]...)})
	b := startHostWith(t, hostOpts{Args: append([]string{"--broker-dsn", dsn}, keys[1]...), Daemon: failpointDaemon(t),
		Env: []string{"BUSHOST_FAILPOINT=record-push:hold", "BUSHOST_FAILPOINT_FILE=" + held}})
	a.AddProject(t, "acme", "web")
	b.AddProject(t, "acme", "api")
	wa := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	wb := b.Grant(t, "acme", "api", "t1", "worker", "git.push.working")
	base := filepath.Dir(a.Home)
	workA, workB := filepath.Join(base, "work-a"), filepath.Join(base, "work-b")
	runAs(t, a, wa, 0, "fetch-main", "--repo", workA)
	runAs(t, b, wb, 0, "fetch-main", "--repo", workB)
	headA, headB := commitIn(t, workA, "on a"), commitIn(t, workB, "on b")

	type result struct {
		out, errs string
		code      int
	}
	done := make(chan result, 1)
	go func() {
		out, errs, code := b.Run(t, nil, "--json", "--timeout", "3m", "--token-file", wb, "push-working", "--repo", workB)
		done <- result{out, errs, code}
	}()
	testenv.WaitFor(t, 2*time.Minute, "host b's push to hold the write lock", func() bool {
		_, err := os.Stat(held)
		return err == nil
	})
	if err := syscall.Kill(b.PID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := true
	thaw := func() {
		if frozen {
			frozen = false
			os.Remove(held)
			syscall.Kill(b.PID(), syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)

	if out, _ := runAs(t, a, wa, 0, "--timeout", "20s", "push-working", "--repo", workA); out != headA {
		t.Fatalf("push to a while b is frozen printed %q, want %s", out, headA)
	}
	if out := a.Must(t, "--timeout", "20s", "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify (host) on a while b is frozen: %s", out)
	}

	thaw()
	r := <-done
	t.Logf("b's interrupted push: exit %d %s %s", r.code, strings.TrimSpace(r.out), strings.TrimSpace(r.errs))
	switch r.code {
	case 0:
		if n := pushesOf(t, a, headB); n != 1 || workRef(b, "acme", "api", "t1") != headB {
			t.Fatalf("b's push answered done: %d records, ref %q; want one record and the ref at %s", n, workRef(b, "acme", "api", "t1"), headB)
		}
	case 3:
		if why := errReason(r.errs); why != "COMMIT_UNKNOWN" && why != "STORE_UNAVAILABLE" {
			t.Fatalf("b's push refused with %q, want an Unavailable reason", why)
		}
		if n := pushesOf(t, a, headB); n != 0 || workRef(b, "acme", "api", "t1") == headB {
			t.Fatalf("b's push refused, yet %d records and ref %q", n, workRef(b, "acme", "api", "t1"))
		}
		if found(filepath.Join(b.Home, "repos"), bundlePrefix) {
			t.Fatal("b's refused push left its quarantine")
		}
	default:
		t.Fatalf("b's interrupted push: exit %d, want 0 (done once) or 3 (refused)", r.code)
	}

	// Continued, b serves again without a restart: the push lands once.
	if out, _ := runAs(t, b, wb, 0, "push-working", "--repo", workB); out != headB {
		t.Fatalf("push to b after it was continued printed %q, want %s", out, headB)
	}
	if n := pushesOf(t, b, headB); n != 1 || workRef(b, "acme", "api", "t1") != headB {
		t.Fatalf("after b's retry: %d records of %s, ref %q", n, headB, workRef(b, "acme", "api", "t1"))
	}
	for _, h := range []*Host{a, b} {
		if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
			t.Fatalf("log verify: %s", out)
		}
	}
	b.FsckProject(t, "acme", "api")
}

// pgCluster is a PostgreSQL cluster of a test's own (scripts/pg.sh), which
// the test may stop and start again.
type pgCluster struct {
	dir, dsn string
}

func startPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		testenv.Missing(t, "PostgreSQL", "no server installed (/usr/lib/postgresql/*/bin): a stopped store untested")
	}
	testenv.NeedRoot(t, "scripts/pg.sh runs the cluster as the postgres user")
	dir, err := os.MkdirTemp("/var/tmp", "bushost-pg-stop-")
	if err != nil {
		t.Fatal(err)
	}
	c := &pgCluster{dir: dir}
	t.Cleanup(func() {
		c.run(t, "stop")
		os.RemoveAll(dir)
	})
	c.dsn = c.run(t, "start")
	return c
}

// run runs scripts/pg.sh cmd on the cluster and returns what it printed.
func (c *pgCluster) run(t *testing.T, cmd string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(repoRoot, "scripts", "pg.sh"), cmd, c.dir).CombinedOutput()
	if err != nil {
		t.Fatalf("pg.sh %s: %v\n%s", cmd, err, out)
	}
	return strings.TrimSpace(string(out))
}

// restart starts the stopped cluster again, keeping its data (pg.sh start
// would make a new one).
func (c *pgCluster) restart(t *testing.T) {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	pgctl := bins[len(bins)-1]
	cmd := fmt.Sprintf("%s -D %s/data -o \"-k %s -c listen_addresses= -c max_connections=300\" -l %s/log -w start", pgctl, c.dir, c.dir, c.dir)
	if out, err := exec.Command("su", "postgres", "-s", "/bin/sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("restart the cluster: %v\n%s", err, out)
	}
}

// terminateBackends ends every client session but its own, as an
// operator's pg_terminate_backend or a failover would.
func (c *pgCluster) terminateBackends(t *testing.T) {
	t.Helper()
	sql := `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	if len(bins) == 0 {
		bins = []string{"psql"}
	}
	if out, err := exec.Command("su", "postgres", "-s", "/bin/sh", "-c", fmt.Sprintf("%s -h %s -U postgres -Atc %q postgres", bins[len(bins)-1], c.dir, sql)).CombinedOutput(); err != nil {
		t.Fatalf("terminate backends: %v\n%s", err, out)
	}
}

// With its PostgreSQL stopped, every call to a host exits 3 with an
// Unavailable reason and a retry hint, not Internal (exit 8); with its
// sessions terminated, a call fails the same way or succeeds; once the
// database is back, calls succeed without a restart of bushostd.
func TestStoreFaultsAreUnavailable(t *testing.T) {
	c := startPGCluster(t)
	h := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", c.dsn}})
	h.AddProject(t, "acme", "web")
	w := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "event.record", "review.request")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	runAs(t, h, w, 0, "fetch-main", "--repo", work)
	head := commitIn(t, work, "before the stop")
	runAs(t, h, w, 0, "push-working", "--repo", work)
	next := commitIn(t, work, "while it is stopped")

	calls := [][]string{
		{"push-working", "--repo", work},
		{"fetch-main", "--repo", work},
		{"event", "record", "--type", "note"},
		{"review", "request"},
		{"events"},
		{"task", "show"},
	}
	hostCalls := [][]string{
		{"task", "add", "--business", "acme", "--project", "web", "--task", "t2"},
		{"grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "r", "--cap", "event.record"},
		{"task", "list"},
		{"project", "list"},
		{"grant", "list"},
		{"log", "verify"},
		{"log", "head"},
		{"events"},
	}
	each := func(check func(args []string, out, errs string, code int)) {
		for _, args := range calls {
			out, errs, code := h.Run(t, nil, append([]string{"--json", "--token-file", w}, args...)...)
			check(args, out, errs, code)
		}
		for _, args := range hostCalls {
			out, errs, code := h.Run(t, nil, append([]string{"--json"}, args...)...)
			check(args, out, errs, code)
		}
	}
	unavailable := func(args []string, errs string, code int) {
		t.Helper()
		why := errReason(errs)
		if code != 3 || (why != "STORE_UNAVAILABLE" && why != "COMMIT_UNKNOWN") || !strings.Contains(errs, "retry") {
			t.Fatalf("bushost %s: exit %d %s; want exit 3 with an Unavailable reason and a retry hint", strings.Join(args, " "), code, errs)
		}
	}

	c.run(t, "stop")
	each(func(args []string, out, errs string, code int) { unavailable(args, errs, code) })
	if workRef(h, "acme", "web", "t1") != head || found(filepath.Join(h.Home, "repos"), bundlePrefix) {
		t.Fatalf("a push refused while the store was stopped left something: ref %s", workRef(h, "acme", "web", "t1"))
	}

	c.restart(t)
	testenv.WaitFor(t, time.Minute, "calls to succeed once the database is back", func() bool {
		_, _, code := h.Run(t, nil, "log", "head")
		return code == 0
	})
	c.terminateBackends(t)
	each(func(args []string, out, errs string, code int) {
		if code != 0 {
			unavailable(args, errs, code)
		}
	})
	// The push went in then, or goes in now: once.
	runAs(t, h, w, 0, "push-working", "--repo", work)
	if n := pushesOf(t, h, next); n != 1 || workRef(h, "acme", "web", "t1") != next {
		t.Fatalf("%d records of %s, ref %s", n, next, workRef(h, "acme", "web", "t1"))
	}
	if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify: %s", out)
	}
}

// Three hosts share one PostgreSQL and one grant records events through
// all three at once: the grant's event quota holds in total, not per host.
func TestEventQuotaHoldsAcrossHosts(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "quota", "one grant's event quota across three hosts")
	const rate = 6
	args := []string{"--broker-dsn", dsn, "--event-rate", fmt.Sprint(rate)}
	hosts := startSharing(t, 3, args...)
	hosts[0].AddProject(t, "acme", "web")
	g := hosts[0].Grant(t, "acme", "web", "t1", "notes", "event.record")
	var mu sync.Mutex
	var wg sync.WaitGroup
	recorded, limited := 0, 0
	for _, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rate; i++ {
				_, errs, code := h.Run(t, nil, "--json", "--token-file", g, "event", "record", "--type", "note")
				mu.Lock()
				switch {
				case code == 0:
					recorded++
				case code == 7 && errReason(errs) == "EVENT_RATE_EXCEEDED":
					limited++
				default:
					t.Errorf("event record: exit %d %s", code, errs)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// A minute's quota, and at most the one event its refill adds in the
	// seconds the test ran.
	if recorded < rate || recorded > rate+1 || recorded+limited != 3*rate {
		t.Fatalf("%d events recorded and %d refused through three hosts; the grant's quota is %d a minute", recorded, limited, rate)
	}
	notes := 0
	for _, e := range brokerEvents(t, hosts[1]) {
		if e.Type == "note" {
			notes++
		}
	}
	if notes != recorded {
		t.Fatalf("%d notes in the log, %d answered recorded", notes, recorded)
	}
}

// bushostd is killed half-way through an export (after the manifest, before
// the bundles): the file is cut. At its next start the export is
// cancelled, logged, and the project takes pushes again with no manual
// step; nothing of the export is left.
func TestCutExportSettledAtStart(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "cutexport", "an export cut by a crash")
	h := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}, Daemon: failpointDaemon(t), Env: []string{"BUSHOST_FAILPOINT=export:sending"}})
	h.AddProject(t, "acme", "web")
	w := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	runAs(t, h, w, 0, "fetch-main", "--repo", work)
	commitIn(t, work, "before the export")
	runAs(t, h, w, 0, "push-working", "--repo", work)

	file := filepath.Join(filepath.Dir(h.Home), "web.tar")
	if out, errs, code := h.Run(t, nil, "project", "export", "--business", "acme", "--project", "web", "--to", file); code == 0 {
		t.Fatalf("the export was not cut: %s %s", out, errs)
	}
	h.Kill() // it killed itself: collect it
	spools := func() []string {
		m, _ := filepath.Glob(filepath.Join(h.Home, "repos", "acme", ".seeding-export-*"))
		return m
	}
	if len(spools()) != 1 {
		t.Fatalf("the cut export left %v, want its spool", spools())
	}

	h.Env = nil
	h.start(t)
	var list struct {
		Projects []struct {
			Project string
			Moving  bool
		}
	}
	if err := json.Unmarshal([]byte(h.Must(t, "project", "list", "--json")), &list); err != nil || len(list.Projects) != 1 || list.Projects[0].Moving {
		t.Fatalf("after the restart: %+v %v; want acme/web placed here, not moving", list, err)
	}
	head := commitIn(t, work, "after the restart")
	if out, _ := runAs(t, h, w, 0, "push-working", "--repo", work); out != head {
		t.Fatalf("push after the restart printed %q, want %s", out, head)
	}
	cancelled := 0
	for _, e := range brokerEvents(t, h) {
		if e.Type == "project.move_cancelled" {
			cancelled++
		}
	}
	logged, _ := os.ReadFile(h.Log)
	if cancelled != 1 || !strings.Contains(string(logged), "an export cut before its file was complete") {
		t.Fatalf("%d project.move_cancelled events; the log says: %s", cancelled, tail(string(logged), 2000))
	}
	if len(spools()) != 0 {
		t.Fatalf("left behind: %v", spools())
	}
	if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify: %s", out)
	}
}
