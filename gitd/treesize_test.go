package gitd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/limits"
)

// memTrees is a set of trees in memory, by id, for the walk alone.
type memTrees map[plumbing.Hash][]byte

func (m memTrees) add(entries ...treeEntry) plumbing.Hash {
	raw := rawTree(entries...)
	h := plumbing.ComputeHash(plumbing.TreeObject, raw)
	m[h] = raw
	return h
}

// bombTrees is the tree bomb in memory: a tree of one file, and levels
// trees above it, each naming the one below twice (a and b).
func bombTrees(levels int) (memTrees, plumbing.Hash) {
	m := memTrees{}
	blob := plumbing.ComputeHash(plumbing.BlobObject, []byte("x\n")).String()
	top := m.add(treeEntry{"100644", "f", blob})
	for i := 0; i < levels; i++ {
		top = m.add(treeEntry{"40000", "a", top.String()}, treeEntry{"40000", "b", top.String()})
	}
	return m, top
}

// The walk reads each distinct tree once: the 30-level bomb names 2^30
// paths in 31 trees and costs 31 reads, and refused at the default bound
// it stops after at most as many.
func TestTreeWalkMemoised(t *testing.T) {
	trees, root := bombTrees(30)
	reads := 0
	walk := func(maxPaths int64) *treeWalk {
		reads = 0
		return &treeWalk{ctx: context.Background(), maxPaths: maxPaths, maxDepth: limits.DefaultMaxTreeDepth,
			isNew: func(plumbing.Hash) bool { return true },
			read: func(h plumbing.Hash) ([]byte, error) {
				reads++
				return trees[h], nil
			}, memo: map[plumbing.Hash]treeSize{}}
	}
	w := walk(1 << 40)
	s, err := w.size(root, 1)
	if err != nil || s.paths != 1<<30 || s.depth != 31 || reads != 31 {
		t.Fatalf("the bomb: %+v, %v after %d reads; want 2^30 paths, 31 deep, 31 reads", s, err, reads)
	}
	commit := plumbing.NewHash("3333333333333333333333333333333333333333")
	err = walk(limits.DefaultMaxTreePaths).check(commit, root)
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.TreeTooLarge || e.Metadata["flag"] != "--max-tree-paths" || e.Metadata["commit"] != commit.String() {
		t.Fatalf("the bomb at the default bound: %v", err)
	}
	if reads > 31 {
		t.Fatalf("refusing the bomb took %d reads", reads)
	}

	// Depth: a chain of trees, at the bound and one past it; a tree
	// known from an earlier walk is held to the depth it sits at.
	chain := memTrees{}
	blob := plumbing.ComputeHash(plumbing.BlobObject, []byte("x\n")).String()
	leaf := chain.add(treeEntry{"100644", "f", blob})
	top := leaf
	for i := 0; i < 7; i++ {
		top = chain.add(treeEntry{"40000", "d", top.String()})
	}
	known := &treeSizes{}
	deep := func(maxDepth int64, root plumbing.Hash) error {
		w := &treeWalk{ctx: context.Background(), maxPaths: 10, maxDepth: maxDepth, known: known,
			isNew: func(plumbing.Hash) bool { return false },
			read:  func(h plumbing.Hash) ([]byte, error) { return chain[h], nil }}
		return w.check(commit, root)
	}
	if err := deep(8, top); err != nil {
		t.Fatalf("8 deep at a bound of 8: %v", err)
	}
	if err := deep(7, top); errdefs.ReasonOf(err) != errdefs.TreeTooLarge {
		t.Fatalf("8 deep at a bound of 7: %v", err)
	}
	above := chain.add(treeEntry{"40000", "e", top.String()})
	if err := deep(8, above); errdefs.ReasonOf(err) != errdefs.TreeTooLarge {
		t.Fatalf("a known 8-deep tree one level down, at a bound of 8: %v", err)
	}

	// A cancelled walk reads nothing more.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w = walk(1 << 40)
	w.ctx = ctx
	if _, err := w.size(root, 1); !errors.Is(err, context.Canceled) || reads != 0 {
		t.Fatalf("a cancelled walk: %v after %d reads", err, reads)
	}
}

