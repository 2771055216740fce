package integration

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// pgDSN returns a DSN for a fresh schema of the test PostgreSQL server
// ($BUSHOST_TEST_PG_DSN), dropped at the end of the test; it skips, loudly,
// when there is no server.
func pgDSN(t *testing.T) string {
	t.Helper()
	base := os.Getenv("BUSHOST_TEST_PG_DSN")
	if base == "" {
		t.Skip("!!! BUSHOST_TEST_PG_DSN is not set: the PostgreSQL half is SKIPPED (make test starts a server with scripts/pg.sh) !!!")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect %s: %v", base, err)
	}
	defer conn.Close(ctx)
	schema := "it_" + randSuffix()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), base)
		if err == nil {
			c.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			c.Close(context.Background())
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Two bushostd, each with its own home and repositories, share one
// PostgreSQL broker: a grant made on one works on the other, events agree,
// and the close gate sees pushes and verdicts made through either.
func TestTwoHostsShareOnePostgresBroker(t *testing.T) {
	dsn := pgDSN(t)
	a := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	b := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	// Each host keeps its own repository of the project.
	a.AddProject(t, "acme", "web")
	// B's repository is seeded from A's root so both start from one main.
	rootA := filepath.Join(filepath.Dir(a.Home), "root-acme-web")
	b.Must(t, "project", "add", "--business", "acme", "--project", "web", "--root", rootA)
	mainA := testGit(t, filepath.Join(a.Home, "repos/acme/web.git"), "rev-parse", "refs/heads/main")
	mainB := testGit(t, filepath.Join(b.Home, "repos/acme/web.git"), "rev-parse", "refs/heads/main")
	if mainA != mainB {
		t.Fatalf("main differs: %s vs %s", mainA, mainB)
	}

	// Host A adds the task and grants; the tokens work against host B.
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := a.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	closer := a.Grant(t, "acme", "web", "t1", "closer", "task.close")

	work := filepath.Join(baseDir(t), "work")
	b.Must(t, "--token-file", worker, "fetch-main", "--repo", work)
	os.WriteFile(filepath.Join(work, "f.txt"), []byte("from b\n"), 0o644)
	testGit(t, work, "add", "f.txt")
	testGit(t, work, "commit", "-q", "-m", "work on b")
	commit := b.Must(t, "--token-file", worker, "push-working", "--repo", work)

	// A sees B's push in the shared log.
	events := a.Must(t, "events", "--json", "--task", "t1")
	if !strings.Contains(events, commit) || !strings.Contains(events, "action.allowed") {
		t.Fatalf("host A does not see host B's push %s:\n%s", commit, events)
	}
	// The gate, asked through A, refuses without an approve given via B.
	if _, errs, code := a.Run(t, nil, "--token-file", closer, "task", "close"); code == 0 || !strings.Contains(errs, "FailedPrecondition") {
		t.Fatalf("close without approve: exit %d: %s", code, errs)
	}
	req := b.Must(t, "--token-file", worker, "review", "request")
	req = strings.Fields(req)[0]
	b.Must(t, "--token-file", reviewer, "review", "verdict", "--request", req, "--approve")
	a.Must(t, "--token-file", closer, "task", "close")
	// A closed task refuses pushes on either host.
	os.WriteFile(filepath.Join(work, "g.txt"), []byte("late\n"), 0o644)
	testGit(t, work, "add", "g.txt")
	testGit(t, work, "commit", "-q", "-m", "late")
	for _, h := range []*Host{a, b} {
		if _, errs, code := h.Run(t, nil, "--token-file", worker, "push-working", "--repo", work); code == 0 || !strings.Contains(errs, "closed") {
			t.Fatalf("push to a closed task accepted or unclear: exit %d: %s", code, errs)
		}
	}
	for _, h := range []*Host{a, b} {
		h.Must(t, "log", "verify")
	}
}
