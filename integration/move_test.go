package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/pgtest"
	"github.com/bushost/bushost/internal/treesnap"
)

// A project moves between two bus hosts sharing one PostgreSQL broker
// through a file (issue 19): asked for on B, it is refused naming its
// owner A; exported on A, its pushes are refused with PROJECT_MOVING; a
// stale file (an event recorded after the export) and an altered one (a
// byte flipped in a bundle, or in the manifest) are refused by B's import
// with nothing left behind and the placement unchanged; the current file
// is imported on B, where every task's work (refs, fetch-work,
// fetch-review, main with what landed) and the log are intact, while A
// serves nothing of it; a second import of the file is refused; a
// cancelled export takes pushes again; and the project moves back to A,
// whose old copy is replaced, and A serves it after a restart.
func TestMoveProjectBetweenHosts(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "move", "moving a project between two hosts")
	hosts := startSharing(t, 2, "--broker-dsn", dsn)
	a, b := hosts[0], hosts[1]
	aID, bID := readHostID(t, a), readHostID(t, b)
	base := filepath.Dir(a.Home)
	root := a.AddProject(t, "acme", "web")

	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := a.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	w2 := a.Grant(t, "acme", "web", "t2", "worker", "git.push.working", "review.request")
	r2 := a.Grant(t, "acme", "web", "t2", "reviewer", "review.verdict")
	a.Must(t, "task", "add", "--business", "acme", "--project", "web", "--task", "t3")

	// Asked for on B: refused, naming A.
	_, errs, code := b.Run(t, nil, "--json", "project", "add", "--business", "acme", "--project", "web", "--root", root)
	if code != 5 || !strings.Contains(errs, `"reason":"PROJECT_ON_OTHER_HOST"`) || !strings.Contains(errs, aID) {
		t.Fatalf("project add on B: exit %d, want 5 PROJECT_ON_OTHER_HOST naming %q: %s", code, aID, errs)
	}
	work := filepath.Join(base, "work")
	if _, errs := runAs(t, b, worker, 5, "fetch-main", "--repo", work); !strings.Contains(errs, aID) {
		t.Fatalf("fetch-main through B does not name A: %s", errs)
	}

	// Work on A: t1 pushed twice and approved; t2 pushed, approved and
	// landed on main; t3 has no push.
	runAs(t, a, worker, 0, "fetch-main", "--repo", work)
	for _, msg := range []string{"one", "two"} {
		if err := os.WriteFile(filepath.Join(work, msg+".txt"), []byte(msg+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		testGit(t, work, "add", ".")
		testGit(t, work, "commit", "-q", "-m", msg)
		runAs(t, a, worker, 0, "push-working", "--repo", work)
	}
	head1 := testGit(t, work, "rev-parse", "HEAD")
	id, _ := runAs(t, a, worker, 0, "review", "request")
	runAs(t, b, reviewer, 0, "review", "verdict", "--request", id, "--approve", "--commit", head1)
	work2 := filepath.Join(base, "work2")
	runAs(t, a, w2, 0, "fetch-main", "--repo", work2)
	if err := os.WriteFile(filepath.Join(work2, "landed.txt"), []byte("landed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, work2, "add", ".")
	testGit(t, work2, "commit", "-q", "-m", "landed")
	head2 := testGit(t, work2, "rev-parse", "HEAD")
	runAs(t, a, w2, 0, "push-working", "--repo", work2)
	id2, _ := runAs(t, a, w2, 0, "review", "request")
	runAs(t, a, r2, 0, "review", "verdict", "--request", id2, "--approve", "--commit", head2)
	a.Must(t, "task", "land", "--business", "acme", "--project", "web", "--task", "t2")
	before := brokerEvents(t, a)

	// Export on A: the project moves, its pushes are refused.
	file1 := filepath.Join(base, "web-1.tar")
	ex := exportProject(t, a, file1)
	// Bundles: the pool and t1; t2's work is all on main (landed), and
	// t3 has no repository.
	if ex.Host != aID || ex.HeadSeq != before[len(before)-1].Seq+1 || ex.Tasks != 3 || ex.Bundles != 2 {
		t.Fatalf("export: %+v (log head before it: %d)", ex, before[len(before)-1].Seq)
	}
	if fi, err := os.Stat(file1); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("export file: %v %v", fi, err)
	}
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "during the move")
	if _, errs := runAs(t, a, worker, 3, "--json", "push-working", "--repo", work); !strings.Contains(errs, `"reason":"PROJECT_MOVING"`) {
		t.Fatalf("push while moving: %s", errs)
	}
	testGit(t, work, "reset", "-q", "--hard", "HEAD~1")
	if _, errs, code := a.Run(t, nil, "--json", "project", "sync", "--business", "acme", "--project", "web"); code != 3 || !strings.Contains(errs, "PROJECT_MOVING") {
		t.Fatalf("sync while moving: exit %d %s", code, errs)
	}
	for _, h := range []*Host{a, b} {
		if p := listedProject(t, h, "acme", "web"); p.Host != aID || !p.Moving {
			t.Fatalf("project list while moving: %+v", p)
		}
	}

	// A stale file: an event of the project after the export (a grant).
	a.Grant(t, "acme", "web", "t1", "late", "event.record")
	importRefused(t, b, file1, 5, "EXPORT_STALE", aID)

	// Export again; an altered copy of the new file is refused, whether
	// the byte flipped is in a bundle or in the manifest.
	file2 := filepath.Join(base, "web-2.tar")
	exportProject(t, a, file2)
	importRefused(t, b, file1, 5, "EXPORT_STALE", aID)
	raw, err := os.ReadFile(file2)
	if err != nil {
		t.Fatal(err)
	}
	for what, at := range map[string]int{
		"bundle":   bytes.Index(raw, []byte("# v2 git bundle\n")) + len("# v2 git bundle\n") + 3,
		"manifest": bytes.Index(raw, []byte(`"created": "`)) + len(`"created": "`) + 3,
	} {
		if at < 100 {
			t.Fatalf("no %s in the export", what)
		}
		bad := append([]byte(nil), raw...)
		bad[at] ^= 0x01
		alt := filepath.Join(base, "web-altered-"+what+".tar")
		if err := os.WriteFile(alt, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		importRefused(t, b, alt, 6, "EXPORT_ALTERED", aID)
	}

	// The import on B.
	if out := b.Must(t, "--json", "project", "import", "--from", file2); !strings.Contains(out, `"from":"`+aID+`"`) {
		t.Fatalf("import: %s", out)
	}
	if p := listedProject(t, b, "acme", "web"); p.Host != bID || p.Moving || !p.Here {
		t.Fatalf("project list on B after the import: %+v", p)
	}
	// A serves nothing of it.
	if _, errs := runAs(t, a, worker, 5, "fetch-work", "--repo", filepath.Join(base, "x")); !strings.Contains(errs, bID) {
		t.Fatalf("fetch-work through A after the move: %s", errs)
	}
	if _, errs, code := a.Run(t, nil, "project", "export", "--business", "acme", "--project", "web", "--to", filepath.Join(base, "no.tar")); code != 5 || !strings.Contains(errs, bID) {
		t.Fatalf("export on A after the move: exit %d %s", code, errs)
	}
	// Every task's work on B: t1's pushes (for its worker and reviewer),
	// t2's landing on main.
	check := filepath.Join(base, "check")
	runAs(t, b, worker, 0, "fetch-main", "--repo", check)
	if got := testGit(t, check, "rev-parse", "refs/remotes/bushost/main"); got != head2 {
		t.Fatalf("B's main is %s, want the landing %s", got, head2)
	}
	if got, _ := runAs(t, b, worker, 0, "fetch-work", "--repo", check); got != head1 {
		t.Fatalf("fetch-work on B: %s, want %s", got, head1)
	}
	if got, _ := runAs(t, b, reviewer, 0, "fetch-review", "--repo", filepath.Join(base, "review")); got != head1 {
		t.Fatalf("fetch-review on B: %s, want %s", got, head1)
	}
	b.FsckProject(t, "acme", "web")
	// The log: every event of before is there, unchanged, then the move.
	after := brokerEvents(t, b)
	for i, e := range before {
		if after[i].Seq != e.Seq || after[i].Hash != e.Hash {
			t.Fatalf("event %d changed across the move", e.Seq)
		}
	}
	last := after[len(after)-1]
	if last.Type != "project.moved" || !strings.Contains(string(last.Data), bID) {
		t.Fatalf("the log ends with %s %s, want project.moved to %s", last.Type, last.Data, bID)
	}
	// A second import of the same file: stale, and B's copy untouched.
	importRefused(t, b, file2, 5, "EXPORT_STALE", "")
	if got, _ := runAs(t, b, worker, 0, "fetch-work", "--repo", check); got != head1 {
		t.Fatalf("fetch-work on B after a refused second import: %s", got)
	}
	// Work goes on through B.
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "on B")
	head3 := testGit(t, work, "rev-parse", "HEAD")
	runAs(t, b, worker, 0, "push-working", "--repo", work)

	// A cancelled export: B takes pushes again, and its file is refused.
	file3 := filepath.Join(base, "web-3.tar")
	exportProject(t, b, file3)
	if out := b.Must(t, "project", "export", "--business", "acme", "--project", "web", "--cancel"); !strings.HasPrefix(out, "cancelled") {
		t.Fatalf("cancel: %s", out)
	}
	if out := b.Must(t, "project", "export", "--business", "acme", "--project", "web", "--cancel"); !strings.Contains(out, "not moving") {
		t.Fatalf("cancel again: %s", out)
	}
	importRefused(t, a, file3, 5, "EXPORT_STALE", "")
	if p := listedProject(t, a, "acme", "web"); p.Host != bID || p.Moving {
		t.Fatalf("after the cancel and a refused import: %+v", p)
	}
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "after the cancel")
	head4 := testGit(t, work, "rev-parse", "HEAD")
	runAs(t, b, worker, 0, "push-working", "--repo", work)

	// And back to A, whose old copy (without head3 and head4) is replaced.
	file4 := filepath.Join(base, "web-4.tar")
	exportProject(t, b, file4)
	a.Must(t, "project", "import", "--from", file4)
	if _, errs := runAs(t, b, worker, 5, "fetch-main", "--repo", filepath.Join(base, "y")); !strings.Contains(errs, aID) {
		t.Fatalf("fetch-main through B after the move back: %s", errs)
	}
	a.Restart(t)
	back := filepath.Join(base, "back")
	runAs(t, a, worker, 0, "fetch-main", "--repo", back)
	if got, _ := runAs(t, a, worker, 0, "fetch-work", "--repo", back); got != head4 {
		t.Fatalf("fetch-work on A after the move back: %s, want %s (head3 %s)", got, head4, head3)
	}
	a.FsckProject(t, "acme", "web")
	if found(filepath.Join(a.Home, "repos"), ".seeding-") || found(filepath.Join(b.Home, "repos"), ".seeding-") {
		t.Fatal("a move left a staging directory behind")
	}
	for _, h := range []*Host{a, b} {
		if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
			t.Fatalf("log verify: %s", out)
		}
	}
}

