package gitd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
)

// What a tree expands to. Every object of a push is bounded, and so is
// their sum, but a tree names its subtrees by id: a commit whose tree
// holds two copies of a subtree, thirty levels deep, is 31 small trees
// (1.7 KB as a bundle) naming 2^30 paths, which `git ls-tree -r`, a
// checkout or a merge then writes out one by one. So the tree of every
// commit a push brings, and the result of a landing and of a publish, is
// walked here, in process, once per distinct tree (memoised by id: the
// bomb costs 31 reads), and refused (TREE_TOO_LARGE) when it expands past
// --max-tree-paths paths or nests deeper than --max-tree-depth.

// treeSize is what a tree expands to: the paths a checkout of it writes
// (files, symbolic links and gitlinks, through every subtree) and how deep
// they nest (a tree of files alone is 1 deep, an empty one 0).
type treeSize struct {
	paths, depth int64
}

// MaxTreeDepthBound is the most --max-tree-depth may be: git's own
// core.maxTreeDepth (git 2.44) defaults to it, and the walk recurses once
// a level.
const MaxTreeDepthBound = 4096

// maxTreeWalkBytes bounds the tree contents one walk holds along its
// path from the root (each level's tree is held while its subtrees are
// walked): a tree nested under trees of megabytes each is refused rather
// than held. Real trees are kilobytes; git's largest are a few MiB.
const maxTreeWalkBytes = 64 << 20

var (
	errTooManyPaths = errors.New("too many paths")
	errTooDeep      = errors.New("too deep")
	errTooHeavy     = errors.New("too much tree content along one path")
)

// treeSizes remembers what trees expand to, across calls of the whole
// daemon: a tree's id names its content, so its size never changes, and a
// push of one file into a large tree then reads only the trees it
// changed. It holds two generations of treeSizesGen trees each (some 10
// MiB in all); when the newer one is full the older is dropped.
type treeSizes struct {
	mu       sync.Mutex
	cur, old map[plumbing.Hash]treeSize
}

const treeSizesGen = 1 << 17

func (c *treeSizes) get(h plumbing.Hash) (treeSize, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.cur[h]; ok {
		return s, true
	}
	s, ok := c.old[h]
	if ok {
		c.putLocked(h, s)
	}
	return s, ok
}

func (c *treeSizes) put(h plumbing.Hash, s treeSize) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(h, s)
}

func (c *treeSizes) putLocked(h plumbing.Hash, s treeSize) {
	if c.cur == nil || len(c.cur) >= treeSizesGen {
		c.old, c.cur = c.cur, make(map[plumbing.Hash]treeSize, 1024)
	}
	c.cur[h] = s
}

// treeWalk walks trees from a root, each distinct tree once.
type treeWalk struct {
	ctx context.Context
	// isNew says whether a tree is the caller's to check (a push's, a
	// landing's): a new tree is always read and visited, never answered
	// from known.
	isNew func(plumbing.Hash) bool
	// read returns a tree's raw content.
	read func(plumbing.Hash) ([]byte, error)
	// visit, when set, checks each new tree once, with its content.
	visit func(plumbing.Hash, []byte) error
	// known is the daemon's memory of sizes (nil: none).
	known              *treeSizes
	maxPaths, maxDepth int64
	memo               map[plumbing.Hash]treeSize
	held               int64 // tree bytes held along the current path
}