// treeBomb writes the bomb into the work repository with git plumbing (a
// commit on main whose tree names levels levels of two copies of one
// subtree) and points refs/heads/work at it.
func (e *env) treeBomb(levels int) string {
	e.t.Helper()
	blob := e.run(e.work, "hash-object", []byte("x\n"), "-w", "--stdin")
	tree := e.run(e.work, "mktree", []byte("100644 blob "+blob+"\tf\n"))
	for i := 0; i < levels; i++ {
		tree = e.run(e.work, "mktree", []byte(fmt.Sprintf("040000 tree %s\ta\n040000 tree %s\tb\n", tree, tree)))
	}
	commit := e.run(e.work, "commit-tree", nil, "-p"+e.main, "-mbomb", "--", tree)
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", commit)
	return commit
}

// The 1.7 KB bundle of a commit whose tree expands to 2^30 paths is
// refused at the push, naming the commit; nothing is left or recorded.
func TestAttackTreeBombPush(t *testing.T) {
	e := newEnv(t)
	before := e.snapshot()
	commit := e.treeBomb(30)
	b := e.bundle("HEAD", "^"+e.main)
	if len(b) > 4096 {
		t.Fatalf("the bomb's bundle is %d bytes", len(b))
	}
	_, err := e.push("t1", b)
	if r, ok := errdefs.As(err); !ok || r.Reason != errdefs.TreeTooLarge || r.Metadata["commit"] != commit || r.Metadata["flag"] != "--max-tree-paths" {
		t.Fatalf("the tree bomb (%d bytes): %v, want %s", len(b), err, errdefs.TreeTooLarge)
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the refused push left files behind")
	}
	if len(e.auth.recorded()) != 0 {
		t.Errorf("the refused push was recorded")
	}
}

// Every commit a push brings is held to the bounds, counting the subtrees
// the repository already holds (read there, or known from before), and a
// tree past --max-tree-depth is refused; at the bounds a push is taken.
func TestPushTreeBounds(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxTreePaths = 10; o.MaxTreeDepth = 4 })
	// README and five files in a: 6 paths.
	for i := 0; i < 5; i++ {
		os.MkdirAll(filepath.Join(e.work, "a"), 0o755)
		os.WriteFile(filepath.Join(e.work, "a", fmt.Sprint(i)), []byte(fmt.Sprint(i)), 0o644)
	}
	first := e.commitAll(e.work, "a")
	if _, err := e.push("t1", e.bundle("HEAD", "^"+e.main)); err != nil {
		t.Fatalf("6 paths: %v", err)
	}
	refused := func(what, flag string, b []byte) {
		t.Helper()
		before := e.snapshot()
		_, err := e.push("t1", b)
		if r, ok := errdefs.As(err); !ok || r.Reason != errdefs.TreeTooLarge || r.Metadata["flag"] != flag {
			t.Fatalf("%s: %v, want %s (%s)", what, err, errdefs.TreeTooLarge, flag)
		}
		if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Errorf("%s: the refused push left files behind", what)
		}
		if e.ref("refs/work/t1") != first || len(e.auth.recorded()) != 1 {
			t.Fatalf("%s: the ref moved, or the push was recorded", what)
		}
	}
	// b names a's tree again: 11 paths, 5 of them new. The daemon's
	// memory of sizes is dropped, so that a's tree is read from the
	// repository.
	aTree := e.run(e.work, "rev-parse", nil, "--", "HEAD:a")
	root := e.run(e.work, "mktree", []byte(fmt.Sprintf("100644 blob %s\tREADME\n040000 tree %s\ta\n040000 tree %s\tb\n",
		e.run(e.work, "rev-parse", nil, "--", "HEAD:README"), aTree, aTree)))
	twice := e.run(e.work, "commit-tree", nil, "-p"+first, "-mtwice", "--", root)
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", twice)
	e.svc.store.treeSizes = treeSizes{}
	refused("a tree naming an old subtree twice", "--max-tree-paths", e.bundle("HEAD", "^"+first))
	// The same commit under a tip that is small again: every pushed
	// commit counts, not only the tip.
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "work")
	e.run(e.work, "rm", nil, "-r", "-q", "--", "b")
	e.commitAll(e.work, "small again")
	refused("an oversized commit under a small tip", "--max-tree-paths", e.bundle("HEAD", "^"+first))

	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", first)
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "work")
	os.MkdirAll(filepath.Join(e.work, "x", "y", "z"), 0o755)
	os.WriteFile(filepath.Join(e.work, "x", "y", "z", "f"), []byte("4 deep\n"), 0o644)
	four := e.commitAll(e.work, "4 deep")
	os.MkdirAll(filepath.Join(e.work, "x", "y", "z", "w"), 0o755)
	os.WriteFile(filepath.Join(e.work, "x", "y", "z", "w", "f"), []byte("5 deep\n"), 0o644)
	e.commitAll(e.work, "5 deep")
	refused("5 deep", "--max-tree-depth", e.bundle("HEAD", "^"+first))
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", four)
	if _, err := e.push("t1", e.bundle("HEAD", "^"+first)); err != nil {
		t.Fatalf("4 deep, 8 paths: %v", err)
	}
	e.fsck()
}

