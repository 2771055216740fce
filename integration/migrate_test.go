package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A home of the one-repository layout (repos/acme/web.git with main and
// refs/work/<task>, the pushes recorded in the log) migrates at start to a
// pool and one repository per task, and serves every task's work; a
// migration killed before its rename, or after it, ends the same at the
// next start.
func TestMigrateOldLayout(t *testing.T) {
	w := newGitWorld(t, hostOpts{})
	h := w.h
	c1 := w.commit(t, "a.txt", "work of t1\n")
	w.as(t, w.worker, "push-working", "--repo", w.work)
	workerB := h.Grant(t, w.business, w.project, "t2", "worker", "git.push.working")
	workB := filepath.Join(filepath.Dir(h.Home), "work-b")
	w.as(t, workerB, "fetch-main", "--repo", workB)
	os.WriteFile(filepath.Join(workB, "b.txt"), []byte("work of t2\n"), 0o644)
	testGit(t, workB, "add", "b.txt")
	testGit(t, workB, "commit", "-q", "-m", "t2")
	c2 := w.as(t, workerB, "push-working", "--repo", workB)
	if err := h.Stop(t); err != nil {
		t.Fatal(err)
	}

	// The old layout, as the previous release left it.
	old := filepath.Join(h.Home, "repos", "acme", "web.git")
	testGit(t, filepath.Dir(old), "init", "-q", "--bare", old)
	testGit(t, old, "fetch", "-q", h.PoolRepo("acme", "web"), "refs/heads/main:refs/heads/main")
	testGit(t, old, "config", "bushost.root", testGit(t, h.PoolRepo("acme", "web"), "config", "--get", "bushost.root"))
	for _, task := range []string{"t1", "t2"} {
		testGit(t, old, "fetch", "-q", h.TaskRepo("acme", "web", task), "refs/work/"+task+":refs/work/"+task)
	}
	if err := os.RemoveAll(filepath.Join(h.Home, "repos", "acme", "web")); err != nil {
		t.Fatal(err)
	}

	// Killed before the rename, then after it.
	staging := filepath.Join(h.Home, "repos", "acme", ".migrating-web")
	for _, step := range []struct {
		name       string
		exist, not []string
	}{
		{"staged", []string{old, staging}, []string{h.PoolRepo("acme", "web")}},
		{"renamed", []string{old, h.PoolRepo("acme", "web")}, []string{staging}},
	} {
		// The failpoint build (bushost_failpoints) kills itself there.
		cmd := exec.Command(failpointDaemon(t), "serve", "--home", h.Home)
		cmd.Env = append(append(os.Environ(), h.Env...), "BUSHOST_FAILPOINT=migrate:"+step.name)
		logf, err := os.OpenFile(h.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		done := make(chan error, 1)
		err = cmd.Start()
		logf.Close()
		if err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("bushostd with the failpoint %s exited 0", step.name)
			}
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			t.Fatalf("bushostd did not reach the failpoint %s", step.name)
		}
		for _, p := range step.exist {
			if _, err := os.Stat(p); err != nil {
				t.Fatalf("killed at %s: %s missing: %v", step.name, p, err)
			}
		}
		for _, p := range step.not {
			if _, err := os.Stat(p); err == nil {
				t.Fatalf("killed at %s: %s exists", step.name, p)
			}
		}
	}

	h.Restart(t)
	for _, p := range []string{old, staging} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s left after the migration: %v", p, err)
		}
	}
	log := readText(t, h.Log)
	for _, step := range []string{"removing a staging directory a cut migration left", "moving the project's repository", "the new layout is in place; removing the old repository"} {
		if !strings.Contains(log, "migration: "+step) {
			t.Fatalf("the log does not say %q:\n%s", step, log)
		}
	}
	h.FsckProject(t, "acme", "web")
	if got := testGit(t, h.TaskRepo("acme", "web", "t1"), "rev-parse", "refs/work/t1"); got != c1 {
		t.Fatalf("refs/work/t1 = %s, want %s", got, c1)
	}
	// Every task's work is served: the review of t1, t2's own work back.
	rev := filepath.Join(filepath.Dir(h.Home), "review")
	if got := w.as(t, w.reviewer, "fetch-review", "--repo", rev); got != c1 {
		t.Fatalf("fetch-review printed %q, want %s", got, c1)
	}
	lost := filepath.Join(filepath.Dir(h.Home), "work-b-again")
	if got := w.as(t, workerB, "fetch-work", "--repo", lost); got != c2 {
		t.Fatalf("fetch-work printed %q, want %s", got, c2)
	}
	// The tasks cannot see each other after the migration either.
	blobB := testGit(t, workB, "rev-parse", "HEAD:b.txt")
	notIn(t, h.TaskRepo("acme", "web", "t1"), blobB)
	notIn(t, h.PoolRepo("acme", "web"), blobB)
	// And the next push goes on from there.
	w.commit(t, "a.txt", "more work of t1\n")
	w.as(t, w.worker, "push-working", "--repo", w.work)
}