// check walks commit's tree root and refuses it past the bounds.
func (w *treeWalk) check(commit, root plumbing.Hash) error {
	if w.memo == nil {
		w.memo = map[plumbing.Hash]treeSize{}
	}
	_, err := w.size(root, 1)
	switch {
	case errors.Is(err, errTooManyPaths):
		return errdefs.ResourceExhausted(errdefs.TreeTooLarge,
			"the tree %s of commit %s expands to more than %d paths (bushostd --max-tree-paths); keep the commit's files fewer, or ask the host to raise the bound",
			root, commit, w.maxPaths).
			With("commit", commit.String()).With("tree", root.String()).With("limit", w.maxPaths).With("flag", "--max-tree-paths")
	case errors.Is(err, errTooDeep):
		return errdefs.ResourceExhausted(errdefs.TreeTooLarge,
			"the tree %s of commit %s nests deeper than %d levels (bushostd --max-tree-depth); flatten its directories, or ask the host to raise the bound",
			root, commit, w.maxDepth).
			With("commit", commit.String()).With("tree", root.String()).With("limit", w.maxDepth).With("flag", "--max-tree-depth")
	case errors.Is(err, errTooHeavy):
		return errdefs.ResourceExhausted(errdefs.TreeTooLarge,
			"the tree %s of commit %s nests more than %d bytes of trees along one path; split its largest directories",
			root, commit, maxTreeWalkBytes).
			With("commit", commit.String()).With("tree", root.String()).With("limit", maxTreeWalkBytes)
	}
	return err
}

// size is what tree h expands to; its entries are at depth level.
func (w *treeWalk) size(h plumbing.Hash, level int64) (treeSize, error) {
	if s, ok := w.memo[h]; ok {
		return s, w.fits(s, level)
	}
	if err := w.ctx.Err(); err != nil {
		return treeSize{}, err
	}
	if level > w.maxDepth {
		return treeSize{}, errTooDeep
	}
	isNew := w.isNew(h)
	if !isNew && w.known != nil {
		if s, ok := w.known.get(h); ok {
			w.memo[h] = s
			return s, w.fits(s, level)
		}
	}
	data, err := w.read(h)
	if err != nil {
		return treeSize{}, err
	}
	if w.held += int64(len(data)); w.held > maxTreeWalkBytes {
		return treeSize{}, errTooHeavy
	}
	defer func() { w.held -= int64(len(data)) }()
	if isNew && w.visit != nil {
		if err := w.visit(h, data); err != nil {
			return treeSize{}, err
		}
	}
	var s treeSize
	err = treeEntries(h, data, func(mode, _ []byte, id plumbing.Hash) error {
		if string(mode) == "40000" || string(mode) == "040000" {
			sub, err := w.size(id, level+1)
			if err != nil {
				return err
			}
			s.paths += sub.paths
			s.depth = max(s.depth, sub.depth+1)
		} else {
			s.paths++
			s.depth = max(s.depth, 1)
		}
		if s.paths > w.maxPaths {
			return errTooManyPaths
		}
		return nil
	})
	if err != nil {
		return treeSize{}, err
	}
	w.memo[h] = s
	if w.known != nil {
		w.known.put(h, s)
	}
	return s, nil
}

// fits says whether a tree of size s, its entries at depth level, is
// within the depth bound (its paths are summed by its parent).
func (w *treeWalk) fits(s treeSize, level int64) error {
	if level-1+s.depth > w.maxDepth {
		return errTooDeep
	}
	if s.paths > w.maxPaths {
		return errTooManyPaths
	}
	return nil
}

// treeEntries calls fn with each entry of tree h's raw content ("MODE
// NAME\0" and a 20-byte id each).
func treeEntries(h plumbing.Hash, data []byte, fn func(mode, name []byte, id plumbing.Hash) error) error {
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		if sp < 0 {
			// index-pack --strict parsed this tree; a tree it accepted
			// and this cannot read is a bug here, not the push's.
			return fmt.Errorf("tree %s: bad entry mode", h)
		}
		mode := data[:sp]
		data = data[sp+1:]
		nul := bytes.IndexByte(data, 0)
		if nul < 0 {
			return fmt.Errorf("tree %s: bad entry name", h)
		}
		name := data[:nul]
		data = data[nul+1:]
		if len(data) < hashLen {
			return fmt.Errorf("tree %s: short entry id", h)
		}
		var id plumbing.Hash
		copy(id[:], data)
		data = data[hashLen:]
		if err := fn(mode, name, id); err != nil {
			return err
		}
	}
	return nil
}

