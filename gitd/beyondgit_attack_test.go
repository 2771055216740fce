package gitd

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// The beyond-git walk checks a .gitmodules blob when a new tree names it
// so. A blob that entered earlier under another name (notes.txt, checked
// by nobody as a .gitmodules: git's fsck and the walk look only at blobs a
// tree names .gitmodules) was taken as checked when a later push's tree
// named it .gitmodules, and the push carried only the tree: a .gitmodules
// the walk refuses reached refs/work/<task>, for reviewers to check out.
// A .gitmodules blob a new tree names is checked wherever it is, the
// push's pack or the repository.
func TestAttackGitmodulesBlobFromAnEarlierPush(t *testing.T) {
	e := newEnv(t)
	evil := "[submodule \"s\"]\n\tpath = a./s\n\turl = ./s\n"
	// Carried with its tree, the walk refuses it.
	e.commitFile(".gitmodules", evil)
	if _, err := e.push("t2", e.bundle("HEAD", "^"+e.main)); errdefs.ReasonOf(err) != errdefs.SubmodulePathTrailing {
		t.Fatalf("a .gitmodules with a trailing dot in a path: %v, want %s", err, errdefs.SubmodulePathTrailing)
	}
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", e.main)
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "work")
	// The same bytes as notes.txt first: accepted, no tree names them
	// .gitmodules.
	first := e.commitFile("notes.txt", evil)
	if _, err := e.push("t1", e.bundle("HEAD", "^"+e.main)); err != nil {
		t.Fatalf("notes.txt: %v", err)
	}
	// Then a tree that names that blob .gitmodules, without the blob.
	e.commitFile(".gitmodules", evil)
	res, err := e.push("t1", e.bundle("HEAD", "^"+first))
	if errdefs.ReasonOf(err) != errdefs.SubmodulePathTrailing {
		t.Fatalf("a tree naming an earlier blob .gitmodules: %+v, %v; want %s", res, err, errdefs.SubmodulePathTrailing)
	}
	if e.ref("refs/work/t1") != first {
		t.Fatalf("the ref moved: %s", e.ref("refs/work/t1"))
	}
	e.fsck()

	// A .gitmodules main holds (the host's, from before the rules) is
	// the pool's: a push whose new root tree names it again is taken.
	os.WriteFile(filepath.Join(e.root, ".gitmodules"), []byte(evil), 0o644)
	e.commitAll(e.root, "legacy .gitmodules")
	newMain, _, err := e.svc.SyncProject(context.Background(), testBusiness, testProject)
	if err != nil {
		t.Fatal(err)
	}
	e.run(e.work, "fetch", nil, "--quiet", "--", e.root, "+HEAD:refs/heads/main")
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", newMain)
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "work")
	e.commitFile("other.txt", "x\n")
	if _, err := e.push("t3", e.bundle("HEAD", "^"+newMain)); err != nil {
		t.Fatalf("a push naming main's own .gitmodules again: %v", err)
	}
}
