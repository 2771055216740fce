package gitobj

import (
	"fmt"
	"slices"
	"sort"
	"syscall"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
)

// DeltaTooDeep returns the pack offset of the first entry of the pack at
// path (indexed by idx) whose delta chain has more than max links, or -1
// when none has. It reads each entry's header in place (the pack mapped,
// nothing inflated), a few bytes an object, and keeps 16 bytes an object
// while it runs: go-git has no such pass (its packfile.Parser inflates
// every object and resolves every delta).
func DeltaTooDeep(path string, idx *idxfile.MemoryIndex, max int) (int64, error) {
	n, err := idx.Count()
	if err != nil || n == 0 {
		return -1, err
	}
	iter, err := idx.EntriesByOffset()
	if err != nil {
		return -1, err
	}
	offsets := make([]int64, 0, n)
	for {
		e, err := iter.Next()
		if err != nil {
			break
		}
		offsets = append(offsets, int64(e.Offset))
	}
	iter.Close()
	sort.Slice(offsets, func(a, b int) bool { return offsets[a] < offsets[b] })
	data, err := MapFile(path, 32)
	if err != nil {
		return -1, fmt.Errorf("delta depth: %w", err)
	}
	defer syscall.Munmap(data)
	end := int64(len(data)) - HashLen // the trailer
	corrupt := func(off int64) error { return fmt.Errorf("delta depth: %s: entry at %d unreadable", path, off) }
	// base[i] is the position of entry i's delta base, -1 for a whole object.
	base := make([]int32, len(offsets))
	for i, off := range offsets {
		if off >= end {
			return -1, corrupt(off)
		}
		e, ok := ParseEntry(data[off:end])
		if !ok {
			return -1, corrupt(off)
		}
		var at int64
		switch e.Type {
		case EntryOfsDelta:
			at = off - e.Back
		case EntryRefDelta:
			o, err := idx.FindOffset(plumbing.Hash(e.Base))
			if err != nil {
				return -1, corrupt(off)
			}
			at = o
		default:
			base[i] = -1
			continue
		}
		j := sort.Search(len(offsets), func(k int) bool { return offsets[k] >= at })
		if j == len(offsets) || offsets[j] != at || j == i {
			return -1, corrupt(off)
		}
		base[i] = int32(j)
	}
	// depth[i] is entry i's links to a whole object, -1 until known;
	// each entry is settled once, so the whole pass is linear.
	depth := slices.Repeat([]int32{-1}, len(offsets))
	var chain []int32
	for i := range offsets {
		chain = chain[:0]
		d := int32(-1)
		for cur := int32(i); ; cur = base[cur] {
			if depth[cur] >= 0 {
				d = depth[cur]
				break
			}
			chain = append(chain, cur)
			if len(chain) > max+1 {
				return offsets[i], nil
			}
			if base[cur] < 0 {
				break
			}
		}
		for k := len(chain) - 1; k >= 0; k-- {
			d++
			if d > int32(max) {
				return offsets[chain[k]], nil
			}
			depth[chain[k]] = d
		}
	}
	return -1, nil
}
