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
	// The project lives on A (repositories shard by host; the broker is
	// shared): B refuses to add it, and serves none of its git calls.
	a.AddProject(t, "acme", "web")
	aID := readHostID(t, a)
	root := filepath.Join(filepath.Dir(a.Home), "root-acme-web")
	out, errs, code := b.Run(t, nil, "--json", "project", "add", "--business", "acme", "--project", "web", "--root", root)
	if code != 5 || !strings.Contains(errs, `"reason":"PROJECT_ON_OTHER_HOST"`) || !strings.Contains(errs, aID) {
		t.Fatalf("project add on B: exit %d, want 5 PROJECT_ON_OTHER_HOST naming %q\nstdout: %s\nstderr: %s", code, aID, out, errs)
	}
	if _, err := os.Stat(filepath.Join(b.Home, "repos", "acme")); err == nil {
		t.Fatalf("B made a repository for a project placed on A")
	}
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := a.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	lead := a.Grant(t, "acme", "web", "t1", "lead", "task.close")

	// Push through A, ask for review and get the verdict through B.
	work := filepath.Join(filepath.Dir(a.Home), "work")
	if _, errs := runAs(t, b, worker, 5, "fetch-main", "--repo", work); !strings.Contains(errs, aID) {
		t.Fatalf("fetch-main through B does not name A: %s", errs)
	}
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
	if _, errs := runAs(t, a, worker, 1, "push-working", "--repo", work); !strings.Contains(errs, "closed") {
		t.Fatalf("push through A after close: %s", errs)
	}
	if _, errs := runAs(t, b, worker, 5, "push-working", "--repo", work); !strings.Contains(errs, aID) {
		t.Fatalf("push through B: %s", errs)
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

// readHostID is the id h made at its first start (HOME/host-id).
func readHostID(t *testing.T, h *Host) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(h.Home, "host-id"))
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(string(raw))
	if id == "" {
		t.Fatal("empty host-id")
	}
	return id
}
