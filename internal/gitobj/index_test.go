package gitobj

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func git(t testing.TB, dir string, stdin []byte, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@localhost", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@localhost"}
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return string(out)
}

// Every object git's show-index lists is found at its offset with its
// CRC, absent ids are not found, with 32-bit offsets and with every
// offset in the 64-bit table; a file whose layout does not hold together
// is ErrCorrupt.
func TestIndex(t *testing.T) {
	dir := t.TempDir()
	git(t, dir, nil, "init", "-q")
	for i := range 300 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), []byte(fmt.Sprintf("file %d\n", i)), 0o644)
	}
	git(t, dir, nil, "add", "-A")
	git(t, dir, nil, "commit", "-q", "-m", "one")
	pack := filepath.Join(dir, "p.pack")
	objs := git(t, dir, nil, "rev-list", "--objects", "--no-object-names", "HEAD")
	packed := git(t, dir, []byte(objs), "pack-objects", "--stdout", "-q")
	os.WriteFile(pack, []byte(packed), 0o644)
	for _, version := range []string{"2", "2,0"} { // 2,0: every offset 64-bit
		t.Run(version, func(t *testing.T) {
			idx := filepath.Join(dir, "v"+strings.ReplaceAll(version, ",", "-")+".idx")
			git(t, dir, nil, "index-pack", "--index-version="+version, "-o", idx, pack)
			ix, err := Open(idx)
			if err != nil {
				t.Fatal(err)
			}
			if version == "2,0" && ix.LargeOffsets() != ix.Len() {
				t.Fatalf("%d of %d offsets in the 64-bit table", ix.LargeOffsets(), ix.Len())
			}
			b, _ := os.ReadFile(idx)
			lines := strings.Split(strings.TrimSpace(git(t, dir, b, "show-index")), "\n")
			if len(lines) != ix.Len() || ix.Len() != 302 {
				t.Fatalf("%d objects, show-index lists %d", ix.Len(), len(lines))
			}
			for _, l := range lines {
				f := strings.Fields(l) // offset id (crc)
				id, _ := hex.DecodeString(f[1])
				pos := ix.Find([HashLen]byte(id))
				if pos < 0 || hex.EncodeToString(func() []byte { h := ix.Name(pos); return h[:] }()) != f[1] {
					t.Fatalf("%s not found", f[1])
				}
				off, err := ix.Offset(pos)
				if want, _ := strconv.ParseInt(f[0], 10, 64); err != nil || off != want {
					t.Fatalf("%s at %d (%v), want %d", f[1], off, err, want)
				}
				if crc := fmt.Sprintf("(%08x)", ix.CRC32(pos)); crc != f[2] {
					t.Fatalf("%s crc %s, want %s", f[1], crc, f[2])
				}
				id[19] ^= 0xff
				if p := ix.Find([HashLen]byte(id)); p >= 0 && hex.EncodeToString(func() []byte { h := ix.Name(p); return h[:] }()) != hex.EncodeToString(id) {
					t.Fatalf("an absent id found at %d", p)
				}
			}
		})
	}
	good, _ := os.ReadFile(filepath.Join(dir, "v2.idx"))
	n := int(binary.BigEndian.Uint32(good[HeaderLen+4*255:]))
	for name, b := range map[string][]byte{
		"empty":     {},
		"short":     good[:MinBytes-1],
		"version 1": append([]byte("\xfftOc\x00\x00\x00\x01"), good[HeaderLen:]...),
		"truncated": good[:len(good)-7],
		"fan-out": func() []byte {
			c := bytes.Clone(good)
			binary.BigEndian.PutUint32(c[HeaderLen+4*10:], uint32(n+1))
			return c
		}(),
		"too long": append(bytes.Clone(good), 1, 2, 3, 4),
	} {
		p := filepath.Join(dir, "bad.idx")
		os.WriteFile(p, b, 0o644)
		if _, err := Open(p); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

// Entry headers as git writes them, and ones cut short or running past
// what a pack holds.
func TestParseEntry(t *testing.T) {
	base := [HashLen]byte{1, 2, 3}
	for name, tc := range map[string]struct {
		b    []byte
		ok   bool
		want Entry
	}{
		"small blob":        {[]byte{0x35}, true, Entry{Type: 3, Size: 5, Len: 1}},
		"tree of 300 bytes": {[]byte{0xac, 0x12}, true, Entry{Type: 2, Size: 300, Len: 2}},
		"offset delta":      {[]byte{0x6a, 0x91, 0x00}, true, Entry{Type: EntryOfsDelta, Size: 10, Len: 3, Back: (0x11+1)<<7 | 0}},
		"id delta":          {append([]byte{0x74}, base[:]...), true, Entry{Type: EntryRefDelta, Size: 4, Len: 1 + HashLen, Base: base}},
		"empty":             {nil, false, Entry{}},
		"size cut short":    {[]byte{0xb5}, false, Entry{}},
		"size past 64 bits": {append([]byte{0xb5}, bytes.Repeat([]byte{0xff}, 10)...), false, Entry{}},
		"offset cut short":  {[]byte{0x6a, 0x91}, false, Entry{}},
		"offset too far":    {append([]byte{0x6a}, bytes.Repeat([]byte{0xff}, 9)...), false, Entry{}},
		"id cut short":      {append([]byte{0x74}, base[:10]...), false, Entry{}},
	} {
		got, ok := ParseEntry(tc.b)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v %v", name, got, ok, tc.want, tc.ok)
		}
	}
}

// What AppendEntryHeader writes, ParseEntry reads back.
func TestEntryHeaderRoundTrip(t *testing.T) {
	for _, typ := range []int{1, 2, 3, 4} {
		for _, size := range []uint64{0, 15, 16, 2047, 2048, 1 << 32, 1<<60 - 1} {
			b := AppendEntryHeader(nil, typ, size)
			e, ok := ParseEntry(b)
			if !ok || e.Type != typ || e.Size != size || e.Len != len(b) {
				t.Errorf("type %d size %d: %x read as %+v %v", typ, size, b, e, ok)
			}
		}
	}
}
