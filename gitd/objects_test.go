package gitd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/bushost/bushost/internal/gitid"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
)

// TestObjectReaderWalk: the in-process ancestry walk answers yes, a
// definite no (the whole history read), or hands the question to git past
// its bound; it reads the quarantine's pack and the repository alike.
func TestObjectReaderWalk(t *testing.T) {
	e := newEnv(t)
	var chain []string
	for _, s := range []string{"1", "2", "3", "4"} {
		chain = append(chain, e.commitFile("a.txt", s+"\n"))
	}
	br := bufio.NewReader(bytes.NewReader(e.bundle("HEAD", "^main")))
	if _, err := bundle.ReadHeader(br); err != nil {
		t.Fatal(err)
	}
	r, err := e.svc.store.project(testScope())
	if err != nil {
		t.Fatal(err)
	}
	q, err := bundle.NewQuarantine(r.objects())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Remove()
	name, err := q.IndexPack(context.Background(), e.svc.git, r.Path, br)
	if err != nil {
		t.Fatal(err)
	}
	gg := r.open()
	objs, err := openObjects(q.Dir, name, gg)
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	head := chain[3]
	if typ, err := objs.objectType(head); err != nil || typ != plumbing.CommitObject {
		t.Fatalf("type of %s (quarantine) = %v, %v", head, typ, err)
	}
	if typ, err := objs.objectType(e.main); err != nil || typ != plumbing.CommitObject {
		t.Fatalf("type of main (repository) = %v, %v", typ, err)
	}
	if _, err := objs.objectType(string(gitid.Zero)); err == nil {
		t.Fatal("an absent object has a type")
	}
	for _, a := range append([]string{e.main}, chain...) {
		if ok, err := objs.isAncestor(a, head); !ok || err != nil {
			t.Errorf("isAncestor(%s, head) = %v, %v; want true", a, ok, err)
		}
	}
	if ok, err := objs.isAncestor(head, chain[1]); ok || err != nil {
		t.Errorf("isAncestor(head, an ancestor) = %v, %v; want a definite false", ok, err)
	}
	objs.limit = 2
	if ok, err := objs.isAncestor(e.main, head); ok || !errors.Is(err, errUndecided) {
		t.Errorf("past the bound: %v, %v; want errUndecided", ok, err)
	}
}

// TestPushHistoryPastWalk: when the in-process walk cannot settle a
// question, git does, with the same answers.
func TestPushHistoryPastWalk(t *testing.T) {
	defer func(n int) { walkLimit = n }(walkLimit)
	walkLimit = 1
	e := newEnv(t)
	e.commitFile("a.txt", "1\n")
	e.commitFile("a.txt", "2\n")
	c1 := e.commitFile("a.txt", "3\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatalf("new ref sharing history with main: %v", err)
	}
	e.commitFile("a.txt", "4\n")
	c2 := e.commitFile("a.txt", "5\n")
	if res, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil || res.Previous != c1 || res.Commit != c2 {
		t.Fatalf("fast-forward: %+v, %v", res, err)
	}
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "main")
	e.commitFile("b.txt", "1\n")
	e.commitFile("b.txt", "2\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); errdefs.ReasonOf(err) != errdefs.NonFastForward {
		t.Fatalf("non-fast-forward past the walk: %v", err)
	}
	if got := e.ref("refs/work/t1"); got != c2 {
		t.Fatalf("refs/work/t1 = %s, want %s", got, c2)
	}
}

// TestHasObject: the index lookup that checks a push's prerequisites agrees
// with git on every object of the repository's packs and on absent names
// next to each of them, sees loose objects, and leaves an index it cannot
// read to go-git (errUndecided) instead of answering no.
func TestHasObject(t *testing.T) {
	e := newEnv(t)
	for i := 0; i < 300; i++ {
		os.WriteFile(filepath.Join(e.work, fmt.Sprintf("f%03d", i)), []byte(fmt.Sprintf("blob %d\n", i)), 0o644)
	}
	e.commitAll(e.work, "many blobs")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	// The task's repository and its pool: git reads both (the pool is the
	// task's alternate); each object is in one of them, and the push's
	// 300 blobs in the task's.
	objects := filepath.Join(e.taskRepo("t1"), "objects")
	all := strings.Fields(e.run(e.taskRepo("t1"), "cat-file", nil, "--batch-all-objects", "--batch-check=%(objectname)"))
	own := 0
	for _, id := range all {
		h := plumbing.NewHash(id)
		inTask, err := hasObjectIn(objects, h)
		if err != nil {
			t.Fatal(err)
		}
		inPool, err := hasObjectIn(filepath.Join(e.repo, "objects"), h)
		if err != nil || !inTask && !inPool {
			t.Fatalf("hasObject(%s) = false, %v; git has it", id, err)
		}
		if inTask {
			own++
		}
	}
	if own < 300 {
		t.Fatalf("the task's repository holds %d objects, want over 300", own)
	}
	for _, id := range all {
		h := plumbing.NewHash(id)
		// The same name with its last byte changed: absent, unless git
		// happens to hold that one too.
		h[len(h)-1] ^= 0xff
		_, gerr := e.runErr(e.taskRepo("t1"), "cat-file", nil, "-e", "--", h.String())
		if ok, err := hasObjectIn(objects, h); err != nil || ok && gerr != nil {
			t.Fatalf("hasObject(%s) = %v, %v; git: %v", h, ok, err, gerr)
		}
	}
	loose := e.run(e.taskRepo("t1"), "hash-object", []byte("only loose\n"), "-w", "--stdin")
	if ok, err := hasObjectIn(objects, plumbing.NewHash(loose)); err != nil || !ok {
		t.Fatalf("loose object %s: %v, %v", loose, ok, err)
	}
	if ok, err := hasObjectIn(objects, plumbing.NewHash(string(gitid.Zero))); err != nil || ok {
		t.Fatalf("zero id: %v, %v", ok, err)
	}

	// An index that is not version 2, or is cut short: undecided.
	bad := filepath.Join(t.TempDir(), "objects")
	os.MkdirAll(filepath.Join(bad, "pack"), 0o755)
	for _, body := range [][]byte{[]byte("\xfftOc\x00\x00\x00\x01"), bytes.Repeat([]byte{0}, 1024), []byte("\xfftOc\x00\x00\x00\x02short")} {
		os.WriteFile(filepath.Join(bad, "pack", "pack-x.idx"), body, 0o644)
		if ok, err := hasObjectIn(bad, plumbing.NewHash(e.main)); !errors.Is(err, errUndecided) || ok {
			t.Fatalf("index %q: %v, %v; want errUndecided", body[:8], ok, err)
		}
	}
}
