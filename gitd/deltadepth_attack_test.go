package gitd

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/internal/errdefs"

	"github.com/bushost/bushost/internal/gitobj"
)

// chainBundle is a bundle (on main) of one commit whose tree names a
// chain of blobs (f00000, f00001, ...: a push's objects are all reached
// by its commit), each but the first an OFS_DELTA on the one before:
// links deltas in all.
func chainBundle(main string, links int) []byte {
	var pack bytes.Buffer
	pack.WriteString("PACK")
	binary.Write(&pack, binary.BigEndian, uint32(2))
	binary.Write(&pack, binary.BigEndian, uint32(links+3))
	header := func(typ, size int) { pack.Write(gitobj.AppendEntryHeader(nil, typ, uint64(size))) }
	deflate := func(p []byte) {
		w := zlib.NewWriter(&pack)
		w.Write(p)
		w.Close()
	}
	const size = 64
	blob := bytes.Repeat([]byte("x"), size)
	prev := 0
	var tree []byte
	for i := 0; i <= links; i++ {
		at := pack.Len()
		binary.BigEndian.PutUint64(blob[size-8:], uint64(i))
		id := plumbing.ComputeHash(plumbing.BlobObject, blob)
		tree = append(append(tree, fmt.Sprintf("100644 f%05d\x00", i)...), id[:]...)
		if i == 0 {
			header(int(plumbing.BlobObject), size)
			deflate(blob)
		} else {
			// Sizes, a copy of all but the last 8 bytes, then those.
			delta := append([]byte{size, size, 0x80 | 0x10, size - 8, 8}, blob[size-8:]...)
			header(int(plumbing.OFSDeltaObject), len(delta))
			back := at - prev
			ofs := []byte{byte(back & 0x7f)}
			for back >>= 7; back > 0; back >>= 7 {
				back--
				ofs = append([]byte{byte(0x80 | back&0x7f)}, ofs...)
			}
			pack.Write(ofs)
			deflate(delta)
		}
		prev = at
	}
	header(int(plumbing.TreeObject), len(tree))
	deflate(tree)
	commit := []byte(fmt.Sprintf("tree %s\nparent %s\nauthor %s\ncommitter %s\n\ndeep\n",
		plumbing.ComputeHash(plumbing.TreeObject, tree), main, goodAuthor, goodAuthor))
	header(int(plumbing.CommitObject), len(commit))
	deflate(commit)
	sum := sha1.Sum(pack.Bytes())
	pack.Write(sum[:])
	id := plumbing.ComputeHash(plumbing.CommitObject, commit)
	return append([]byte(fmt.Sprintf("# v2 git bundle\n-%s\n%s refs/heads/work\n\n", main, id)), pack.Bytes()...)
}

// go-git resolves a delta by recursion, 650-840 bytes of goroutine stack a
// link, and a pushed pack's chains were as deep as the push made them: a
// chain of some 830,000 blobs (20 MB, inside the bundle and object bounds)
// read by the walk or a view would exceed the 1 GB stack limit, a fatal
// error that stops the daemon. A push whose pack has a chain deeper than
// git ever writes (4095) is refused, nothing left behind; one at the bound
// is taken.
func TestAttackDeltaChainTooDeep(t *testing.T) {
	e := newEnv(t)
	before := e.snapshot()
	if _, err := e.push("t1", chainBundle(e.main, maxDeltaDepth+1)); errdefs.ReasonOf(err) != errdefs.DeltaChainTooDeep {
		t.Fatalf("a chain of %d deltas: %v, want %s", maxDeltaDepth+1, err, errdefs.DeltaChainTooDeep)
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("the refused push left files behind")
	}
	if _, err := e.push("t1", chainBundle(e.main, maxDeltaDepth)); err != nil {
		t.Fatalf("a chain of %d deltas: %v", maxDeltaDepth, err)
	}
	e.fsck()
}