// exported is 'project export --json' as the tests read it.
type exported struct {
	Host    string `json:"host"`
	HeadSeq int64  `json:"head_seq"`
	Tasks   int    `json:"tasks"`
	Bundles int    `json:"bundles"`
}

func exportProject(t *testing.T, h *Host, file string) exported {
	t.Helper()
	out := h.Must(t, "--json", "project", "export", "--business", "acme", "--project", "web", "--to", file)
	var ex exported
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatalf("project export --json: %q: %v", out, err)
	}
	return ex
}

// listedProject is business/project in h's 'project list --json'.
func listedProject(t *testing.T, h *Host, business, project string) (p struct {
	Host   string `json:"host"`
	Moving bool   `json:"moving"`
	Here   bool   `json:"here"`
}) {
	t.Helper()
	var r struct {
		Projects []struct {
			Business, Project string
			Host              string `json:"host"`
			Moving            bool   `json:"moving"`
			Here              bool   `json:"here"`
		} `json:"projects"`
	}
	if err := json.Unmarshal([]byte(h.Must(t, "--json", "project", "list")), &r); err != nil {
		t.Fatal(err)
	}
	for _, x := range r.Projects {
		if x.Business == business && x.Project == project {
			p.Host, p.Moving, p.Here = x.Host, x.Moving, x.Here
			return p
		}
	}
	t.Fatalf("project list has no %s/%s", business, project)
	return p
}

// importRefused imports file on h, wants exit code and reason, and checks
// that nothing was left behind: h's repositories as they were (no
// acme/web where h never had it, no staging directory), and the project
// still placed on owner (when given) and moving.
func importRefused(t *testing.T, h *Host, file string, code int, reason, owner string) {
	t.Helper()
	repos := filepath.Join(h.Home, "repos")
	before := treesnap.Take(t, repos)
	_, errs, got := h.Run(t, nil, "--json", "project", "import", "--from", file)
	if got != code || !strings.Contains(errs, `"reason":"`+reason+`"`) {
		t.Fatalf("import of %s: exit %d, want %d %s: %s", filepath.Base(file), got, code, reason, errs)
	}
	t.Logf("import of %s refused: %s", filepath.Base(file), strings.TrimSpace(errs))
	if d := treesnap.Diff(before, treesnap.Take(t, repos)); d != "" {
		t.Fatalf("a refused import of %s changed %s:\n%s", filepath.Base(file), repos, d)
	}
	if owner != "" {
		if p := listedProject(t, h, "acme", "web"); p.Host != owner || !p.Moving {
			t.Fatalf("after a refused import of %s: %+v, want still moving from %s", filepath.Base(file), p, owner)
		}
	}
}
