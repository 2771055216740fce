package gitd

import (
	"cmp"
	"errors"
	"os"
	"slices"
	"sort"
	"sync"
	"syscall"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"

	"github.com/bushost/bushost/internal/gitobj"
)

// A pack index is read in place: mapped read-only, looked up through its
// fan-out table and a binary search of one slice of names, and shared by
// every request through one cache (indexes). go-git's own storage decodes
// every index of a repository whole on each request's first read, which
// made a fetch or a push cost time and memory in proportion to the objects
// its repository and its pool held: 30 ms and 6 MB for a pool of 200,000
// objects, on every request (docs/git-service.md, "Object reads").

// packIndex is one mapped version-2 pack index (internal/gitobj). It
// implements idxfile.Index for go-git's packfile reader, except for the
// iterations, which the reads here never use.
type packIndex struct {
	*gitobj.Index
	path string
	// byOffset lists positions in pack order, made on the first FindHash
	// (a delta's base is named by its offset).
	byOffsetOnce sync.Once
	byOffset     []uint32
	byOffsetErr  error
}

// errIndexCorrupt is a pack index whose layout does not hold together.
var errIndexCorrupt = gitobj.ErrCorrupt

// openPackIndex maps the index at path and checks its layout.
func openPackIndex(path string) (*packIndex, error) {
	ix, err := gitobj.Open(path)
	if err != nil {
		return nil, err
	}
	return &packIndex{Index: ix, path: path}, nil
}

func (ix *packIndex) Contains(h plumbing.Hash) (bool, error) { return ix.Find(h) >= 0, nil }

func (ix *packIndex) FindOffset(h plumbing.Hash) (int64, error) {
	pos := ix.Find(h)
	if pos < 0 {
		return 0, plumbing.ErrObjectNotFound
	}
	return ix.Offset(pos)
}

func (ix *packIndex) FindCRC32(h plumbing.Hash) (uint32, error) {
	pos := ix.Find(h)
	if pos < 0 {
		return 0, plumbing.ErrObjectNotFound
	}
	return ix.CRC32(pos), nil
}

// FindHash names the object at pack offset o, through the positions in
// pack order, made once per index (4 bytes an object) on its first use.
func (ix *packIndex) FindHash(o int64) (plumbing.Hash, error) {
	ix.byOffsetOnce.Do(ix.sortByOffset)
	if ix.byOffsetErr != nil {
		return plumbing.ZeroHash, ix.byOffsetErr
	}
	var err error
	i := sort.Search(len(ix.byOffset), func(i int) bool {
		at, e := ix.Offset(int(ix.byOffset[i]))
		if e != nil {
			err = e
		}
		return at >= o
	})
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if i == len(ix.byOffset) {
		return plumbing.ZeroHash, plumbing.ErrObjectNotFound
	}
	if at, _ := ix.Offset(int(ix.byOffset[i])); at != o {
		return plumbing.ZeroHash, plumbing.ErrObjectNotFound
	}
	return plumbing.Hash(ix.Name(int(ix.byOffset[i]))), nil
}

func (ix *packIndex) sortByOffset() {
	n := ix.Len()
	offs := make([]int64, n)
	pos := make([]uint32, n)
	for i := range n {
		o, err := ix.Offset(i)
		if err != nil {
			ix.byOffsetErr = err
			return
		}
		offs[i], pos[i] = o, uint32(i)
	}
	sort.Slice(pos, func(a, b int) bool { return offs[pos[a]] < offs[pos[b]] })
	ix.byOffset = pos
	indexes.tableMade(ix)
}

func (ix *packIndex) Count() (int64, error) { return int64(ix.Len()), nil }

var errNotIterated = errors.New("gitd: a mapped pack index is not iterated")

func (ix *packIndex) Entries() (idxfile.EntryIter, error)         { return nil, errNotIterated }
func (ix *packIndex) EntriesByOffset() (idxfile.EntryIter, error) { return nil, errNotIterated }

var _ idxfile.Index = (*packIndex)(nil)

// indexCache holds the mapped indexes by path, the most recently used
// maxCachedIndexes of them. An entry is replaced when the file at its
// path is another one (device, inode, size).
type indexCache struct {
	mu   sync.Mutex
	m    map[string]*cachedIndex
	tick uint64
	// tables is the by-offset positions the cached indexes hold, at most
	// maxTableEntries past a tableMade.
	tables int
}

type cachedIndex struct {
	ix    *packIndex
	dev   uint64
	ino   uint64
	size  int64
	used  uint64
	table int // positions counted in the cache's tables
}

// maxCachedIndexes bounds the mappings the cache holds (each is the
// index's bytes of address space, read from the page cache): more than
// the packs of the repositories in use, even with housekeeping off.
const maxCachedIndexes = 4096

// maxTableEntries bounds the by-offset positions (FindHash, 4 bytes an
// object) that the cache's indexes hold: 256 MiB of heap. A variable only
// so that a test can make it small.
var maxTableEntries = 64 << 20

// indexes is the daemon's one cache of pack indexes.
var indexes = &indexCache{m: map[string]*cachedIndex{}}

// get returns the index at path, mapped once for every caller.
func (c *indexCache) get(path string) (*packIndex, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	sys, _ := st.Sys().(*syscall.Stat_t)
	var dev, ino uint64
	if sys != nil {
		dev, ino = uint64(sys.Dev), sys.Ino
	}
	c.mu.Lock()
	c.tick++
	if e := c.m[path]; e != nil && e.dev == dev && e.ino == ino && e.size == st.Size() {
		e.used = c.tick
		c.mu.Unlock()
		return e.ix, nil
	}
	c.mu.Unlock()
	ix, err := openPackIndex(path)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[path]; old != nil {
		c.tables -= old.table
	}
	c.m[path] = &cachedIndex{ix: ix, dev: dev, ino: ino, size: st.Size(), used: c.tick}
	if len(c.m) > maxCachedIndexes {
		c.evict()
	}
	return ix, nil
}

// evict drops the least recently used eighth of the cache, so that a
// repository with more packs than the cache holds costs one sort per
// eighth, not a scan per index. A view that holds a dropped index keeps
// it; the mapping goes when nothing does.
func (c *indexCache) evict() {
	used := make([]uint64, 0, len(c.m))
	for _, e := range c.m {
		used = append(used, e.used)
	}
	slices.Sort(used)
	cut := used[len(used)/8]
	for p, e := range c.m {
		if e.used < cut {
			c.tables -= e.table
			delete(c.m, p)
		}
	}
}

// tableMade counts ix's by-offset positions, just made, if ix is cached,
// and drops the least recently used other indexes while the cache's
// indexes hold more than maxTableEntries of them: the positions are 4
// bytes an object, and the cache holds thousands of indexes. A view that
// holds a dropped index keeps it (and its table) for its request.
func (c *indexCache) tableMade(ix *packIndex) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[ix.path]
	if e == nil || e.ix != ix || e.table != 0 {
		return
	}
	e.table = len(ix.byOffset)
	c.tables += e.table
	if c.tables <= maxTableEntries {
		return
	}
	var held []*cachedIndex
	for _, o := range c.m {
		if o.table > 0 && o != e {
			held = append(held, o)
		}
	}
	slices.SortFunc(held, func(a, b *cachedIndex) int { return cmp.Compare(a.used, b.used) })
	for _, o := range held {
		if c.tables <= maxTableEntries {
			break
		}
		c.tables -= o.table
		delete(c.m, o.ix.path)
	}
}
