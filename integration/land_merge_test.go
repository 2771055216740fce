package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// renamedFiles is how many files the long merge's task renames and edits.
const renamedFiles = 6500

// A landing whose merge must look for renames among 6,500 files renamed
// (basename and directory) and edited while main edited them in place:
// with --merge-rename-limit 7000 git's rename detection runs for tens of
// seconds. The merge runs outside the project's lock, so a push to another
// task of the project completes while it runs; it ends at its deadline
// (--merge-timeout, MERGE_TIMEOUT, exit 7), recorded, so that landing the
// same push again is refused (LAND_REFUSED) until --force; and with the
// default rename limit the same merge ends at once, in MERGE_CONFLICT.
// Nothing of a refused landing stays: main unmoved, no quarantine.
func TestLongMergeOutsideTheProjectLock(t *testing.T) {
	// The worker's push of 6,500 files takes git a while to pack on a
	// loaded machine: the push rate is not what this test is about.
	h := startHostWith(t, hostOpts{Args: []string{"--merge-timeout", "10s", "--merge-rename-limit", "7000", "--push-rate-grace", "5m"}})
	base := filepath.Dir(h.Home)
	root := filepath.Join(base, "root")
	if err := os.MkdirAll(filepath.Join(root, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	testGit(t, root, "init", "-q", "-b", "main")
	body := func(i int) string {
		var b strings.Builder
		for j := 0; j < 48; j++ {
			fmt.Fprintf(&b, "file %d line %d %s\n", i, j, randSuffix())
		}
		return b.String()
	}
	for i := 0; i < renamedFiles; i++ {
		if err := os.WriteFile(filepath.Join(root, "src", fmt.Sprintf("f%04d.txt", i)), []byte(body(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testGit(t, root, "add", "-A")
	testGit(t, root, "commit", "-q", "-m", "base")
	h.Must(t, "project", "add", "--business", "acme", "--project", "web", "--root", root)
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	other := h.Grant(t, "acme", "web", "t2", "worker", "git.push.working")

	// The task renames every file to another name in another directory
	// and edits it.
	work := filepath.Join(base, "work")
	runAs(t, h, worker, 0, "fetch-main", "--repo", work)
	if err := os.MkdirAll(filepath.Join(work, "moved"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < renamedFiles; i++ {
		from, to := filepath.Join(work, "src", fmt.Sprintf("f%04d.txt", i)), filepath.Join(work, "moved", fmt.Sprintf("g%04d.dat", i))
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, append(b, "edited by the task\n"...), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Remove(from)
	}
	testGit(t, work, "add", "-A")
	testGit(t, work, "commit", "-q", "-m", "rename and edit everything")
	head := testGit(t, work, "rev-parse", "HEAD")
	runAs(t, h, worker, 0, "push-working", "--repo", work)
	id, _ := runAs(t, h, worker, 0, "review", "request")
	runAs(t, h, reviewer, 0, "review", "verdict", "--request", id, "--approve", "--commit", head)

	// main edits every file in place.
	for i := 0; i < renamedFiles; i++ {
		p := filepath.Join(root, "src", fmt.Sprintf("f%04d.txt", i))
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, append([]byte("edited on main\n"), b...), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testGit(t, root, "commit", "-q", "-a", "-m", "edit everything on main")
	h.Must(t, "project", "sync", "--business", "acme", "--project", "web")
	mainBefore := testGit(t, h.PoolRepo("acme", "web"), "rev-parse", "refs/heads/main")

	type result struct {
		errs string
		code int
	}
	land := func(extra ...string) result {
		_, errs, code := h.Run(t, nil, append([]string{"--json", "--timeout", "3m", "task", "land", "--business", "acme", "--project", "web", "--task", "t1", "--merge"}, extra...)...)
		return result{errs, code}
	}
	// Another task of the project pushes while the merge runs.
	w2 := filepath.Join(base, "work2")
	runAs(t, h, other, 0, "fetch-main", "--repo", w2)
	pushed := commitIn(t, w2, "t2 while t1's merge runs")

	done := make(chan result, 1)
	go func() { done <- land() }()
	pool := h.PoolRepo("acme", "web")
	testenv.WaitFor(t, 2*time.Minute, "the landing's merge-tree to run", func() bool { return gitRunningOn(pool, "merge-tree") })
	if out, _ := runAs(t, h, other, 0, "push-working", "--repo", w2); out != pushed {
		t.Fatalf("push to t2 printed %q, want %s", out, pushed)
	}
	select {
	case r := <-done:
		t.Fatalf("the landing ended (exit %d %s) before the push to t2 did: the push was not shown to run beside the merge", r.code, r.errs)
	default:
	}
	if !gitRunningOn(pool, "merge-tree") {
		t.Fatal("the merge was no longer running when the push to t2 ended")
	}

	r := <-done
	if r.code != 7 || errReason(r.errs) != "MERGE_TIMEOUT" {
		t.Fatalf("the long merge: exit %d %s; want 7 MERGE_TIMEOUT", r.code, r.errs)
	}
	refusals := func() int {
		n := 0
		for _, e := range brokerEvents(t, h, "--task", "t1") {
			if e.Type == "task.land_refused" && strings.Contains(string(e.Data), "MERGE_TIMEOUT") && strings.Contains(string(e.Data), head) {
				n++
			}
		}
		return n
	}
	if refusals() != 1 {
		t.Fatalf("%d task.land_refused events for the timed-out merge, want 1", refusals())
	}
	if r := land(); r.code != 1 || errReason(r.errs) != "LAND_REFUSED" {
		t.Fatalf("landing the same push again: exit %d %s; want 1 LAND_REFUSED", r.code, r.errs)
	}
	if refusals() != 1 || gitRunningOn(pool, "merge-tree") {
		t.Fatal("the refused landing ran or recorded a merge")
	}

	// With the default rename limit the merge looks only for exact
	// renames: it ends at once, in conflicts.
	h.Stop(t)
	h.Args = []string{"--push-rate-grace", "5m"}
	h.start(t)
	if r := land("--force"); r.code != 5 || errReason(r.errs) != "MERGE_CONFLICT" {
		t.Fatalf("land --force with the default rename limit: exit %d %s; want 5 MERGE_CONFLICT", r.code, r.errs)
	}
	if now := testGit(t, pool, "rev-parse", "refs/heads/main"); now != mainBefore {
		t.Fatalf("main moved from %s to %s although every landing was refused", mainBefore, now)
	}
	if found(filepath.Join(h.Home, "repos"), bundlePrefix) {
		t.Fatal("a refused landing left its quarantine")
	}
	h.FsckProject(t, "acme", "web")
}

// gitRunningOn says whether a git sub is running with --git-dir gitDir.
func gitRunningOn(gitDir, sub string) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		hasDir, hasSub := false, false
		for _, a := range args {
			hasDir = hasDir || a == gitDir || a == "--git-dir="+gitDir
			hasSub = hasSub || a == sub
		}
		if hasDir && hasSub {
			return true
		}
	}
	return false
}
