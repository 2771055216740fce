package mcp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// TestRepoConfined sends repo arguments that leave the working directory
// and checks each refusal's reason; those inside come back joined to it.
func TestRepoConfined(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../outside", filepath.Join(root, "sub", "up")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sv := &server{root: root}
	for rel, want := range map[string]errdefs.Reason{
		"":                        errdefs.ArgumentInvalid,
		"..":                      errdefs.ArgumentInvalid,
		"../outside":              errdefs.ArgumentInvalid,
		"sub/../../outside":       errdefs.ArgumentInvalid,
		"sub/..":                  errdefs.ArgumentInvalid,
		outside:                   errdefs.ArgumentInvalid,
		"/":                       errdefs.ArgumentInvalid,
		"a\x00b":                  errdefs.ArgumentInvalid,
		strings.Repeat("a/", 600): errdefs.ArgumentInvalid,
		"link":                    errdefs.PathUnsafe,
		"link/new":                errdefs.PathUnsafe,
		"./link":                  errdefs.PathUnsafe,
		"sub/up/new":              errdefs.PathUnsafe,
		"file/new":                errdefs.PathUnsafe,
	} {
		got, err := sv.repo(rel)
		if errdefs.ReasonOf(err) != want {
			t.Errorf("repo %q: %q, %v; want %s", rel, got, err, want)
		}
	}
	for rel, want := range map[string]string{
		".":          root,
		"w":          filepath.Join(root, "w"),
		"./sub//w/":  filepath.Join(root, "sub", "w"),
		"new/deeper": filepath.Join(root, "new", "deeper"),
		"sub":        filepath.Join(root, "sub"),
	} {
		if got, err := sv.repo(rel); err != nil || got != want {
			t.Errorf("repo %q: %q, %v; want %s", rel, got, err, want)
		}
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Errorf("outside holds %d entries", len(left))
	}
}

// TestRepoGitDirInside sends repositories whose git directory lies
// elsewhere, as git would follow it: a .git link, a .git file or a
// commondir naming a directory outside the repository (or inside it
// through a link), a link among the git directory's entries, objects,
// refs or logs, alternates. Each is refused GIT_DIR_OUTSIDE_REPO, and
// nothing is written where they point; a .git file naming a directory
// inside, and a link in the work tree, are kept.
func TestRepoGitDirInside(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside.git")
	for _, d := range []string{root, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mkdir := func(p string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, text string) {
		t.Helper()
		mkdir(filepath.Dir(p))
		if err := os.WriteFile(filepath.Join(root, p), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, p string) {
		t.Helper()
		mkdir(filepath.Dir(p))
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	link(outside, "linked/.git")
	link("real", "linkedin/.git")
	mkdir("linkedin/real")
	write("abs/.git", "gitdir: "+outside+"\n")
	write("up/.git", "gitdir: ../../outside.git\n")
	write("missing/.git", "gitdir: gone\n")
	write("junk/.git", "not a pointer\n")
	write("big/.git", "gitdir: "+strings.Repeat("a/", maxPointer)+"\n")
	mkdir("via/d")
	link(outside, "via/d/l")
	write("via/.git", "gitdir: d/l\n")
	mkdir("common/.git")
	write("common/.git/commondir", "../../../outside.git\n")
	mkdir("commonabs/.git")
	write("commonabs/.git/commondir", outside+"\n")
	mkdir("commonlink/.git")
	link(filepath.Join(outside, "commondir"), "commonlink/.git/commondir")
	write("bare/HEAD", "ref: refs/heads/main\n")
	write("bare/commondir", outside+"\n")
	write("barelink/HEAD", "ref: refs/heads/main\n")
	link(outside, "barelink/objects")
	mkdir("objlink/.git/objects")
	link(outside, "objlink/.git/objects/ab")
	mkdir("reflink/.git/refs")
	link(outside, "reflink/.git/refs/remotes")
	mkdir("deepref/.git/refs/remotes")
	link(outside, "deepref/.git/refs/remotes/bushost")
	mkdir("loglink/.git")
	link(outside, "loglink/.git/logs")
	write("packed/.git/HEAD", "ref: refs/heads/main\n")
	link(filepath.Join(outside, "packed-refs"), "packed/.git/packed-refs")
	write("alt/.git/objects/info/alternates", outside+"/objects\n")
	sv := &server{root: root}
	for _, rel := range []string{"linked", "linkedin", "abs", "up", "missing", "junk", "big", "via", "common", "commonabs", "commonlink",
		"bare", "barelink", "objlink", "reflink", "deepref", "loglink", "packed", "alt"} {
		got, err := sv.repo(rel)
		if errdefs.ReasonOf(err) != errdefs.GitDirOutsideRepo {
			t.Errorf("repo %q: %q, %v; want GIT_DIR_OUTSIDE_REPO", rel, got, err)
		}
		t.Logf("%s: %v", rel, err)
	}
	// Inside, through directories only: kept.
	write("inner/.git", "gitdir: .g/worktrees/wt\n") // a worktree's layout, within inner
	write("inner/.g/worktrees/wt/commondir", "../..\n")
	write("self/.git", "gitdir: .\n")
	mkdir("plain/.git/refs/heads")
	link(outside, "plain/worktree-link") // the work tree's, which git does not follow
	mkdir("notrepo")
	link(outside, "notrepo/l")
	for _, rel := range []string{"inner", "self", "plain", "notrepo", "new"} {
		if got, err := sv.repo(rel); err != nil || got != filepath.Join(root, rel) {
			t.Errorf("repo %q: %q, %v; want it kept", rel, got, err)
		}
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Errorf("outside holds %d entries", len(left))
	}
}
