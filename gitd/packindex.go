package gitd

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"sync"
	"syscall"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
)

// A pack index is read in place: mapped read-only, looked up through its
// fan-out table and a binary search of one slice of names, and shared by
// every request through one cache (indexes). go-git's own storage decodes
// every index of a repository whole on each request's first read, which
// made a fetch or a push cost time and memory in proportion to the objects
// its repository and its pool held: 30 ms and 6 MB for a pool of 200,000
// objects, on every request (docs/git-service.md, "Object reads").

// packIndex is one mapped version-2 pack index. It implements
// idxfile.Index for go-git's packfile reader, except for the iterations,
// which the reads here never use.
type packIndex struct {
	path string
	data []byte // the mapping; released by the finalizer
	n    int    // objects
	n64  int    // entries of the 64-bit offset table
	// byOffset lists positions in pack order, made on the first FindHash
	// (a delta's base is named by its offset).
	byOffsetOnce sync.Once
	byOffset     []uint32
	byOffsetErr  error
}

const (
	idxHeader   = 8
	idxFanout   = 256 * 4
	idxTrailer  = 2 * hashLen
	idxMinBytes = idxHeader + idxFanout + idxTrailer
)

// errIndexCorrupt is a pack index whose layout does not hold together.
var errIndexCorrupt = errors.New("pack index corrupt")

// errTooSmall is a file shorter than what mapFile's caller needs.
var errTooSmall = errors.New("too small")

// mapFile maps the file at path read-only, whole; one shorter than min
// bytes (or too large to map) is errTooSmall, not mapped.
func mapFile(path string, min int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size < min || size > 1<<40 || int64(int(size)) != size {
		return nil, fmt.Errorf("%s: %w: %d bytes", path, errTooSmall, size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return data, nil
}

// openPackIndex maps the index at path and checks its layout: the header,
// a fan-out that never decreases, and a size that fits its count exactly.
func openPackIndex(path string) (*packIndex, error) {
	data, err := mapFile(path, idxMinBytes)
	if errors.Is(err, errTooSmall) {
		return nil, fmt.Errorf("%w: %w", errIndexCorrupt, err)
	}
	if err != nil {
		return nil, err
	}
	ix := &packIndex{path: path, data: data}
	if err := ix.parse(); err != nil {
		syscall.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// A pack removed by a repack stays readable through the mapping; it
	// is released once no view and no cache entry holds it.
	runtime.SetFinalizer(ix, func(ix *packIndex) { syscall.Munmap(ix.data) })
	return ix, nil
}

func (ix *packIndex) parse() error {
	d := ix.data
	if !bytes.Equal(d[:idxHeader], []byte("\xfftOc\x00\x00\x00\x02")) {
		return fmt.Errorf("%w: not a version-2 index", errIndexCorrupt)
	}
	prev := uint32(0)
	for b := range 256 {
		c := binary.BigEndian.Uint32(d[idxHeader+4*b:])
		if c < prev {
			return fmt.Errorf("%w: fan-out decreases at %02x", errIndexCorrupt, b)
		}
		prev = c
	}
	ix.n = int(prev)
	fixed := int64(idxMinBytes) + int64(ix.n)*(hashLen+4+4)
	rest := int64(len(d)) - fixed
	if rest < 0 || rest%8 != 0 {
		return fmt.Errorf("%w: %d bytes for %d objects", errIndexCorrupt, len(d), ix.n)
	}
	ix.n64 = int(rest / 8)
	return nil
}

func (ix *packIndex) fanout(b int) int {
	if b < 0 {
		return 0
	}
	return int(binary.BigEndian.Uint32(ix.data[idxHeader+4*b:]))
}

func (ix *packIndex) name(pos int) []byte {
	at := idxHeader + idxFanout + pos*hashLen
	return ix.data[at : at+hashLen]
}

// find is h's position, or -1.
func (ix *packIndex) find(h plumbing.Hash) int {
	lo, hi := ix.fanout(int(h[0])-1), ix.fanout(int(h[0]))
	i := lo + sort.Search(hi-lo, func(i int) bool { return bytes.Compare(ix.name(lo+i), h[:]) >= 0 })
	found := i < hi && bytes.Equal(ix.name(i), h[:])
	runtime.KeepAlive(ix)
	if !found {
		return -1
	}
	return i
}

// offset is the pack offset of the object at pos.
func (ix *packIndex) offset(pos int) (int64, error) {
	base := idxHeader + idxFanout + ix.n*(hashLen+4)
	o := binary.BigEndian.Uint32(ix.data[base+4*pos:])
	runtime.KeepAlive(ix) // the mapping outlives the read
	if o&0x80000000 == 0 {
		return int64(o), nil
	}
	k := int(o & 0x7fffffff)
	if k >= ix.n64 {
		return 0, fmt.Errorf("%s: %w: large offset %d of %d", ix.path, errIndexCorrupt, k, ix.n64)
	}
	big := binary.BigEndian.Uint64(ix.data[base+4*ix.n+8*k:])
	runtime.KeepAlive(ix)
	if big >= 1<<63 {
		return 0, fmt.Errorf("%s: %w: offset out of range", ix.path, errIndexCorrupt)
	}
	return int64(big), nil
}

func (ix *packIndex) Contains(h plumbing.Hash) (bool, error) { return ix.find(h) >= 0, nil }

func (ix *packIndex) FindOffset(h plumbing.Hash) (int64, error) {
	pos := ix.find(h)
	if pos < 0 {
		return 0, plumbing.ErrObjectNotFound
	}
	return ix.offset(pos)
}

func (ix *packIndex) FindCRC32(h plumbing.Hash) (uint32, error) {
	pos := ix.find(h)
	if pos < 0 {
		return 0, plumbing.ErrObjectNotFound
	}
	c := binary.BigEndian.Uint32(ix.data[idxHeader+idxFanout+ix.n*hashLen+4*pos:])
	runtime.KeepAlive(ix)
	return c, nil
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
		at, e := ix.offset(int(ix.byOffset[i]))
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
	if at, _ := ix.offset(int(ix.byOffset[i])); at != o {
		return plumbing.ZeroHash, plumbing.ErrObjectNotFound
	}
	var h plumbing.Hash
	copy(h[:], ix.name(int(ix.byOffset[i])))
	runtime.KeepAlive(ix)
	return h, nil
}

func (ix *packIndex) sortByOffset() {
	offs := make([]int64, ix.n)
	pos := make([]uint32, ix.n)
	for i := range ix.n {
		o, err := ix.offset(i)
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

func (ix *packIndex) Count() (int64, error) { return int64(ix.n), nil }

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
