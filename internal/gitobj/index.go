// A version-2 pack index is read in place: the file is mapped read-only,
// checked for a layout that holds together, and looked up through its
// fan-out table and a binary search of its names. Nothing is decoded
// ahead, so opening an index costs the same whatever its size.
package gitobj

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"syscall"
)

// Layout of a version-2 index: header, fan-out, then per object its name,
// its CRC-32 and its 31-bit offset (or the position of a 64-bit one in the
// table after them), then the pack's and the index's checksums.
const (
	HashLen   = 20
	HeaderLen = 8
	FanoutLen = 256 * 4
	// MinBytes is the size of an index of no object.
	MinBytes = HeaderLen + FanoutLen + 2*HashLen
)

// ErrCorrupt is an index whose layout does not hold together.
var ErrCorrupt = errors.New("pack index corrupt")

// ErrTooSmall is a file shorter than what MapFile's caller needs.
var ErrTooSmall = errors.New("too small")

// MapFile maps the regular file at path read-only, whole; one shorter than
// min bytes (or too large to map) is ErrTooSmall, not mapped. The caller
// unmaps it (syscall.Munmap). It opens without blocking: push-working
// reads a worker's repository, where a FIFO in a file's place would block
// the open and a device would read forever.
func MapFile(path string, min int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	size := st.Size()
	if size < min || size > 1<<40 || int64(int(size)) != size {
		return nil, fmt.Errorf("%s: %w: %d bytes", path, ErrTooSmall, size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return data, nil
}

// Index is one mapped index. Its mapping is released when the Index is
// no longer reachable (a finalizer): no slice of it outlives a call.
type Index struct {
	Path string
	data []byte
	n    int // objects
	n64  int // entries of the 64-bit offset table
}

// Open maps the index at path and checks its layout: the header, a
// fan-out that never decreases, and a size that fits its count exactly.
func Open(path string) (*Index, error) {
	data, err := MapFile(path, MinBytes)
	if errors.Is(err, ErrTooSmall) {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if err != nil {
		return nil, err
	}
	ix := &Index{Path: path, data: data}
	if err := ix.parse(); err != nil {
		syscall.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// A pack removed by a repack stays readable through the mapping; it
	// is released once nothing holds the Index.
	runtime.SetFinalizer(ix, func(ix *Index) { syscall.Munmap(ix.data) })
	return ix, nil
}

func (ix *Index) parse() error {
	d := ix.data
	if !bytes.Equal(d[:HeaderLen], []byte("\xfftOc\x00\x00\x00\x02")) {
		return fmt.Errorf("%w: not a version-2 index", ErrCorrupt)
	}
	prev := uint32(0)
	for b := range 256 {
		c := binary.BigEndian.Uint32(d[HeaderLen+4*b:])
		if c < prev {
			return fmt.Errorf("%w: fan-out decreases at %02x", ErrCorrupt, b)
		}
		prev = c
	}
	ix.n = int(prev)
	fixed := int64(MinBytes) + int64(ix.n)*(HashLen+4+4)
	rest := int64(len(d)) - fixed
	if rest < 0 || rest%8 != 0 {
		return fmt.Errorf("%w: %d bytes for %d objects", ErrCorrupt, len(d), ix.n)
	}
	ix.n64 = int(rest / 8)
	return nil
}

// Len is the number of objects the index lists.
func (ix *Index) Len() int { return ix.n }

func (ix *Index) fanout(b int) int {
	if b < 0 {
		return 0
	}
	return int(binary.BigEndian.Uint32(ix.data[HeaderLen+4*b:]))
}

func (ix *Index) name(pos int) []byte {
	at := HeaderLen + FanoutLen + pos*HashLen
	return ix.data[at : at+HashLen]
}

// Name is the object id at position pos (0 <= pos < Len).
func (ix *Index) Name(pos int) (h [HashLen]byte) {
	copy(h[:], ix.name(pos))
	runtime.KeepAlive(ix)
	return h
}

// Find is h's position, or -1.
func (ix *Index) Find(h [HashLen]byte) int {
	lo, hi := ix.fanout(int(h[0])-1), ix.fanout(int(h[0]))
	i := lo + sort.Search(hi-lo, func(i int) bool { return bytes.Compare(ix.name(lo+i), h[:]) >= 0 })
	found := i < hi && bytes.Equal(ix.name(i), h[:])
	runtime.KeepAlive(ix)
	if !found {
		return -1
	}
	return i
}

// Offset is the pack offset of the object at pos.
func (ix *Index) Offset(pos int) (int64, error) {
	base := HeaderLen + FanoutLen + ix.n*(HashLen+4)
	o := binary.BigEndian.Uint32(ix.data[base+4*pos:])
	runtime.KeepAlive(ix) // the mapping outlives the read
	if o&0x80000000 == 0 {
		return int64(o), nil
	}
	k := int(o & 0x7fffffff)
	if k >= ix.n64 {
		return 0, fmt.Errorf("%s: %w: large offset %d of %d", ix.Path, ErrCorrupt, k, ix.n64)
	}
	big := binary.BigEndian.Uint64(ix.data[base+4*ix.n+8*k:])
	runtime.KeepAlive(ix)
	if big >= 1<<63 {
		return 0, fmt.Errorf("%s: %w: offset out of range", ix.Path, ErrCorrupt)
	}
	return int64(big), nil
}

// CRC32 is the checksum of the packed entry at pos.
func (ix *Index) CRC32(pos int) uint32 {
	c := binary.BigEndian.Uint32(ix.data[HeaderLen+FanoutLen+ix.n*HashLen+4*pos:])
	runtime.KeepAlive(ix)
	return c
}

// LargeOffsets is the number of entries of the 64-bit offset table (a
// pack past 2 GiB, or an index written with every offset there).
func (ix *Index) LargeOffsets() int { return ix.n64 }

// Pack entry types (gitformat-pack(5)): 1-4 a whole object, 6 a delta
// whose base is named by how far before it the base starts, 7 a delta
// whose base is named by its id.
const (
	EntryOfsDelta = 6
	EntryRefDelta = 7
)

// Entry is the header of the pack entry an index's offset points at.
type Entry struct {
	Type int           // 1-4, EntryOfsDelta or EntryRefDelta
	Size uint64        // the inflated size (of the delta, for a delta)
	Len  int           // the header's bytes; the deflated data follows
	Back int64         // EntryOfsDelta: how far before the entry its base is
	Base [HashLen]byte // EntryRefDelta: its base's id
}

// AppendEntryHeader appends the header of a pack entry of type typ
// whose inflated data is size bytes (a delta's base, offset or id,
// follows it and is the caller's).
func AppendEntryHeader(b []byte, typ int, size uint64) []byte {
	c := byte(typ)<<4 | byte(size&15)
	for size >>= 4; size > 0; size >>= 7 {
		b = append(b, c|0x80)
		c = byte(size & 0x7f)
	}
	return append(b, c)
}

// ParseEntry reads the entry header at the start of b (ReadEntry); false
// when b ends inside it or a number in it runs past what a pack can hold.
func ParseEntry(b []byte) (Entry, bool) {
	e, err := ReadEntry(bytes.NewReader(b))
	return e, err == nil
}
