package gitd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/gitcmd"
)

// oldLayout turns e's project into the one-repository layout: a bare
// <project>.git with main, the root's config and every refs/work/<task>.
func oldLayout(t *testing.T, e *env, tasks ...string) string {
	t.Helper()
	ctx := context.Background()
	old := filepath.Join(e.svc.o.ReposDir, testBusiness, testProject+".git")
	run := func(c gitcmd.Cmd) string {
		out, err := e.git.Line(ctx, c, gitcmd.MaxLine)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	run(gitcmd.Cmd{Sub: "init", Flags: []string{"--bare", "--quiet"}, Args: []string{old}})
	run(gitcmd.Cmd{GitDir: old, Sub: "fetch", Flags: []string{"--quiet"}, Args: []string{e.repo, MainRef + ":" + MainRef}})
	run(gitcmd.Cmd{GitDir: old, Sub: "config", Args: []string{rootKey, run(gitcmd.Cmd{GitDir: e.repo, Sub: "config", Flags: []string{"--get"}, Args: []string{rootKey}})}})
	for _, task := range tasks {
		run(gitcmd.Cmd{GitDir: old, Sub: "fetch", Flags: []string{"--quiet"}, Args: []string{e.taskRepo(task), "refs/work/" + task + ":refs/work/" + task}})
	}
	if err := os.RemoveAll(filepath.Dir(e.repo)); err != nil {
		t.Fatal(err)
	}
	return old
}

// An old-layout project becomes a pool and one repository per task, each
// task's holding its own objects only; a staging directory a cut migration
// left is rolled back, and a new layout beside an old repository finishes.
func TestMigrate(t *testing.T) {
	e := newEnv(t)
	c1 := e.commitFile("a.txt", "work of t1\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "main")
	c2 := e.commitFile("b.txt", "work of t2\n")
	if _, err := e.push("t2", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	old := oldLayout(t, e, "t1", "t2")
	// A cut migration's staging directory.
	stale := filepath.Join(e.svc.o.ReposDir, testBusiness, migratePrefix+testProject)
	os.MkdirAll(filepath.Join(stale, "pool.git"), 0o700)

	svc, err := New(e.svc.o)
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	for _, p := range []string{old, stale} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s left: %v", p, err)
		}
	}
	if e.ref(MainRef) != e.main || e.ref("refs/work/t1") != c1 || e.ref("refs/work/t2") != c2 {
		t.Fatalf("refs after migration: main %s t1 %s t2 %s", e.ref(MainRef), e.ref("refs/work/t1"), e.ref("refs/work/t2"))
	}
	// Each task's repository holds its own work, not main's nor the other's.
	all := func(repo string) string {
		out, err := e.git.Line(context.Background(), gitcmd.Cmd{GitDir: repo, Sub: "rev-list", Flags: []string{"--objects", "--all"}}, 16<<20)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if s := all(e.taskRepo("t1")); strings.Contains(s, c2) || !strings.Contains(s, c1) {
		t.Fatalf("t1's repository:\n%s", s)
	}
	if s := all(e.repo); strings.Contains(s, c1) || strings.Contains(s, c2) {
		t.Fatalf("the pool holds task work:\n%s", s)
	}
	e.fsck()
	var out strings.Builder
	if err := e.svc.WriteReviewBundle(context.Background(), testTask("t2"), "", nil, func(string) error { return nil }, &out); err != nil || !strings.Contains(out.String(), c2) {
		t.Fatalf("review bundle of t2: %v", err)
	}

	// Cut after the rename: the old repository is back beside the new
	// layout; the next start removes it and keeps the new layout.
	if err := os.MkdirAll(filepath.Join(old, "objects"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := New(e.svc.o); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Fatalf("old repository kept: %v", err)
	}
	if e.ref("refs/work/t2") != c2 {
		t.Fatal("t2 lost")
	}
}
