package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/pgtest"
)

// Two bushostd with their own homes and repositories share one PostgreSQL
// broker: a grant issued through one works on the other, both see one log,
// and the close gate decided through one holds for pushes through the
// other.
func TestBrokerTwoHostsSharePostgres(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "it", "two bushostd sharing PostgreSQL")
	a := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	b := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	if _, err := os.Stat(filepath.Join(a.Home, "broker.db")); err == nil {
		t.Fatal("bushostd made broker.db although --broker-dsn names PostgreSQL")
	}
	// The project lives on both hosts (repositories shard by host; the
	// broker is shared).
	a.AddProject(t, "acme", "web")
	b.AddProject(t, "acme", "web")
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := a.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	lead := a.Grant(t, "acme", "web", "t1", "lead", "task.close")

	// Push through A, ask for review and get the verdict through B.
	work := filepath.Join(filepath.Dir(a.Home), "work")
	runAs(t, a, worker, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "work")
	head := testGit(t, work, "rev-parse", "HEAD")
	runAs(t, a, worker, 0, "push-working", "--repo", work)
	id, _ := runAs(t, b, worker, 0, "review", "request")
	if _, errs := runAs(t, b, lead, 1, "task", "close"); !strings.Contains(errs, "no verdict yet") {
		t.Fatalf("close through B before the verdict: %s", errs)
	}
	runAs(t, b, reviewer, 0, "review", "verdict", "--request", id, "--approve", "--commit", head)
	runAs(t, a, lead, 0, "task", "close")

	// Closed for both.
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "late")
	for _, h := range []*Host{a, b} {
		if _, errs := runAs(t, h, worker, 1, "push-working", "--repo", work); !strings.Contains(errs, "closed") {
			t.Fatalf("push through %s after close: %s", h.Home, errs)
		}
	}

	// One log, seen the same from both, verified by both.
	ea, eb := brokerEvents(t, a), brokerEvents(t, b)
	if len(ea) == 0 || len(ea) != len(eb) || ea[len(ea)-1].Hash != eb[len(eb)-1].Hash {
		t.Fatalf("the hosts disagree on the log: %d vs %d events", len(ea), len(eb))
	}
	var pushes int
	for _, e := range ea {
		if e.Type == "action.allowed" {
			pushes++
			if !strings.Contains(string(e.Data), head) {
				t.Fatalf("push event: %s", e.Data)
			}
		}
	}
	if pushes != 1 {
		t.Fatalf("%d push events, want 1", pushes)
	}
	for _, h := range []*Host{a, b} {
		if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
			t.Fatalf("log verify: %s", out)
		}
	}
}

// Two hosts sharing the store can never both extend the same commit of a
// task: the log, not either repository, is the arbiter of the task's
// history (issue 19). The push through B that forks the task is refused
// with PUSH_CONFLICT, naming the recorded push, and leaves nothing behind.
func TestTwoHostsCannotForkATask(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "fork", "two bushostd forking one task")
	a := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	b := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	a.AddProject(t, "acme", "web")
	b.AddProject(t, "acme", "web")
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working")

	base := filepath.Dir(a.Home)
	w1, w2 := filepath.Join(base, "w1"), filepath.Join(base, "w2")
	runAs(t, a, worker, 0, "fetch-main", "--repo", w1)
	testGit(t, w1, "commit", "-q", "--allow-empty", "-m", "X")
	x := testGit(t, w1, "rev-parse", "HEAD")
	runAs(t, a, worker, 0, "push-working", "--repo", w1)

	runAs(t, b, worker, 0, "fetch-main", "--repo", w2)
	testGit(t, w2, "commit", "-q", "--allow-empty", "-m", "Y")
	before := len(brokerEvents(t, b))
	out, errs, code := b.Run(t, nil, "--json", "--token-file", worker, "push-working", "--repo", w2)
	if code != 5 || !strings.Contains(errs, `"reason":"PUSH_CONFLICT"`) || !strings.Contains(errs, x) {
		t.Fatalf("forking push through B: exit %d, want 5 PUSH_CONFLICT naming %s\nstdout: %s\nstderr: %s", code, x, out, errs)
	}
	evs := brokerEvents(t, b)
	if len(evs) != before {
		t.Fatalf("the refused push appended %d events", len(evs)-before)
	}
	var chain []string
	for _, e := range evs {
		if e.Type == "action.allowed" && e.Task == "t1" {
			chain = append(chain, string(e.Data))
		}
	}
	if len(chain) != 1 || !strings.Contains(chain[0], x) {
		t.Fatalf("pushes of t1 in the log: %v", chain)
	}
	// Nothing of the refused push is left on B: no work ref in any of its
	// repositories, no quarantine.
	repos, _ := filepath.Glob(filepath.Join(b.Home, "repos", "acme", "web*"))
	more, _ := filepath.Glob(filepath.Join(b.Home, "repos", "acme", "web", "*", "*.git"))
	for _, r := range append(repos, more...) {
		if !strings.HasSuffix(r, ".git") {
			continue
		}
		if refs := testGit(t, r, "for-each-ref", "refs/work/"); refs != "" {
			t.Fatalf("B's %s holds a work ref after the refused push: %s", r, refs)
		}
	}
	for _, h := range []*Host{a, b} {
		if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
			t.Fatalf("log verify: %s", out)
		}
	}
}
