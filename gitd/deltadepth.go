package gitd

import (
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
// when a delta chain in it has more than maxDeltaDepth links.
func checkDeltaDepth(path string, idx *idxfile.MemoryIndex) error {
	off, err := gitobj.DeltaTooDeep(path, idx, maxDeltaDepth)
	if err != nil || off < 0 {
		return err
	}
	return errdefs.InvalidArgument(errdefs.DeltaChainTooDeep, "the pack has a delta chain of more than %d links (the entry at offset %d); git writes none that deep: make the bundle again with git bundle create", maxDeltaDepth, off).
		With("limit", maxDeltaDepth).With("offset", off)
}
