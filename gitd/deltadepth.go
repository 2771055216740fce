package gitd

import (
	"fmt"
	"sort"
	"syscall"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"

	"github.com/bushost/bushost/internal/errdefs"

	"github.com/bushost/bushost/internal/gitobj"
)

// maxDeltaDepth bounds the delta chains of a pushed pack. go-git resolves
// a delta by recursion, 650-840 bytes of stack a link (measured: 10,000
// links stay under 8 MiB, 13,000 do not): a chain of some 830,000 blobs
// (about 20 MB, under the bounds of a bundle and of its objects, 2^20)
// read by the beyond-git walk or a view goes past the goroutine stack
// limit (1 GB), a fatal error that stops the daemon, not a panic anyone
// recovers. git writes no deeper chain than 4095 (pack-objects caps
// --depth there), and the packs housekeeping's repacks and the landings'
// fetches write are git's own, so only a push's pack is checked.
const maxDeltaDepth = 4095

// checkDeltaDepth refuses the pack at path (a quarantine's, indexed by idx)
// when a delta chain in it has more than maxDeltaDepth links. It reads each
// entry's header in place (the pack mapped, nothing inflated), a few bytes
// an object, and keeps 16 bytes an object while it runs.
func checkDeltaDepth(path string, idx *idxfile.MemoryIndex) error {
	n, err := idx.Count()
	if err != nil || n == 0 {
		return err
	}
	iter, err := idx.EntriesByOffset()
	if err != nil {
		return err
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
	data, err := gitobj.MapFile(path, 32)
	if err != nil {
		return fmt.Errorf("delta depth: %w", err)
	}
	defer syscall.Munmap(data)
	end := int64(len(data)) - hashLen // the trailer
	corrupt := func(off int64) error { return fmt.Errorf("delta depth: %s: entry at %d unreadable", path, off) }
	// base[i] is the position of entry i's delta base, -1 for a whole object.
	base := make([]int32, len(offsets))
	for i, off := range offsets {
		if off >= end {
			return corrupt(off)
		}
		e, ok := gitobj.ParseEntry(data[off:end])
		if !ok {
			return corrupt(off)
		}
		var at int64
		switch e.Type {
		case gitobj.EntryOfsDelta:
			at = off - e.Back
		case gitobj.EntryRefDelta:
			o, err := idx.FindOffset(plumbing.Hash(e.Base))
			if err != nil {
				return corrupt(off)
			}
			at = o
		default:
			base[i] = -1
			continue
		}
		j := sort.Search(len(offsets), func(k int) bool { return offsets[k] >= at })
		if j == len(offsets) || offsets[j] != at || j == i {
			return corrupt(off)
		}
		base[i] = int32(j)
	}
	// depth[i] is entry i's links to a whole object, -1 until known;
	// each entry is settled once, so the whole pass is linear.
	depth := make([]int32, len(offsets))
	for i := range depth {
		depth[i] = -1
	}
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
			if len(chain) > maxDeltaDepth+1 {
				return deltaTooDeep(offsets[i])
			}
			if base[cur] < 0 {
				break
			}
		}
		for k := len(chain) - 1; k >= 0; k-- {
			d++
			if d > maxDeltaDepth {
				return deltaTooDeep(offsets[chain[k]])
			}
			depth[chain[k]] = d
		}
	}
	return nil
}

func deltaTooDeep(off int64) error {
	return errdefs.InvalidArgument(errdefs.DeltaChainTooDeep, "the pack has a delta chain of more than %d links (the entry at offset %d); git writes none that deep: make the bundle again with git bundle create", maxDeltaDepth, off).
		With("limit", maxDeltaDepth).With("offset", off)
}
