package gitd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/treesnap"
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
	newMain, _, err := e.svc.SyncProject(context.Background(), testScope())
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

// The walk lets a tree it would refuse through when the repository held it
// before the push ("entered before"), and asks that while it runs, before
// the push holds its task's lock. Another push to the same task may then
// be between moving its pack in and having it undone (refused by the walk
// or the broker): its pack answers for the tree, the refusal removes that
// pack, and the second push, which carried the tree itself, was accepted
// with it. Whatever the walk let through for being there before must
// still be there once the push holds the lock.
//
// Made deterministic: the broker's record of the first push (its pack in,
// the lock held) starts the second and waits until that one's walk ended
// and it waits for the lock, then refuses.
func TestAttackWalkTrustsARefusedPushInFlight(t *testing.T) {
	var ha *hookAuth
	e := newEnv(t, func(o *Options) {
		ha = &hookAuth{fakeAuth: o.Authority.(*fakeAuth)}
		o.Authority = ha
	})
	e.svc.skip.BeyondGit = true // for the first push: the broker refuses it
	last := e.pushChain("t1", 1)
	before := e.snapshot()
	readme := e.run(e.work, "rev-parse", nil, "--", "HEAD:README")
	bad := e.rawObject("tree", rawTree(treeEntry{"100644", strings.Repeat("x", 4097), readme}))
	commit := func(msg string) string {
		body := fmt.Sprintf("tree %s\nparent %s\nauthor %s\ncommitter %s\n\n%s\n", bad, last, goodAuthor, goodAuthor, msg)
		return e.rawObject("commit", []byte(body))
	}
	first, second := commit("first"), commit("second")
	secondBundle := func() []byte {
		e.run(e.work, "update-ref", nil, "--", "refs/heads/work", second)
		return e.bundle("HEAD", "^"+last)
	}()
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", first)
	firstBundle := e.bundle("HEAD", "^"+last)

	secondDone := refuseOnceSecondWaits(e, ha, first, secondBundle, func() { e.svc.skip.BeyondGit = false })
	if _, err := e.push("t1", firstBundle); errdefs.ReasonOf(err) != errdefs.TaskClosed {
		t.Fatalf("the push the broker refuses: %v", err)
	}
	got := <-secondDone
	// Refused by the walk, or first for the undo that ran beside it
	// (TestAttackPushOnARefusedPushInFlight).
	if r := errdefs.ReasonOf(got.err); r != errdefs.TreeEntryNameTooLong && r != errdefs.ObjectsUndone {
		t.Errorf("a push carrying a tree the walk refuses, while a refused push held it: %+v, %v; want %s", got.res, got.err, errdefs.TreeEntryNameTooLong)
	}
	if e.ref("refs/work/t1") != last {
		t.Errorf("the ref moved: %s", e.ref("refs/work/t1"))
	}
	if _, err := e.runErr(e.taskRepo("t1"), "cat-file", nil, "-e", "--", bad); err == nil {
		t.Errorf("the refused tree %s is in the task's repository", bad)
	}
	e.fsck()
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Errorf("the refused pushes left:\n%s", d)
	}
}

// The same window, without the tree: a push that names the refused push's
// commit as a prerequisite and carries only a commit of its own on the
// refused tree passes every check (its prerequisite, index-pack's
// connectivity and the ancestry walk all find the refused objects) while
// the refused push's pack is in, and was accepted once that pack was
// removed: refs/work/<task> named a commit whose tree and parent nobody
// had, and git fsck failed on the task's repository.
func TestAttackPushOnARefusedPushInFlight(t *testing.T) {
	var ha *hookAuth
	e := newEnv(t, func(o *Options) {
		ha = &hookAuth{fakeAuth: o.Authority.(*fakeAuth)}
		o.Authority = ha
	})
	last := e.pushChain("t1", 1)
	before := e.snapshot()
	first := e.commitFile("first.txt", "refused\n")
	second := e.commitFile("second.txt", "on the refused one\n")
	secondBundle := e.bundle("HEAD", "^"+first)
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", first)
	firstBundle := e.bundle("HEAD", "^"+last)

	secondDone := refuseOnceSecondWaits(e, ha, first, secondBundle, nil)
	if _, err := e.push("t1", firstBundle); errdefs.ReasonOf(err) != errdefs.TaskClosed {
		t.Fatalf("the push the broker refuses: %v", err)
	}
	got := <-secondDone
	if errdefs.ReasonOf(got.err) != errdefs.ObjectsUndone {
		t.Errorf("a push on a refused push's commit: %+v, %v; want %s", got.res, got.err, errdefs.ObjectsUndone)
	}
	if e.ref("refs/work/t1") != last {
		t.Errorf("the ref moved: %s (second %s)", e.ref("refs/work/t1"), second)
	}
	e.fsck()
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Errorf("the refused pushes left:\n%s", d)
	}
}

// pushOutcome is what a push returned.
type pushOutcome struct {
	res PushResult
	err error
}

// refuseOnceSecondWaits makes the broker's record of push first (its pack
// moved in, the task's lock held) run before (if any), start a push of
// second to t1, wait until that push's checks and walk are done and it
// waits for the task's lock (or it returned), and then refuse first. The
// second push's outcome comes on the channel.
func refuseOnceSecondWaits(e *env, ha *hookAuth, first string, second []byte, before func()) chan pushOutcome {
	done := make(chan pushOutcome, 1)
	refuse := errdefs.FailedPrecondition(errdefs.TaskClosed, "refused by the test's broker")
	ha.record = func(p authz.Push) error {
		if p.Commit != first {
			return nil
		}
		if before != nil {
			before()
		}
		go func() {
			res, err := e.push("t1", second)
			done <- pushOutcome{res, err}
		}()
		for !parkedIn("gitd.(*Service).Push", "gitd.(*project).lockTask") || parkedIn("gitd.walkBeyondGit", "") {
			select {
			case r := <-done:
				done <- r
				return refuse
			case <-time.After(time.Millisecond):
			}
		}
		return refuse
	}
	return done
}
