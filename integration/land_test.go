package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/treesnap"
)

// landFixture is a project with one task whose worker, reviewer and lander
// hold their grants; approve pushes, reviews and approves the worker's HEAD.
type landFixture struct {
	h                        *Host
	root, repo, work, review string
	worker, reviewer, lander string
}

func newLandFixture(t *testing.T, h *Host, project, task string) *landFixture {
	t.Helper()
	f := &landFixture{h: h}
	f.root = h.AddProject(t, "acme", project)
	f.repo = h.PoolRepo("acme", project)
	f.worker = h.Grant(t, "acme", project, task, "worker", "git.push.working", "review.request")
	f.reviewer = h.Grant(t, "acme", project, task, "reviewer", "review.verdict")
	f.lander = h.Grant(t, "acme", project, task, "lead", "task.land")
	base := filepath.Dir(h.Home)
	f.work = filepath.Join(base, "work-"+project+"-"+task)
	f.review = filepath.Join(base, "review-"+project+"-"+task)
	runAs(t, h, f.worker, 0, "fetch-main", "--repo", f.work)
	return f
}

// commit writes name in the worker's clone and commits it.
func (f *landFixture) commit(t *testing.T, name, body string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.work, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, f.work, "add", name)
	testGit(t, f.work, "commit", "-q", "-m", "change "+name)
	return testGit(t, f.work, "rev-parse", "HEAD")
}

func (f *landFixture) push(t *testing.T) {
	t.Helper()
	runAs(t, f.h, f.worker, 0, "push-working", "--repo", f.work)
}

func (f *landFixture) approve(t *testing.T) {
	t.Helper()
	id, _ := runAs(t, f.h, f.worker, 0, "review", "request")
	runAs(t, f.h, f.reviewer, 0, "fetch-review", "--repo", f.review)
	runAs(t, f.h, f.reviewer, 0, "review", "verdict", "--request", id, "--approve", "--repo", f.review)
}

func (f *landFixture) main(t *testing.T) string {
	t.Helper()
	return testGit(t, f.repo, "rev-parse", "refs/heads/main")
}

// refusedLand runs a land that must be refused with reason and exit code,
// and checks that it left the repositories and the log as they were.
func refusedLand(t *testing.T, h *Host, tokenFile string, code int, reason string, args ...string) (string, string) {
	t.Helper()
	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
	n := len(brokerEvents(t, h))
	full := append([]string{"task", "land"}, args...)
	var out, errs string
	if tokenFile != "" {
		out, errs = runAs(t, h, tokenFile, code, full...)
	} else {
		o, e, c := h.Run(t, nil, full...)
		if c != code {
			t.Fatalf("bushost %v: exit %d, want %d\n%s%s", full, c, code, o, e)
		}
		out, errs = strings.TrimSpace(o), strings.TrimSpace(e)
	}
	if !strings.Contains(errs, reason) {
		t.Fatalf("bushost %v: want reason %s, got: %s", full, reason, errs)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("a refused land changed the repositories:\n%s", d)
	}
	// A merge refused (conflicts, its deadline, a check of its result)
	// is recorded as one task.land_refused; any other refusal appends
	// nothing.
	merge := strings.HasPrefix(reason, "MERGE_") || strings.HasPrefix(reason, "SUBMODULE_") || strings.HasPrefix(reason, "GITMODULES_") ||
		slices.Contains(args, "--merge") && reason == "TREE_TOO_LARGE"
	added := brokerEvents(t, h)[n:]
	if merge && (len(added) != 1 || added[0].Type != "task.land_refused" || !strings.Contains(string(added[0].Data), reason)) ||
		!merge && len(added) != 0 {
		t.Fatalf("a refused land (%s) appended to the log: %+v", reason, added)
	}
	return out, errs
}

