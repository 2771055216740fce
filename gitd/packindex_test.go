package gitd

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"

	"github.com/bushost/bushost/internal/gitobj"
)

// packFixture makes a bare repository with one pack of n blobs (and a
// commit naming one), its index written by index-pack with the given
// --index-version, and returns the index's path.
func packFixture(t *testing.T, n int, indexVersion string) string {
	t.Helper()
	repo := filepath.Join(t.TempDir(), "r.git")
	git := bareGit(t, repo)
	var b strings.Builder
	for i := range n {
		body := fmt.Sprintf("blob %d %s\n", i, strings.Repeat("x", i%97))
		fmt.Fprintf(&b, "blob\nmark :%d\ndata %d\n%s\n", i+1, len(body), body)
	}
	b.WriteString("commit refs/heads/main\ncommitter A <a@b> 1700000000 +0000\ndata 2\nx\nM 100644 :1 a\n\n")
	git(b.String(), "fast-import", "--quiet")
	idxs, _ := filepath.Glob(filepath.Join(repo, "objects", "pack", "*.idx"))
	if len(idxs) != 1 {
		t.Fatalf("%d indexes", len(idxs))
	}
	if indexVersion != "" {
		pack := strings.TrimSuffix(idxs[0], ".idx") + ".pack"
		os.Remove(idxs[0])
		git("", "index-pack", "--index-version="+indexVersion, pack)
	}
	return idxs[0]
}

