package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/bushost/bushost/internal/treesnap"
)

// optimizeResult is `bushost repo optimize --json`.
type optimizeResult struct {
	Project      string `json:"project"`
	Repositories []struct {
		Repository  string   `json:"repository"`
		Outcome     string   `json:"outcome"`
		Actions     []string `json:"actions"`
		PacksBefore int      `json:"packs_before"`
		PacksAfter  int      `json:"packs_after"`
		DurationMs  int64    `json:"duration_ms"`
		Error       string   `json:"error"`
	} `json:"repositories"`
}

func repoOptimize(t *testing.T, h *Host) optimizeResult {
	t.Helper()
	var res optimizeResult
	out := h.Must(t, "--json", "repo", "optimize", "--business", "acme", "--project", "web")
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("repo optimize --json: %v: %s", err, out)
	}
	return res
}

// gitIn runs git commands in dir as testGit does, returning the last one's
// output or the first failure (for a test's goroutines, which must not
// call t.Fatal).
func gitIn(dir string, cmds [][]string) (string, error) {
	var out []byte
	for _, args := range cmds {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(cleanEnv(),
			"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
			"GIT_AUTHOR_NAME=tester", "GIT_AUTHOR_EMAIL=tester@localhost",
			"GIT_COMMITTER_NAME=tester", "GIT_COMMITTER_EMAIL=tester@localhost")
		var err error
		if out, err = cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("git %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, out)
		}
	}
	return strings.TrimSpace(string(out)), nil
}

// The host's `repo optimize` housekeeps the pool and each task repository
// and says what it did; an unknown project and a caller that is not the
// host are refused, leaving the repositories as they were.
func TestRepoOptimize(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--housekeeping=off"}})
	f := newLandFixture(t, h, "web", "t1")
	for i := range 8 {
		f.commit(t, "f.txt", fmt.Sprintf("%d\n", i))
		f.push(t)
	}
	packs, _ := filepath.Glob(filepath.Join(h.TaskRepo("acme", "web", "t1"), "objects", "pack", "*.pack"))
	if len(packs) != 8 {
		t.Fatalf("%d packs after 8 pushes with housekeeping off", len(packs))
	}
	res := repoOptimize(t, h)
	if len(res.Repositories) != 2 || res.Repositories[0].Repository != "pool" || res.Repositories[1].Repository != "tasks/t1" {
		t.Fatalf("repo optimize: %+v", res)
	}
	task := res.Repositories[1]
	// A repack runs git: it takes its time, which is reported.
	if task.Outcome != "optimized" || task.PacksBefore != 8 || task.PacksAfter != 1 || task.Error != "" || task.DurationMs <= 0 {
		t.Fatalf("task repository: %+v", task)
	}
	h.FsckProject(t, "acme", "web")
	text := h.Must(t, "repo", "optimize", "--business", "acme", "--project", "web")
	if !strings.Contains(text, "tasks/t1: clean (nothing needed)") {
		t.Fatalf("second run: %s", text)
	}

	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
	_, errs, code := h.Run(t, nil, "repo", "optimize", "--business", "acme", "--project", "nope")
	if code != 6 || !strings.Contains(errs, "PROJECT_NOT_FOUND") {
		t.Fatalf("unknown project: exit %d: %s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(h.Home, "repos", "acme", "nope")); !os.IsNotExist(err) {
		t.Fatalf("a refused optimize made the project's directory: %v", err)
	}
	out, errs, code := h.Run(t, nil, "--token-file", f.worker, "repo", "optimize", "--business", "acme", "--project", "web")
	if code != 4 {
		t.Fatalf("a worker's repo optimize: exit %d, want 4\n%s%s", code, out, errs)
	}
	if _, _, code := h.Run(t, nil, "repo", "optimize", "--business", "acme"); code != 2 {
		t.Fatalf("no --project: exit %d, want 2", code)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("a refused optimize changed the repositories:\n%s", d)
	}
}

// Housekeeping in a loop (the host's repo optimize, and the daemon's own
// after each push) races 16 workers pushing at once: every accepted push is
// its task's ref when the task's pushes end and in the log, no object is
// lost (fsck --strict is clean), and no push is refused.
func TestHousekeepingRacesPushes(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	const tasks, pushes = 16, 4
	type worker struct {
		tok, work string
		last      string
	}
	ws := make([]*worker, tasks)
	for i := range ws {
		name := fmt.Sprintf("t%d", i)
		w := &worker{tok: h.Grant(t, "acme", "web", name, "worker", "git.push.working"),
			work: filepath.Join(filepath.Dir(h.Home), "work-"+name)}
		runAs(t, h, w.tok, 0, "fetch-main", "--repo", w.work)
		ws[i] = w
	}
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		defer func() { done <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			out, errs, code := h.Run(t, nil, "repo", "optimize", "--business", "acme", "--project", "web")
			if code != 0 {
				t.Errorf("repo optimize racing pushes: exit %d\n%s%s", code, out, errs)
				return
			}
			n++
		}
	}()
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range pushes {
				if err := os.WriteFile(filepath.Join(w.work, "f.txt"), []byte(fmt.Sprintf("%d %d\n", i, j)), 0o644); err != nil {
					t.Error(err)
					return
				}
				last, err := gitIn(w.work, [][]string{{"add", "f.txt"}, {"commit", "-q", "-m", fmt.Sprintf("t%d push %d", i, j)}, {"rev-parse", "HEAD"}})
				if err != nil {
					t.Error(err)
					return
				}
				w.last = last
				out, errs, code := h.Run(t, nil, "--token-file", w.tok, "push-working", "--repo", w.work)
				if code != 0 {
					t.Errorf("t%d push %d: exit %d\n%s%s", i, j, code, out, errs)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	rounds := <-done
	if t.Failed() {
		return
	}
	for i, w := range ws {
		ref := fmt.Sprintf("refs/work/t%d", i)
		if got := testGit(t, h.TaskRepo("acme", "web", fmt.Sprintf("t%d", i)), "rev-parse", ref); got != w.last {
			t.Errorf("%s = %s, want the last push %s", ref, got, w.last)
		}
		found := false
		for _, e := range brokerEvents(t, h, "--task", fmt.Sprintf("t%d", i)) {
			if e.Type == "action.allowed" && strings.Contains(string(e.Data), w.last) {
				found = true
			}
		}
		if !found {
			t.Errorf("t%d: the last push %s is not in the log", i, w.last)
		}
	}
	h.FsckProject(t, "acme", "web")
	res := repoOptimize(t, h)
	for _, r := range res.Repositories {
		if r.PacksAfter >= 20 || r.Error != "" {
			t.Errorf("%s after the race: %+v", r.Repository, r)
		}
	}
	h.FsckProject(t, "acme", "web")
	t.Logf("%d rounds of repo optimize raced %d pushes", rounds, tasks*pushes)
}