// Land before approve, after a newer push, and twice: each refused with
// its reason and exit status, nothing left behind; after approve main is the
// approved commit and task.landed is logged.
func TestLandGate(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	seed := f.main(t)
	first := f.commit(t, "feature.txt", "one\n")
	f.push(t)

	refusedLand(t, h, f.lander, 1, "GATE_NO_APPROVAL")
	// A grant without task.land is denied, and a grant may not name a task.
	refusedLand(t, h, f.worker, 4, "CAPABILITY_MISSING")
	refusedLand(t, h, f.lander, 4, "PermissionDenied", "--business", "acme", "--project", "web", "--task", "t1")

	f.approve(t)
	second := f.commit(t, "feature.txt", "two\n")
	f.push(t)
	refusedLand(t, h, f.lander, 1, "GATE_NO_APPROVAL")
	if got := f.main(t); got != seed {
		t.Fatalf("main moved to %s before a landing", got)
	}

	f.approve(t)
	out, _ := runAs(t, h, f.lander, 0, "--json", "task", "land")
	var res struct {
		Commit, MainOld, MainNew, Merge string
		Seq                             int64
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("task land --json: %q: %v", out, err)
	}
	res.Commit, _ = raw["commit"].(string)
	res.MainOld, _ = raw["main_old"].(string)
	res.MainNew, _ = raw["main_new"].(string)
	if res.Commit != second || res.MainOld != seed || res.MainNew != second || raw["merge"] != "" {
		t.Fatalf("task land --json: %s; want commit %s, main %s -> %s", out, second, seed, second)
	}
	if got := f.main(t); got != second {
		t.Fatalf("main is %s after the landing, want the approved %s (not %s)", got, second, first)
	}
	var landed, closed int
	for _, e := range brokerEvents(t, h, "--task", "t1") {
		switch e.Type {
		case "task.landed":
			landed++
			var d map[string]string
			json.Unmarshal(e.Data, &d)
			if d["commit"] != second || d["main_old"] != seed || d["main_new"] != second || d["merge"] != "" {
				t.Fatalf("task.landed data: %s", e.Data)
			}
		case "task.closed":
			closed++
		}
	}
	if landed != 1 || closed != 1 {
		t.Fatalf("want one task.landed and one task.closed, got %d and %d", landed, closed)
	}

	// Twice: refused with TASK_LANDED, for the grant and for the host.
	refusedLand(t, h, f.lander, 1, "TASK_LANDED")
	refusedLand(t, h, "", 1, "TASK_LANDED", "--business", "acme", "--project", "web", "--task", "t1")
	// A landed task is closed: close and push are refused.
	f.commit(t, "late.txt", "late\n")
	_, errs := runAs(t, h, f.worker, 1, "push-working", "--repo", f.work)
	if !strings.Contains(errs, "closed") {
		t.Fatalf("push after landing: %s", errs)
	}
	// A landed task is not reopened.
	_, errs, code := h.Run(t, nil, "task", "reopen", "--business", "acme", "--project", "web", "--task", "t1")
	if code != 1 || !strings.Contains(errs, "TASK_LANDED") {
		t.Fatalf("reopen of a landed task: exit %d: %s", code, errs)
	}
	// A closed task that did not land is, once; then it closes again.
	closer := h.Grant(t, "acme", "web", "t3", "lead", "task.close")
	runAs(t, h, closer, 0, "task", "close")
	h.Must(t, "task", "reopen", "--business", "acme", "--project", "web", "--task", "t3")
	_, errs, code = h.Run(t, nil, "task", "reopen", "--business", "acme", "--project", "web", "--task", "t3")
	if code != 1 || !strings.Contains(errs, "TASK_NOT_CLOSED") {
		t.Fatalf("reopen of an open task: exit %d: %s", code, errs)
	}
	runAs(t, h, closer, 0, "task", "close")
	// The log still verifies with the landing and the reopening in it.
	h.Must(t, "log", "verify")

	// Lists: the host sees every task with its state; a grant its own.
	var list struct {
		Tasks []struct {
			Task, State string
			LastPush    string `json:"last_push"`
			LandedSeq   int64  `json:"landed_seq"`
		}
	}
	hostJSON := h.Must(t, "--json", "task", "list")
	if err := json.Unmarshal([]byte(hostJSON), &list); err != nil || len(list.Tasks) != 2 ||
		list.Tasks[0].Task != "t1" || list.Tasks[0].State != "landed" || list.Tasks[0].LastPush != second || list.Tasks[0].LandedSeq == 0 ||
		list.Tasks[1].Task != "t3" || list.Tasks[1].State != "closed" {
		t.Fatalf("task list --json: %s (%v)", hostJSON, err)
	}
	landedText := h.Must(t, "task", "list", "--state", "landed")
	if lines := strings.Split(landedText, "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "BUSINESS") || !strings.Contains(lines[1], "t1") || !strings.Contains(lines[1], "landed") {
		t.Fatalf("task list --state landed:\n%s", landedText)
	}
	workerText, _ := runAs(t, h, f.worker, 0, "task", "list")
	if strings.Contains(workerText, "t3") || !strings.Contains(workerText, "t1") {
		t.Fatalf("a worker's task list shows another task:\n%s", workerText)
	}
	for _, file := range []string{f.worker, f.reviewer, f.lander, closer} {
		tok, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, out := range []string{hostJSON, landedText, workerText} {
			if strings.Contains(out, strings.TrimSpace(string(tok))) {
				t.Fatalf("a listing shows a token:\n%s", out)
			}
		}
	}
}