// readTree reads a tree object's content whole (its size is bounded by
// the push's tree bound, or by the view's object bound).
func readTree(obj plumbing.EncodedObject) ([]byte, error) {
	if obj.Type() != plumbing.TreeObject {
		return nil, fmt.Errorf("object %s is a %s, not a tree", obj.Hash(), obj.Type())
	}
	rc, err := obj.Reader()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data := make([]byte, obj.Size())
	if _, err := io.ReadFull(rc, data); err != nil {
		return nil, err
	}
	return data, nil
}

// checkLanding walks the tree of a landing's new main, commit, read
// through the landing's quarantine q and the pool: past the tree bounds
// the landing is refused (TREE_TOO_LARGE). For a merge, every .gitmodules
// blob of a tree the pool did not hold before is checked as the beyond-git
// walk checks a push's: merge-tree merges two sides' .gitmodules as text
// into a new blob, which no push's checks (git's fsck or the walk) ever
// saw, and two works each with a sound .gitmodules could merge into one
// git refuses (submodule "a" beside a nested "a/b"). Only a merge writes
// new blobs: a fast-forward's trees are a push's, checked when they came
// in (the bounds are checked again: they may have changed since).
func (r repo) checkLanding(ctx context.Context, q *bundle.Quarantine, commit string, merged bool) error {
	v := r.openWith(q.Dir)
	before := objectsBefore([]string{r.objects()})
	var isNew func(plumbing.Hash) bool
	if merged {
		isNew = func(h plumbing.Hash) bool { return !before(h) }
	}
	gitmodules, err := v.checkResultTree(ctx, commit, isNew)
	if err != nil {
		return err
	}
	var check []plumbing.Hash
	for blob := range gitmodules {
		if !before(blob) { // else the pool's: main's, or landed work's
			check = append(check, blob)
		}
	}
	return checkGitmodulesIn(v, check)
}

// checkResultTree walks the tree of commit, read through v, against the
// tree bounds (treeWalk), as the result of a landing or a publish. A tree
// isNew says is new (nil: none is) is read even when its size is known,
// and the .gitmodules entries (files or links, under any spelling) of the
// new trees are returned, by blob.
func (v *view) checkResultTree(ctx context.Context, commit string, isNew func(plumbing.Hash) bool) (map[plumbing.Hash]plumbing.Hash, error) {
	c := plumbing.NewHash(commit)
	obj, err := v.EncodedObject(plumbing.CommitObject, c)
	if err != nil {
		return nil, fmt.Errorf("read commit %s: %w", commit, err)
	}
	root, _, err := commitLinks(obj)
	if err != nil {
		return nil, err
	}
	if isNew == nil {
		isNew = func(plumbing.Hash) bool { return false }
	}
	gitmodules := map[plumbing.Hash]plumbing.Hash{}
	b := v.r.st.treeBounds()
	w := treeWalk{ctx: ctx, isNew: isNew, maxPaths: b.maxPaths, maxDepth: b.maxDepth, known: b.known,
		read: func(h plumbing.Hash) ([]byte, error) {
			obj, err := v.EncodedObject(plumbing.TreeObject, h)
			if err != nil {
				return nil, fmt.Errorf("read tree %s: %w", h, err)
			}
			return readTree(obj)
		},
		visit: func(h plumbing.Hash, data []byte) error {
			return treeEntries(h, data, func(mode, name []byte, id plumbing.Hash) error {
				if m := string(mode); m != "40000" && m != "160000" && isDotfile(string(name), "gitmodules", "gi7eba") {
					gitmodules[id] = h
				}
				return nil
			})
		}}
	if err := w.check(c, root); err != nil {
		return nil, err
	}
	return gitmodules, nil
}
