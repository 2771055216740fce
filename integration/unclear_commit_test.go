package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/pgtest"
)

// failpointDaemon builds bushostd with the bushost_failpoints tag (the
// broker's failpoint_on.go), once per test run.
func failpointDaemon(t *testing.T) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	const key = "./cmd/bushostd#failpoints"
	path := filepath.Join(binDir, "bushostd-failpoints")
	err, done := built[key]
	if !done {
		cmd := exec.Command("go", "build", "-tags", "grpcnotrace,bushost_failpoints", "-o", path, "./cmd/bushostd")
		cmd.Dir = repoRoot
		if b, berr := cmd.CombinedOutput(); berr != nil {
			err = &buildError{name: "bushostd-failpoints", out: string(b), err: berr}
		}
		built[key] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// plainDaemon builds bushostd without -race (as `make build` does), once
// per test run.
func plainDaemon(t testing.TB) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	const key = "./cmd/bushostd#plain"
	path := filepath.Join(binDir, "bushostd-plain")
	err, done := built[key]
	if !done {
		cmd := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", path, "./cmd/bushostd")
		cmd.Dir = repoRoot
		if b, berr := cmd.CombinedOutput(); berr != nil {
			err = &buildError{name: "bushostd-plain", out: string(b), err: berr}
		}
		built[key] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// startFailpointHost starts the failpoint build of bushostd with
// $BUSHOST_FAILPOINT=mode ("" for none) and args.
func startFailpointHost(t *testing.T, mode string, args []string) *Host {
	t.Helper()
	t.Setenv("BUSHOST_FAILPOINT", mode)
	h := &Host{Home: filepath.Join(baseDir(t), "home"), Args: args, daemon: failpointDaemon(t), client: bin(t, "bushost")}
	h.Log = filepath.Join(filepath.Dir(h.Home), "home.log")
	h.start(t)
	t.Cleanup(func() {
		h.Stop(t)
		if t.Failed() {
			if b, err := os.ReadFile(h.Log); err == nil {
				t.Logf("bushostd log:\n%s", tail(string(b), 8000))
			}
		}
	})
	return h
}

// stores runs f once with SQLite and once with PostgreSQL (a schema of its
// own), giving the extra bushostd flags.
func stores(t *testing.T, f func(t *testing.T, args []string)) {
	t.Run("sqlite", func(t *testing.T) { f(t, nil) })
	t.Run("postgres", func(t *testing.T) {
		dsn := pgtest.SchemaDSN(t, "unclear", "an unclear commit with PostgreSQL")
		f(t, []string{"--broker-dsn", dsn})
	})
}

type pushEnv struct {
	h      *Host
	tok    string
	work   string
	repo   string
	commit string
}

// newPush makes project acme/web, a worker's grant for task, and a commit
// in the worker's repository ready to push.
func newPush(t *testing.T, h *Host, task string) *pushEnv {
	t.Helper()
	if _, err := os.Stat(h.PoolRepo("acme", "web")); err != nil {
		h.AddProject(t, "acme", "web")
	}
	p := &pushEnv{h: h, tok: h.Grant(t, "acme", "web", task, "coder", "git.push.working"),
		work: filepath.Join(filepath.Dir(h.Home), "work-"+task), repo: h.TaskRepo("acme", "web", task)}
	runAs(t, h, p.tok, 0, "fetch-main", "--repo", p.work)
	os.WriteFile(filepath.Join(p.work, task+".txt"), []byte(task+" "+randSuffix()+"\n"), 0o644)
	testGit(t, p.work, "add", ".")
	testGit(t, p.work, "commit", "-q", "-m", "work of "+task)
	p.commit = testGit(t, p.work, "rev-parse", "HEAD")
	return p
}

func (p *pushEnv) push(t *testing.T) (string, string, int) {
	t.Helper()
	return p.h.Run(t, nil, "--token-file", p.tok, "push-working", "--repo", p.work)
}

func (p *pushEnv) ref(t *testing.T, task string) string {
	t.Helper()
	out, _ := exec.Command("git", "--git-dir", p.h.TaskRepo("acme", "web", task), "rev-parse", "--verify", "--quiet", "refs/work/"+task).Output()
	return strings.TrimSpace(string(out))
}

func (p *pushEnv) packs(t *testing.T) []string {
	t.Helper()
	if _, err := os.Stat(p.repo); err != nil {
		return nil // the task's repository is made by its first push
	}
	return entries(t, filepath.Join(p.repo, "objects", "pack"))
}

func pushesOf(t *testing.T, h *Host, commit string) int {
	n := 0
	for _, e := range brokerEvents(t, h) {
		if e.Type == "action.allowed" && strings.Contains(string(e.Data), commit) {
			n++
		}
	}
	return n
}

// The connection is cut after the record's commit reached the store: the
// server reads the log back, learns the push was recorded, and moves the
// ref; the client sees success.
func TestUnclearCommitRecorded(t *testing.T) {
	stores(t, func(t *testing.T, args []string) {
		h := startFailpointHost(t, "record-push:after", args)
		p := newPush(t, h, "t1")
		out, errs, code := p.push(t)
		if code != 0 || strings.TrimSpace(out) != p.commit {
			t.Fatalf("push whose commit was cut after it committed: exit %d %s %s", code, out, errs)
		}
		if got := p.ref(t, "t1"); got != p.commit {
			t.Fatalf("refs/work/t1 = %q, want %s", got, p.commit)
		}
		if n := pushesOf(t, h, p.commit); n != 1 {
			t.Fatalf("%d records of the push, want 1", n)
		}
		if b, _ := os.ReadFile(h.Log); !strings.Contains(string(b), "committed although its commit reported an error") {
			t.Fatalf("the daemon's log does not report the unclear commit:\n%s", b)
		}
	})
}

// The connection is cut before the commit: the log shows no push, the pack
// is removed, the client gets a retryable Unavailable, and the same push
// succeeds when sent again.
func TestUnclearCommitNotRecorded(t *testing.T) {
	stores(t, func(t *testing.T, args []string) {
		h := startFailpointHost(t, "record-push:before", args)
		p := newPush(t, h, "t1")
		before := p.packs(t)
		_, errs, code := p.push(t)
		if code == 0 || !strings.Contains(errs, "Unavailable") || !strings.Contains(errs, "did not commit") {
			t.Fatalf("push whose commit was cut before it committed: exit %d %s", code, errs)
		}
		if got := p.ref(t, "t1"); got != "" {
			t.Fatalf("ref moved: %s", got)
		}
		if got := p.packs(t); !slices.Equal(got, before) {
			t.Fatalf("pack left: %v -> %v", before, got)
		}
		if n := pushesOf(t, h, p.commit); n != 0 {
			t.Fatalf("%d records of a push that did not commit", n)
		}
		if out, errs, code := p.push(t); code != 0 || strings.TrimSpace(out) != p.commit {
			t.Fatalf("push again: exit %d %s %s", code, out, errs)
		}
		if got := p.ref(t, "t1"); got != p.commit {
			t.Fatalf("refs/work/t1 = %q after the retry, want %s", got, p.commit)
		}
	})
}

// The commit is cut after it reached the store and the log cannot be read
// back: the client gets a retryable Unavailable, the pack is kept, and the
// next start moves the ref by the log.
func TestUnclearCommitUnknown(t *testing.T) {
	stores(t, func(t *testing.T, args []string) {
		h := startFailpointHost(t, "record-push:blind", args)
		p := newPush(t, h, "t1")
		before := p.packs(t)
		_, errs, code := p.push(t)
		if code == 0 || !strings.Contains(errs, "Unavailable") || !strings.Contains(errs, "may or may not have committed") {
			t.Fatalf("push whose outcome cannot be learned: exit %d %s", code, errs)
		}
		if got := p.packs(t); len(got) <= len(before) {
			t.Fatalf("the pack was not kept: %v -> %v", before, got)
		}
		if got := p.ref(t, "t1"); got != "" {
			t.Fatalf("ref moved before the outcome was known: %s", got)
		}
		t.Setenv("BUSHOST_FAILPOINT", "")
		h.Restart(t)
		if got := p.ref(t, "t1"); got != p.commit {
			t.Fatalf("after restart refs/work/t1 = %q, want %s (restored from the kept pack)", got, p.commit)
		}
		if n := pushesOf(t, h, p.commit); n != 1 {
			t.Fatalf("%d records of the push, want 1", n)
		}
	})
}

// A recorded push whose objects are gone does not stop the host: reconcile
// marks the task (its calls refused with TASK_NEEDS_REPAIR, the log says
// why), the rest is served, and 'task repair' resolves it by the log:
// restored from a pack put back, or recorded as lost.
func TestTaskNeedsRepair(t *testing.T) {
	stores(t, func(t *testing.T, args []string) {
		h := startHostWith(t, hostOpts{Args: args})
		packsOf := map[string][]string{}
		envs := map[string]*pushEnv{}
		for _, task := range []string{"t1", "t2"} {
			p := newPush(t, h, task)
			before := p.packs(t)
			runAs(t, h, p.tok, 0, "push-working", "--repo", p.work)
			for _, f := range p.packs(t) {
				if !slices.Contains(before, f) {
					packsOf[task] = append(packsOf[task], f)
				}
			}
			envs[task] = p
		}
		other := h.Grant(t, "acme", "web", "t3", "coder", "git.push.working")
		reviewer := h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
		h.Stop(t)

		// The objects of both pushes are lost, and their refs.
		aside := filepath.Join(filepath.Dir(h.Home), "aside")
		os.Mkdir(aside, 0o700)
		for task, files := range packsOf {
			testGit(t, envs[task].repo, "update-ref", "-d", "refs/work/"+task)
			for _, f := range files {
				if err := os.Rename(filepath.Join(envs[task].repo, "objects", "pack", f), filepath.Join(aside, f)); err != nil {
					t.Fatal(err)
				}
			}
		}
		h.Restart(t)

		// Served: another task of the same project pushes.
		w3 := filepath.Join(filepath.Dir(h.Home), "work-t3")
		runAs(t, h, other, 0, "fetch-main", "--repo", w3)
		testGit(t, w3, "commit", "-q", "--allow-empty", "-m", "t3")
		runAs(t, h, other, 0, "push-working", "--repo", w3)

		// The marked tasks refuse, and the log says why.
		for _, task := range []string{"t1", "t2"} {
			_, errs, code := envs[task].push(t)
			if code == 0 || !strings.Contains(errs, "needs repair") || !strings.Contains(errs, "task repair") {
				t.Fatalf("push on %s, which needs repair: exit %d %s", task, code, errs)
			}
			var marked bool
			for _, e := range brokerEvents(t, h, "--task", task) {
				if e.Type == "task.needs_repair" && strings.Contains(string(e.Data), envs[task].commit) && strings.Contains(string(e.Data), "not in the repository") {
					marked = true
				}
			}
			if !marked {
				t.Fatalf("no task.needs_repair event for %s", task)
			}
			show := h.Must(t, "task", "show", "--business", "acme", "--project", "web", "--task", task)
			if !strings.Contains(show, "needs repair") || !strings.Contains(show, "not in the repository") {
				t.Fatalf("task show %s does not say why it needs repair: %s", task, show)
			}
		}
		rev := filepath.Join(filepath.Dir(h.Home), "review-t1")
		if _, errs, code := h.Run(t, nil, "--token-file", reviewer, "fetch-review", "--repo", rev); code == 0 || !strings.Contains(errs, "needs repair") {
			t.Fatalf("fetch-review of a task that needs repair: exit %d %s", code, errs)
		}

		// t2's pack is found again (a backup): the repair restores the ref.
		for _, f := range packsOf["t2"] {
			if err := os.Rename(filepath.Join(aside, f), filepath.Join(envs["t2"].repo, "objects", "pack", f)); err != nil {
				t.Fatal(err)
			}
		}
		out := h.Must(t, "task", "repair", "--business", "acme", "--project", "web", "--task", "t2")
		if !strings.Contains(out, "restored") || envs["t2"].ref(t, "t2") != envs["t2"].commit {
			t.Fatalf("repair of t2: %s; ref %s, want %s", out, envs["t2"].ref(t, "t2"), envs["t2"].commit)
		}
		// t1's is gone: the repair records the push as lost.
		out = h.Must(t, "task", "repair", "--business", "acme", "--project", "web", "--task", "t1")
		if !strings.Contains(out, "lost") || envs["t1"].ref(t, "t1") != "" {
			t.Fatalf("repair of t1: %s", out)
		}
		// Both take pushes again; t1 sends its work anew.
		if out, errs, code := envs["t1"].push(t); code != 0 || strings.TrimSpace(out) != envs["t1"].commit {
			t.Fatalf("push on t1 after repair: exit %d %s %s", code, out, errs)
		}
		if show := h.Must(t, "task", "show", "--business", "acme", "--project", "web", "--task", "t1"); strings.Contains(show, "needs repair") || !strings.Contains(show, envs["t1"].commit) {
			t.Fatalf("task show t1 after repair and push: %s", show)
		}
		// A second repair of a repaired task is refused.
		if _, errs, code := h.Run(t, nil, "task", "repair", "--business", "acme", "--project", "web", "--task", "t2"); code == 0 || !strings.Contains(errs, "does not need repair") {
			t.Fatalf("repair of a repaired task: exit %d %s", code, errs)
		}
	})
}
