package gitobj

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing/format/packfile"
)

// gitPack is a pack git writes of the history of a repository made in dir
// by commit, and the number of its objects.
func gitPack(t testing.TB, dir string, commit func(i int), flags ...string) ([]byte, int) {
	git(t, dir, nil, "init", "-q")
	for i := range 20 {
		commit(i)
		git(t, dir, nil, "add", "-A")
		git(t, dir, nil, "commit", "-q", "-m", fmt.Sprint(i))
	}
	objs := git(t, dir, nil, "rev-list", "--objects", "--no-object-names", "HEAD")
	return []byte(git(t, dir, []byte(objs), append([]string{"pack-objects", "--stdout", "-q", "--window=50"}, flags...)...)), strings.Count(objs, "\n")
}

// Every entry of a pack git wrote, with deltas by id and (with
// --delta-base-offset) by offset, reads with ReadEntry and inflates with
// Inflater to its declared size, a delta to a header DeltaSizes reads, and
// the stream ends at the pack's trailer.
func TestReadEntryStreams(t *testing.T) {
	for kind, flag := range map[int]string{EntryRefDelta: "--no-delta-base-offset", EntryOfsDelta: "--delta-base-offset"} {
		t.Run(flag, func(t *testing.T) { testReadEntry(t, kind, flag) })
	}
}

func testReadEntry(t *testing.T, kind int, flag string) {
	dir := t.TempDir()
	pack, n := gitPack(t, dir, func(i int) {
		os.WriteFile(filepath.Join(dir, "f"), []byte(strings.Repeat("common\n", 2000)+fmt.Sprintf("line %d\n", i)), 0o644)
	}, flag)
	br := bufio.NewReader(bytes.NewReader(pack[12:]))
	z := NewInflater(4 << 10)
	deltas := 0
	for range n {
		e, err := ReadEntry(br)
		if err != nil {
			t.Fatal(err)
		}
		var got int64
		var first []byte
		if err := z.Inflate(br, func(b []byte) error {
			if first == nil && len(b) > 0 {
				first = append([]byte(nil), b...)
			}
			got += int64(len(b))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if got != int64(e.Size) {
			t.Fatalf("entry of type %d inflates to %d, declares %d", e.Type, got, e.Size)
		}
		if e.Type == EntryOfsDelta || e.Type == EntryRefDelta {
			if e.Type != kind {
				t.Fatalf("%s wrote a delta of type %d", flag, e.Type)
			}
			deltas++
			if base, result := DeltaSizes(first); base <= 0 || result <= 0 {
				t.Fatalf("delta header %d %d", base, result)
			}
		}
	}
	if deltas == 0 {
		t.Fatal("git wrote no delta: the test reads none")
	}
	if rest, _ := io.ReadAll(br); len(rest) != HashLen {
		t.Fatalf("%d bytes after the last entry, want the %d of the trailer", len(rest), HashLen)
	}
	// A header cut short, and one whose size never ends.
	if _, err := ReadEntry(bytes.NewReader([]byte{0x93})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut header: %v", err)
	}
	if _, err := ReadEntry(bytes.NewReader(bytes.Repeat([]byte{0xff}, 20))); !errors.Is(err, ErrEntryHeader) {
		t.Fatalf("endless size: %v", err)
	}
	// Compressed data that does not inflate.
	if err := z.Inflate(bufio.NewReader(bytes.NewReader([]byte("not zlib at all"))), func([]byte) error { return nil }); !Corrupt(err) {
		t.Fatalf("not zlib: %v", err)
	}
}

// BenchmarkStreamEntries is what reading a pack's entries as a stream
// holds an entry: ReadEntry and Inflater against go-git's
// packfile.Scanner, each inflating every entry into nothing, on 200
// random 35,000-byte blobs (the figure in stream.go).
func BenchmarkStreamEntries(b *testing.B) {
	dir := b.TempDir()
	git(b, dir, nil, "init", "-q")
	var ids []string
	for range 200 {
		blob := make([]byte, 35000)
		rand.Read(blob)
		ids = append(ids, strings.TrimSpace(git(b, dir, blob, "hash-object", "-w", "--stdin")))
	}
	pack := []byte(git(b, dir, []byte(strings.Join(ids, "\n")+"\n"), "pack-objects", "--stdout", "-q"))
	perEntry := func(b *testing.B) {
		b.SetBytes(int64(len(pack)))
		b.ReportMetric(float64(len(ids)), "entries/op")
	}
	b.Run("inflater", func(b *testing.B) {
		perEntry(b)
		z := NewInflater(32 << 10)
		br := bufio.NewReaderSize(nil, 64<<10)
		for b.Loop() {
			br.Reset(bytes.NewReader(pack[12:]))
			for range ids {
				if _, err := ReadEntry(br); err != nil {
					b.Fatal(err)
				}
				if err := z.Inflate(br, func([]byte) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("gogit-scanner", func(b *testing.B) {
		perEntry(b)
		for b.Loop() {
			s := packfile.NewScanner(bytes.NewReader(pack))
			if _, _, err := s.Header(); err != nil {
				b.Fatal(err)
			}
			for range ids {
				if _, err := s.NextObjectHeader(); err != nil {
					b.Fatal(err)
				}
				if _, _, err := s.NextObject(io.Discard); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
