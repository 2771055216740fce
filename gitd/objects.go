package gitd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/plumbing/storer"
)

// The checks after index-pack (the ref names a commit; the commit
// fast-forwards the task's ref or shares history with main) read a few
// commits. A git process for each costs more than the reads themselves, so
// they read in process with go-git: the quarantine's new pack first, then
// the repository. Any read that fails or that the walk does not settle
// within its bounds is answered by git itself (the callers fall back), so
// go-git only ever speeds up an answer, never decides a doubtful one.

// walkLimit bounds the commits an in-process ancestry walk reads before it
// hands the question to git, which has the commit-graph. A variable only
// so that a test can make git answer.
var walkLimit = 1000

const (
	// maxCommitBytes bounds a commit read into memory; a larger one (a
	// hostile message) is left to git.
	maxCommitBytes = 1 << 20
)

// objectStore is what objectReader reads behind the quarantine: a view
// (the repository and its pool) or a go-git storer.
type objectStore interface {
	HasEncodedObject(plumbing.Hash) error
	EncodedObjectSize(plumbing.Hash) (int64, error)
	EncodedObject(plumbing.ObjectType, plumbing.Hash) (plumbing.EncodedObject, error)
}

var _ objectStore = storer.EncodedObjectStorer(nil)

// errUndecided is a question the in-process reads could not settle.
var errUndecided = errors.New("undecided in process")

// objectReader reads objects from a quarantine's pack, then from the
// repository. It is one request's, like the go-git handle it wraps.
type objectReader struct {
	pack *packfile.Packfile // nil: nothing in quarantine
	// idx and packDir, name open the same pack again for another reader
	// (a Packfile serves one goroutine; its index may be shared).
	idx     *idxfile.MemoryIndex
	packDir string
	name    string
	repo    objectStore
	// limit bounds the commits isAncestor reads (walkLimit).
	limit int
}

// openObjects opens the pack index-pack wrote into dir (a quarantine's
// object directory) as pack-<name>, in front of repo, refusing one with a
// delta chain deeper than git writes (checkDeltaDepth).
func openObjects(dir, name string, repo objectStore) (*objectReader, error) {
	packDir := filepath.Join(dir, "pack")
	o := &objectReader{repo: repo, limit: walkLimit, packDir: packDir, name: name}
	idxf, err := os.Open(filepath.Join(packDir, "pack-"+name+".idx"))
	if err != nil {
		return nil, err
	}
	defer idxf.Close()
	idx := idxfile.NewMemoryIndex()
	// Buffered: the decoder reads field by field, a system call each.
	if err := idxfile.NewDecoder(bufio.NewReaderSize(idxf, 64<<10)).Decode(idx); err != nil {
		return nil, fmt.Errorf("read %s: %w", idxf.Name(), err)
	}
	o.idx = idx
	// Before anything reads the pack with go-git, whose delta resolution
	// recurses once a link (deltadepth.go).
	if err := checkDeltaDepth(filepath.Join(packDir, "pack-"+name+".pack"), idx); err != nil {
		return nil, err
	}
	if o.pack, err = o.reopen(); err != nil {
		return nil, err
	}
	return o, nil
}

// reopen opens the quarantine's pack once more, on the same index: a
// second Packfile for a goroutine of its own.
func (o *objectReader) reopen() (*packfile.Packfile, error) {
	fs := osfs.New(o.packDir)
	pf, err := fs.Open("pack-" + o.name + ".pack")
	if err != nil {
		return nil, err
	}
	// With a filesystem, objects past go-git's small-object size are read
	// lazily: a type or a size costs no more than a header.
	return packfile.NewPackfile(o.idx, fs, pf, maxCommitBytes), nil
}

func (o *objectReader) Close() error {
	if o.pack != nil {
		return o.pack.Close()
	}
	return nil
}

// object returns the object named h without reading a large one's content.
func (o *objectReader) object(h plumbing.Hash) (plumbing.EncodedObject, error) {
	if o.pack != nil {
		obj, err := o.pack.Get(h)
		if err == nil {
			return obj, nil
		}
		if !errors.Is(err, plumbing.ErrObjectNotFound) {
			return nil, err
		}
	}
	size, err := o.repo.EncodedObjectSize(h)
	if err != nil {
		return nil, err
	}
	if size > maxCommitBytes {
		return nil, errUndecided
	}
	return o.repo.EncodedObject(plumbing.AnyObject, h)
}

// objectType returns the type of the object named by id.
func (o *objectReader) objectType(id string) (plumbing.ObjectType, error) {
	obj, err := o.object(plumbing.NewHash(id))
	if err != nil {
		return plumbing.InvalidObject, err
	}
	return obj.Type(), nil
}

// parents returns a commit's parents.
func (o *objectReader) parents(h plumbing.Hash) ([]plumbing.Hash, error) {
	obj, err := o.object(h)
	if err != nil {
		return nil, err
	}
	if obj.Type() != plumbing.CommitObject || obj.Size() > maxCommitBytes {
		return nil, errUndecided
	}
	c, err := object.DecodeCommit(nil, obj)
	if err != nil {
		return nil, err
	}
	return c.ParentHashes, nil
}

// isAncestor reports whether a is b or one of b's ancestors, walking b's
// history up to o.limit commits. It returns errUndecided (or a read
// error) when it could not tell; then git must.
func (o *objectReader) isAncestor(a, b string) (bool, error) {
	target := plumbing.NewHash(a)
	queue := []plumbing.Hash{plumbing.NewHash(b)}
	seen := map[plumbing.Hash]bool{queue[0]: true}
	for len(queue) > 0 {
		h := queue[0]
		queue = queue[1:]
		if h == target {
			return true, nil
		}
		if len(seen) > o.limit {
			return false, errUndecided
		}
		ps, err := o.parents(h)
		if err != nil {
			return false, err
		}
		for _, p := range ps {
			if !seen[p] {
				seen[p] = true
				queue = append(queue, p)
			}
		}
	}
	// b's whole history was read and a is not in it.
	return false, nil
}

// hasObjectIn reports whether the object directory objects holds h, loose or
// in a pack, reading of each version-2 pack index only the fan-out entries
// and the names under h's first byte: go-git would load every index whole
// first, which for a repository of some 20,000 objects costs more than the
// rest of a small push's checks. An index it cannot read that way, or that
// changes under it, is errUndecided, for the caller to ask go-git.
func hasObjectIn(objects string, h plumbing.Hash) (bool, error) {
	hex := h.String()
	if _, err := os.Stat(filepath.Join(objects, hex[:2], hex[2:])); err == nil {
		return true, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	ents, err := os.ReadDir(filepath.Join(objects, "pack"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".idx" {
			continue
		}
		found, err := idxHas(filepath.Join(objects, "pack", e.Name()), h)
		if err != nil || found {
			return found, err
		}
	}
	return false, nil
}

// packIndexes lists the pack indexes of the object directories dirs.
func packIndexes(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		m, _ := filepath.Glob(filepath.Join(d, "pack", "pack-*.idx"))
		out = append(out, m...)
	}
	return out
}

// idxHas looks h up in the pack index at path, through the daemon's
// mapped indexes (packindex.go).
func idxHas(path string, h plumbing.Hash) (bool, error) {
	ix, err := indexes.get(path)
	if err != nil {
		if errors.Is(err, errIndexCorrupt) {
			return false, errUndecided
		}
		return false, err
	}
	return ix.Find(h) >= 0, nil
}

const hashLen = 20