// main moved since the approved commit: refused without --merge; with
// --merge the server commits a merge; a conflict is named by its path.
func TestLandMainMoved(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	approved := f.commit(t, "feature.txt", "the work\n")
	f.push(t)
	f.approve(t)

	// The host moves main from the root.
	if err := os.WriteFile(filepath.Join(f.root, "other.txt"), []byte("host's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, f.root, "add", "other.txt")
	testGit(t, f.root, "commit", "-q", "-m", "host's change")
	moved := h.Must(t, "project", "sync", "--business", "acme", "--project", "web")

	_, errs := refusedLand(t, h, f.lander, 5, "MAIN_MOVED")
	if !strings.Contains(errs, "--merge") {
		t.Fatalf("MAIN_MOVED does not say what to do: %s", errs)
	}
	out, _ := runAs(t, h, f.lander, 0, "task", "land", "--merge")
	merge := f.main(t)
	if !strings.Contains(out, merge) || merge == moved || merge == approved {
		t.Fatalf("task land --merge printed %q; main is %s", out, merge)
	}
	if parents := testGit(t, f.repo, "rev-parse", merge+"^1", merge+"^2"); parents != moved+"\n"+approved {
		t.Fatalf("merge %s has parents %q, want %s and %s", merge, parents, moved, approved)
	}
	if who := testGit(t, f.repo, "log", "-1", "--format=%cn <%ce>", merge); who != "bushost <bushost@localhost>" {
		t.Fatalf("merge committed by %q", who)
	}
	if files := testGit(t, f.repo, "ls-tree", "--name-only", merge); files != "README.md\nfeature.txt\nother.txt" {
		t.Fatalf("merge tree: %q", files)
	}

	// A conflict: task t2 and the host both change README.md.
	g := &landFixture{h: h, root: f.root, repo: f.repo}
	g.worker = h.Grant(t, "acme", "web", "t2", "worker", "git.push.working", "review.request")
	g.reviewer = h.Grant(t, "acme", "web", "t2", "reviewer", "review.verdict")
	g.lander = h.Grant(t, "acme", "web", "t2", "lead", "task.land")
	g.work = filepath.Join(filepath.Dir(h.Home), "work-t2")
	g.review = filepath.Join(filepath.Dir(h.Home), "review-t2")
	runAs(t, h, g.worker, 0, "fetch-main", "--repo", g.work)
	g.commit(t, "README.md", "the worker's readme\n")
	g.push(t)
	g.approve(t)
	testGit(t, f.root, "fetch", "-q", f.repo, "refs/heads/main")
	testGit(t, f.root, "merge", "-q", "--ff-only", "FETCH_HEAD")
	if err := os.WriteFile(filepath.Join(f.root, "README.md"), []byte("the host's readme\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, f.root, "commit", "-q", "-am", "host's readme")
	h.Must(t, "project", "sync", "--business", "acme", "--project", "web")
	out, _ = refusedLand(t, h, g.lander, 5, "MERGE_CONFLICT", "--merge")
	if out != "README.md" {
		t.Fatalf("conflicting paths on stdout: %q, want README.md", out)
	}
	// The same push is not merged again until a new push, or --force.
	refusedLand(t, h, g.lander, 1, "LAND_REFUSED", "--merge")
	out, errs = refusedLand(t, h, g.lander, 5, "MERGE_CONFLICT", "--merge", "--force", "--json")
	var conflicts struct{ Conflicts []string }
	if err := json.Unmarshal([]byte(out), &conflicts); err != nil || len(conflicts.Conflicts) != 1 || conflicts.Conflicts[0] != "README.md" {
		t.Fatalf("--json conflicts: %q (%v)", out, err)
	}
	if !strings.Contains(errs, `"reason":"MERGE_CONFLICT"`) {
		t.Fatalf("--json error: %s", errs)
	}
}

// A worker that lost its clone gets its work back with fetch-main and
// fetch-work, and pushes on top.
func TestFetchWork(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	pushed := f.commit(t, "feature.txt", "one\n")
	f.push(t)
	if err := os.RemoveAll(f.work); err != nil {
		t.Fatal(err)
	}
	runAs(t, h, f.worker, 0, "fetch-main", "--repo", f.work)
	got, _ := runAs(t, h, f.worker, 0, "fetch-work", "--repo", f.work)
	if got != pushed || testGit(t, f.work, "rev-parse", "refs/work/t1") != pushed {
		t.Fatalf("fetch-work printed %q, want %s", got, pushed)
	}
	testGit(t, f.work, "checkout", "-q", "-B", "work", "refs/work/t1")
	next := f.commit(t, "feature.txt", "two\n")
	if out, _ := runAs(t, h, f.worker, 0, "push-working", "--repo", f.work); out != next {
		t.Fatalf("push on top printed %q, want %s", out, next)
	}
	// A push that does not descend from the task's work names fetch-work.
	testGit(t, f.work, "checkout", "-q", "-B", "other", "main")
	f.commit(t, "else.txt", "else\n")
	_, errs := runAs(t, h, f.worker, 5, "push-working", "--repo", f.work)
	if !strings.Contains(errs, "NON_FAST_FORWARD") || !strings.Contains(errs, "fetch-work") {
		t.Fatalf("non-fast-forward push: %s", errs)
	}
}

// Landed work the root lacks: sync is refused; publish writes main to a
// branch of the root, never its checked-out one, leaving the root's work
// tree, index and checked-out branch as they were.
func TestPublishLanded(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	seed := f.main(t)
	approved := f.commit(t, "feature.txt", "the work\n")
	f.push(t)
	f.approve(t)
	runAs(t, h, f.lander, 0, "task", "land")

	_, errs, code := h.Run(t, nil, "project", "sync", "--business", "acme", "--project", "web")
	if code != 1 || !strings.Contains(errs, "MAIN_HAS_LANDED_WORK") || !strings.Contains(errs, "project publish") {
		t.Fatalf("sync with landed work the root lacks: exit %d: %s", code, errs)
	}
	if got := f.main(t); got != approved {
		t.Fatalf("a refused sync moved main to %s", got)
	}

	// A root with uncommitted and untracked changes.
	if err := os.WriteFile(filepath.Join(f.root, "README.md"), []byte("being edited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.root, "notes.txt"), []byte("untracked\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, f.root, "add", "notes.txt")
	status := testGit(t, f.root, "status", "--porcelain")
	index := testGit(t, f.root, "ls-files", "--stage")
	head := testGit(t, f.root, "symbolic-ref", "HEAD")

	// Never the checked-out branch; never a name git would misread.
	for _, c := range []struct {
		branch, reason string
		code           int
	}{{"main", "BRANCH_CHECKED_OUT", 1}, {"../x", "BRANCH_INVALID", 6}, {"-f", "BRANCH_INVALID", 6}, {"a.lock", "BRANCH_INVALID", 6}} {
		_, errs, code := h.Run(t, nil, "project", "publish", "--business", "acme", "--project", "web", "--branch", c.branch)
		if code != c.code || !strings.Contains(errs, c.reason) {
			t.Fatalf("publish --branch %s: exit %d: %s", c.branch, code, errs)
		}
	}
	if got := testGit(t, f.root, "rev-parse", "main"); got != seed {
		t.Fatalf("the root's main moved to %s", got)
	}

	out := h.Must(t, "project", "publish", "--business", "acme", "--project", "web")
	if out != approved || testGit(t, f.root, "rev-parse", "refs/heads/bushost/main") != approved {
		t.Fatalf("publish printed %q; bushost/main of the root should be %s", out, approved)
	}
	if testGit(t, f.root, "status", "--porcelain") != status || testGit(t, f.root, "ls-files", "--stage") != index ||
		testGit(t, f.root, "symbolic-ref", "HEAD") != head || testGit(t, f.root, "rev-parse", "HEAD") != seed {
		t.Fatal("publish touched the root's work tree, index or checked-out branch")
	}
	if b, _ := os.ReadFile(filepath.Join(f.root, "README.md")); string(b) != "being edited\n" {
		t.Fatalf("README.md of the root is now %q", b)
	}

	// Not a fast-forward of the branch: refused unless --force.
	side := testGit(t, f.root, "commit-tree", "-p", seed, "-m", "side", seed+"^{tree}")
	testGit(t, f.root, "update-ref", "refs/heads/bushost/main", side)
	_, errs, code = h.Run(t, nil, "project", "publish", "--business", "acme", "--project", "web")
	if code != 5 || !strings.Contains(errs, "NON_FAST_FORWARD") || testGit(t, f.root, "rev-parse", "bushost/main") != side {
		t.Fatalf("non-fast-forward publish: exit %d: %s", code, errs)
	}
	h.Must(t, "project", "publish", "--business", "acme", "--project", "web", "--force")
	if testGit(t, f.root, "rev-parse", "bushost/main") != approved {
		t.Fatal("publish --force did not move the branch")
	}

	// The root merges the landed work; sync goes through again.
	testGit(t, f.root, "merge", "-q", "--ff-only", "bushost/main")
	if got := h.Must(t, "project", "sync", "--business", "acme", "--project", "web"); got != approved {
		t.Fatalf("sync after merging the published main: %q, want %s", got, approved)
	}
}

// A crash between recording a landing and moving main: the landing is in
// the log, main is still the old commit. The next start moves main to the
// landed commit (gitd's reconcileMain), once; the task stays landed, and a
// second land is refused.
func TestLandCrashAfterRecord(t *testing.T) {
	h := startFailpointHost(t, "land:after-record", nil)
	f := newLandFixture(t, h, "web", "t1")
	seed := f.main(t)
	approved := f.commit(t, "feature.txt", "the work\n")
	f.push(t)
	f.approve(t)
	if _, errs, code := h.Run(t, nil, "--token-file", f.lander, "task", "land"); code != 3 {
		t.Fatalf("land with the daemon killed after the record: exit %d, want 3 (unreachable): %s", code, errs)
	}
	<-h.exited
	h.cmd = nil
	if got := f.main(t); got != seed {
		t.Fatalf("main is %s before the restart, want the old %s (the failpoint fires before the move)", got, seed)
	}
	landed := func() int {
		n := 0
		for _, e := range brokerEvents(t, h, "--task", "t1") {
			if e.Type == "task.landed" {
				n++
			}
		}
		return n
	}
	t.Setenv("BUSHOST_FAILPOINT", "")
	h.start(t)
	if got := f.main(t); got != approved {
		t.Fatalf("after the restart main is %s, want the landed %s", got, approved)
	}
	if n := landed(); n != 1 {
		t.Fatalf("%d task.landed events, want 1", n)
	}
	refusedLand(t, h, f.lander, 1, "TASK_LANDED")
	h.Restart(t)
	if got := f.main(t); got != approved {
		t.Fatalf("a second restart moved main to %s", got)
	}
	if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify: %s", out)
	}
}

// A landed task's repository can be archived by the host: the landed work
// is the pool's (landing copied it there first), the task's events stay,
// and archiving again has nothing to remove. An open task's repository is
// kept: TASK_NOT_CLOSED, nothing changed.
func TestTaskArchive(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	approved := f.commit(t, "feature.txt", "one\n")
	f.push(t)
	f.approve(t)
	runAs(t, h, f.lander, 0, "task", "land")
	open := h.Grant(t, "acme", "web", "t2", "worker", "git.push.working")
	work := filepath.Join(filepath.Dir(h.Home), "work-t2")
	runAs(t, h, open, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "t2")
	runAs(t, h, open, 0, "push-working", "--repo", work)

	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
	_, errs, code := h.Run(t, nil, "task", "archive", "--business", "acme", "--project", "web", "--task", "t2")
	if code != 1 || !strings.Contains(errs, "TASK_NOT_CLOSED") {
		t.Fatalf("archive of an open task: exit %d: %s", code, errs)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("a refused archive changed the repositories:\n%s", d)
	}
	events := len(brokerEvents(t, h, "--task", "t1"))
	if out := h.Must(t, "task", "archive", "--business", "acme", "--project", "web", "--task", "t1"); !strings.Contains(out, "archived") {
		t.Fatalf("archive of the landed task: %s", out)
	}
	if _, err := os.Stat(h.TaskRepo("acme", "web", "t1")); !os.IsNotExist(err) {
		t.Fatalf("the landed task's repository is still there: %v", err)
	}
	if got := f.main(t); got != approved {
		t.Fatalf("main = %s, want the landed %s", got, approved)
	}
	h.FsckProject(t, "acme", "web")
	if got := len(brokerEvents(t, h, "--task", "t1")); got != events {
		t.Fatalf("the task's events changed: %d -> %d", events, got)
	}
	if out := h.Must(t, "task", "archive", "--business", "acme", "--project", "web", "--task", "t1"); !strings.Contains(out, "nothing to remove") {
		t.Fatalf("second archive: %s", out)
	}
	// A restart does not take the archived task for a lost push.
	h.Restart(t)
	if show := h.Must(t, "task", "show", "--business", "acme", "--project", "web", "--task", "t1"); strings.Contains(show, "needs repair") {
		t.Fatalf("the archived task is marked after a restart: %s", show)
	}
	rev := filepath.Join(filepath.Dir(h.Home), "review-main")
	runAs(t, h, f.reviewer, 0, "fetch-main", "--repo", rev)
	if got := testGit(t, rev, "rev-parse", "refs/remotes/bushost/main"); got != approved {
		t.Fatalf("fetch-main after the archive: %s, want %s", got, approved)
	}
}

// TestLandMergeChecksGitmodules: a --merge landing merges two sides'
// .gitmodules as text into a blob no push's checks saw. Each side here is
// sound (the work adds submodule "a", the host's main "a/b"), their merge
// is not (one submodule inside another): the landing is refused with the
// beyond-git walk's reason, and nothing is left behind.
func TestLandMergeChecksGitmodules(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	// main gets a .gitmodules of one submodule, which the worker fetches.
	gm := "[submodule \"x\"]\n\tpath = x\n\turl = https://example.com/x\n"
	if err := os.WriteFile(filepath.Join(f.root, ".gitmodules"), []byte(gm), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, f.root, "add", ".gitmodules")
	testGit(t, f.root, "commit", "-q", "-m", "a submodule")
	h.Must(t, "project", "sync", "--business", "acme", "--project", "web")
	runAs(t, h, f.worker, 0, "fetch-main", "--repo", f.work)

	f.commit(t, ".gitmodules", "[submodule \"a\"]\n\tpath = a\n\turl = https://example.com/a\n"+gm)
	f.push(t)
	f.approve(t)
	if err := os.WriteFile(filepath.Join(f.root, ".gitmodules"), []byte(gm+"[submodule \"a/b\"]\n\tpath = b\n\turl = https://example.com/b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, f.root, "commit", "-q", "-am", "another submodule")
	h.Must(t, "project", "sync", "--business", "acme", "--project", "web")
	main := f.main(t)

	refusedLand(t, h, f.lander, 6, "SUBMODULE_NAME_NESTED", "--merge")
	if got := f.main(t); got != main {
		t.Fatalf("main moved to %s", got)
	}
	testGit(t, f.repo, "fsck", "--strict", "--no-dangling")
}