// packOf makes a bundle of commit (its ref refs/heads/work, main its
// prerequisite) whose pack holds exactly ids, with pack-objects.
func (e *env) packOf(commit string, ids ...string) []byte {
	e.t.Helper()
	var pack bytes.Buffer
	if err := e.git.Run(context.Background(), gitcmd.Cmd{Dir: e.work, Sub: "pack-objects", Flags: []string{"--stdout", "-q"},
		Stdin: strings.NewReader(strings.Join(ids, "\n") + "\n"), Stdout: &pack}); err != nil {
		e.t.Fatal(err)
	}
	return append([]byte(fmt.Sprintf("# v2 git bundle\n-%s\n%s refs/heads/work\n\n", e.main, commit)), pack.Bytes()...)
}

// An object of the pushed pack that the pushed commit does not reach is
// refused, nothing left behind; a delta base that index-pack --fix-thin
// appends (the repository's already) is not such an object.
func TestAttackPushUnreachableObject(t *testing.T) {
	e := newEnv(t)
	commit := e.commitFile("f", "reached\n")
	tree := e.run(e.work, "rev-parse", nil, "--", "HEAD^{tree}")
	blob := e.run(e.work, "rev-parse", nil, "--", "HEAD:f")
	extra := e.run(e.work, "hash-object", []byte("reached by nothing\n"), "-w", "--stdin")
	before := e.snapshot()
	_, err := e.push("t1", e.packOf(commit, commit, tree, blob, extra))
	if r, ok := errdefs.As(err); !ok || r.Reason != errdefs.PackUnreachable || r.Metadata["object"] != extra {
		t.Fatalf("a pack with an object the commit does not reach: %v, want %s naming %s", err, errdefs.PackUnreachable, extra)
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the refused push left files behind")
	}
	if len(e.auth.recorded()) != 0 {
		t.Errorf("the refused push was recorded")
	}
	if _, err := e.push("t1", e.packOf(commit, commit, tree, blob)); err != nil {
		t.Fatalf("the same pack without it: %v", err)
	}

	// A thin pack: one line changed of a large file, sent as a delta
	// against the pushed version, which index-pack appends.
	var big strings.Builder
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&big, "line %d of a file large enough to be sent as a delta\n", i)
	}
	first := e.commitFile("big.txt", big.String())
	if _, err := e.push("t1", e.bundle("HEAD", "^"+commit)); err != nil {
		t.Fatal(err)
	}
	e.commitFile("big.txt", big.String()+"one more line\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^"+first)); err != nil {
		t.Fatalf("a thin pack: %v", err)
	}
	e.fsck()
}