// decoded is go-git's own decoding of the index at path.
func decoded(t *testing.T, path string) *idxfile.MemoryIndex {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := idxfile.NewMemoryIndex()
	if err := idxfile.NewDecoder(bufio.NewReader(f)).Decode(m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The mapped index answers as go-git's decoded one, for every object, its
// offset, its CRC and the object at each offset, with 32-bit offsets and
// with every offset in the 64-bit table; a name it lacks is not found.
func TestPackIndexAgreesWithGoGit(t *testing.T) {
	for _, tc := range []struct{ name, version string }{
		{"32-bit offsets", ""},
		{"64-bit offsets", "2,0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := packFixture(t, 3000, tc.version)
			ix, err := openPackIndex(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.version != "" && ix.LargeOffsets() == 0 {
				t.Fatal("the fixture has no 64-bit offsets")
			}
			want := decoded(t, path)
			if n, _ := want.Count(); n != int64(ix.Len()) || n < 3000 {
				t.Fatalf("count %d, go-git %d", ix.Len(), n)
			}
			iter, err := want.Entries()
			if err != nil {
				t.Fatal(err)
			}
			seen := 0
			for {
				e, err := iter.Next()
				if err != nil {
					break
				}
				seen++
				off, err := ix.FindOffset(e.Hash)
				if err != nil || off != int64(e.Offset) {
					t.Fatalf("%s: offset %d %v, want %d", e.Hash, off, err, e.Offset)
				}
				if crc, err := ix.FindCRC32(e.Hash); err != nil || crc != e.CRC32 {
					t.Fatalf("%s: crc %x %v, want %x", e.Hash, crc, err, e.CRC32)
				}
				if h, err := ix.FindHash(off); err != nil || h != e.Hash {
					t.Fatalf("at %d: %s %v, want %s", off, h, err, e.Hash)
				}
				if ok, _ := ix.Contains(e.Hash); !ok {
					t.Fatalf("%s not contained", e.Hash)
				}
			}
			if seen != ix.Len() {
				t.Fatalf("go-git listed %d of %d", seen, ix.Len())
			}
			for _, h := range []string{"0000000000000000000000000000000000000000", "ffffffffffffffffffffffffffffffffffffffff", "1234567890123456789012345678901234567890"} {
				if _, err := ix.FindOffset(plumbing.NewHash(h)); !errors.Is(err, plumbing.ErrObjectNotFound) {
					t.Errorf("%s: %v, want not found", h, err)
				}
			}
			if _, err := ix.FindHash(1); !errors.Is(err, plumbing.ErrObjectNotFound) {
				t.Errorf("offset 1: %v, want not found", err)
			}
		})
	}
}

// An index that does not hold together is refused when mapped (and
// idxHas leaves it undecided); a large offset past the table is an error,
// not a read past the mapping.
func TestPackIndexCorrupt(t *testing.T) {
	path := packFixture(t, 200, "")
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := int(binary.BigEndian.Uint32(good[gitobj.HeaderLen+4*255:]))
	write := func(b []byte) string {
		p := filepath.Join(t.TempDir(), "pack-x.idx")
		if err := os.WriteFile(p, b, 0o444); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mutate := func(f func(b []byte) []byte) string {
		return write(f(append([]byte(nil), good...)))
	}
	for name, p := range map[string]string{
		"empty":     write(nil),
		"truncated": mutate(func(b []byte) []byte { return b[:len(b)-7] }),
		"version 1": mutate(func(b []byte) []byte { b[7] = 1; return b }),
		"fan-out decreases": mutate(func(b []byte) []byte {
			binary.BigEndian.PutUint32(b[gitobj.HeaderLen+4*10:], 0xffff)
			return b
		}),
		"count over the size": mutate(func(b []byte) []byte {
			for i := 0; i < 256; i++ {
				binary.BigEndian.PutUint32(b[gitobj.HeaderLen+4*i:], uint32(n+1000))
			}
			return b
		}),
	} {
		if _, err := openPackIndex(p); !errors.Is(err, errIndexCorrupt) {
			t.Errorf("%s: %v, want %v", name, err, errIndexCorrupt)
		}
		if _, err := idxHas(p, plumbing.NewHash(strings.Repeat("ab", 20))); !errors.Is(err, errUndecided) && name != "empty" {
			t.Errorf("%s: idxHas %v, want undecided", name, err)
		}
	}
	// Every offset pointed into a 64-bit table that has no entries.
	p := mutate(func(b []byte) []byte {
		base := gitobj.HeaderLen + gitobj.FanoutLen + n*(gitobj.HashLen+4)
		for i := range n {
			binary.BigEndian.PutUint32(b[base+4*i:], 0x80000005)
		}
		return b
	})
	ix, err := openPackIndex(p)
	if err != nil {
		t.Fatal(err)
	}
	first := plumbing.Hash(ix.Name(0))
	if _, err := ix.FindOffset(first); !errors.Is(err, errIndexCorrupt) {
		t.Errorf("a large offset past the table: %v", err)
	}
	if _, err := ix.FindHash(0); !errors.Is(err, errIndexCorrupt) {
		t.Errorf("FindHash over bad offsets: %v", err)
	}
}

// The cache maps an index once for every caller, maps it again when the
// file at the path is another one, and holds at most maxCachedIndexes.
func TestIndexCache(t *testing.T) {
	c := &indexCache{m: map[string]*cachedIndex{}}
	path := packFixture(t, 200, "")
	a, err := c.get(path)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := c.get(path); b != a {
		t.Fatal("a second get mapped the index again")
	}
	// Replaced by another file (a new inode) at the same path.
	body, _ := os.ReadFile(path)
	tmp := path + ".new"
	if err := os.WriteFile(tmp, body, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if b, _ := c.get(path); b == a {
		t.Fatal("a replaced file answered from the old mapping")
	}
	// A removed one is not found, and the cache stays bounded.
	dir := t.TempDir()
	for i := range maxCachedIndexes + 5 {
		p := filepath.Join(dir, fmt.Sprintf("pack-%d.idx", i))
		if err := os.WriteFile(p, body, 0o444); err != nil {
			t.Fatal(err)
		}
		if _, err := c.get(p); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.m) > maxCachedIndexes {
		t.Fatalf("%d indexes cached, at most %d", len(c.m), maxCachedIndexes)
	}
	os.Remove(path)
	if _, err := c.get(path); !os.IsNotExist(err) {
		t.Fatalf("a removed index: %v", err)
	}
}

// The by-offset positions an index keeps once a delta named its base by
// offset (FindHash) are 4 bytes an object, and the cache held them for as
// many as 4,096 indexes: a session whose pushes fill its task's quota
// with packs of 2^20 tiny objects (some 30 MB each) had the daemon keep 4
// MB of heap per pack after one read of each, 10 GB of a project's quota
// making 1.3 GB of heap, held until the indexes left the cache. The cache
// bounds the positions its indexes hold (maxTableEntries), dropping the
// least recently used indexes past it.
func TestAttackIndexTablesBounded(t *testing.T) {
	defer func(n int) { maxTableEntries = n }(maxTableEntries)
	maxTableEntries = 250
	for range 4 {
		path := packFixture(t, 100, "")
		ix, err := indexes.get(path)
		if err != nil {
			t.Fatal(err)
		}
		o, err := ix.Offset(0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ix.FindHash(o); err != nil {
			t.Fatal(err)
		}
	}
	held := 0
	indexes.mu.Lock()
	for _, e := range indexes.m {
		held += len(e.ix.byOffset)
	}
	indexes.mu.Unlock()
	if held > maxTableEntries {
		t.Errorf("the cache's indexes hold %d by-offset positions, over the bound of %d", held, maxTableEntries)
	}
}
