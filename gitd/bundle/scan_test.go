package bundle

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"

	"github.com/bushost/bushost/internal/gitobj"
)

// packRepo is a scratch bare repository that makes packs with real git.
type packRepo struct {
	t   *testing.T
	git *gitcmd.Runner
	dir string
}

func newPackRepo(t *testing.T) *packRepo {
	t.Helper()
	g, err := gitcmd.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := &packRepo{t: t, git: g, dir: t.TempDir()}
	if err := g.Run(context.Background(), gitcmd.Cmd{Sub: "init", Flags: []string{"--bare", "--quiet"}, Args: []string{p.dir}}); err != nil {
		t.Fatal(err)
	}
	return p
}

// object writes an object of type typ (literally: any content) and returns its id.
func (p *packRepo) object(typ string, content []byte) string {
	p.t.Helper()
	id, err := p.git.Line(context.Background(), gitcmd.Cmd{GitDir: p.dir, Sub: "hash-object",
		Flags: []string{"-w", "--literally", "--stdin", "-t" + typ}, Stdin: bytes.NewReader(content)}, gitcmd.MaxLine)
	if err != nil {
		p.t.Fatal(err)
	}
	return id
}

// pack packs ids (objects of the repository) with deltas, bases first.
func (p *packRepo) pack(ids ...string) []byte {
	p.t.Helper()
	var out bytes.Buffer
	err := p.git.Run(context.Background(), gitcmd.Cmd{GitDir: p.dir, Sub: "pack-objects",
		Flags: []string{"--stdout", "--delta-base-offset", "-q"}, Stdin: strings.NewReader(strings.Join(ids, "\n") + "\n"), Stdout: &out})
	if err != nil {
		p.t.Fatal(err)
	}
	return out.Bytes()
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestScanPassesGoodPack(t *testing.T) {
	p := newPackRepo(t)
	base := randomBytes(200 << 10)
	ids := []string{
		p.object("blob", base),
		p.object("blob", append(append([]byte(nil), base...), "one more line\n"...)),
		p.object("blob", []byte("small\n")),
		p.object("commit", []byte("tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor A <a@b> 1 +0000\ncommitter A <a@b> 1 +0000\n\nmsg\n")),
	}
	pack := p.pack(ids...)
	var out bytes.Buffer
	lim := Limits{BlobBytes: 1 << 20, CommitBytes: 1 << 10, TreeBytes: 1 << 10}
	if err := scanPack(bytes.NewReader(pack), &out, lim, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), pack) {
		t.Fatalf("the pack changed on its way: %d bytes in, %d out", len(pack), out.Len())
	}
}

func TestScanRefuses(t *testing.T) {
	p := newPackRepo(t)
	lim := Limits{BlobBytes: 1 << 20, CommitBytes: 64 << 10, TreeBytes: 128 << 10}
	hugeMsg := append([]byte("tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor A <a@b> 1 +0000\ncommitter A <a@b> 1 +0000\n\n"), bytes.Repeat([]byte("x"), 100<<10)...)
	for _, tc := range []struct {
		name string
		ids  func() []string
		want string // the refused type
		flag string
	}{
		{"blob", func() []string { return []string{p.object("blob", bytes.Repeat([]byte("a"), 2<<20))} }, "blob", "--max-object-bytes"},
		{"commit", func() []string { return []string{p.object("commit", hugeMsg)} }, "commit", "--max-commit-bytes"},
		{"tag", func() []string {
			return []string{p.object("tag", append([]byte("object 4b825dc642cb6eb9a060e54bf8d69288fbee4904\ntype tree\ntag t\ntagger A <a@b> 1 +0000\n\n"), bytes.Repeat([]byte("y"), 100<<10)...))}
		}, "tag", "--max-commit-bytes"},
		{"tree", func() []string { return []string{p.object("tree", bytes.Repeat([]byte("z"), 200<<10))} }, "tree", "--max-tree-bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pack := p.pack(tc.ids()...)
			var out bytes.Buffer
			err := scanPack(bytes.NewReader(pack), &out, lim, nil)
			e, ok := errdefs.As(err)
			if !ok || e.Reason != errdefs.ObjectTooLarge || e.Metadata["type"] != tc.want || e.Metadata["flag"] != tc.flag || e.Metadata["limit"] == "" {
				t.Fatalf("got %v (%+v)", err, e)
			}
			if !strings.Contains(e.Message, "pack entry") || !strings.Contains(e.Message, tc.flag) {
				t.Fatalf("message does not name the entry and the limit: %s", e.Message)
			}
			// git never saw the refused entry's header, nor the
			// trailer: what it got is a strict prefix of the pack.
			if out.Len() >= len(pack)-20 || !bytes.HasPrefix(pack, out.Bytes()) {
				t.Fatalf("%d of %d bytes passed", out.Len(), len(pack))
			}
		})
	}
}

func TestScanMalformed(t *testing.T) {
	p := newPackRepo(t)
	pack := p.pack(p.object("blob", []byte(strings.Repeat("some content\n", 100))))
	lim := Limits{BlobBytes: 1 << 20, CommitBytes: 1 << 20, TreeBytes: 1 << 20}
	// The blob's header cut to one byte: what follows is no zlib stream.
	corrupt := append([]byte(nil), pack...)
	corrupt[12] &^= 0x80
	for name, in := range map[string][]byte{
		"truncated":     pack[:len(pack)-30],
		"not a pack":    []byte("PACX\x00\x00\x00\x02\x00\x00\x00\x01"),
		"bad version":   []byte("PACK\x00\x00\x00\x09\x00\x00\x00\x01"),
		"corrupt entry": corrupt,
	} {
		err := scanPack(bytes.NewReader(in), io.Discard, lim, nil)
		var pe *PackError
		if !errors.As(err, &pe) {
			t.Errorf("%s: got %v, want a PackError", name, err)
		}
	}
}

// A reader that never returns until closed.
type blockedReader struct{ closed chan struct{} }

func (b *blockedReader) Read([]byte) (int, error) { <-b.closed; return 0, io.ErrClosedPipe }
func (b *blockedReader) Close() error             { close(b.closed); return nil }

// IndexPack with a source that blocks forever returns at its timeout, with
// or without the object checks, and leaves nothing reading.
func TestIndexPackBlockedReaderReturns(t *testing.T) {
	p := newPackRepo(t)
	for _, lim := range []Limits{{}, {BlobBytes: 1 << 20, CommitBytes: 1 << 20, TreeBytes: 1 << 20}} {
		q, err := NewQuarantine(filepath.Join(p.dir, "objects"))
		if err != nil {
			t.Fatal(err)
		}
		q.Limits = lim
		// Ended by the runner's timeout, then by the caller's context.
		for _, run := range []func(*blockedReader) error{
			func(src *blockedReader) error {
				_, err := q.IndexPack(context.Background(), p.git.WithTimeout(500*time.Millisecond), p.dir, src)
				return err
			},
			func(src *blockedReader) error {
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				defer cancel()
				_, err := q.IndexPack(ctx, p.git, p.dir, src)
				return err
			},
		} {
			src := &blockedReader{closed: make(chan struct{})}
			start := time.Now()
			if err := run(src); err == nil {
				t.Fatal("index-pack of nothing succeeded")
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("returned after %s", d)
			}
			select {
			case <-src.closed:
			default:
				t.Fatal("the source was not closed")
			}
		}
		q.Remove()
	}
	ents, _ := os.ReadDir(filepath.Join(p.dir, "objects"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), QuarantinePrefix) {
			t.Fatalf("left %s", e.Name())
		}
	}
}

// rawEntry is one entry of a pack built by hand: git never writes a small
// delta with a huge result, a hostile peer does.
type rawEntry struct {
	typ     objType
	data    []byte // inflated content (a delta's instructions)
	ofsBack int    // OFS_DELTA: index of the base entry
	refBase string // REF_DELTA: base id
}

func buildPack(entries []rawEntry) []byte {
	var b bytes.Buffer
	b.WriteString("PACK\x00\x00\x00\x02")
	binary.Write(&b, binary.BigEndian, uint32(len(entries)))
	offs := make([]int, len(entries))
	for i, e := range entries {
		offs[i] = b.Len()
		b.Write(gitobj.AppendEntryHeader(nil, int(e.typ), uint64(len(e.data))))
		switch e.typ {
		case objOfsDelta:
			rel := offs[i] - offs[e.ofsBack]
			var enc []byte
			enc = append(enc, byte(rel&0x7f))
			for rel >>= 7; rel > 0; rel >>= 7 {
				rel--
				enc = append([]byte{byte(0x80 | rel&0x7f)}, enc...)
			}
			b.Write(enc)
		case objRefDelta:
			id, _ := hex.DecodeString(e.refBase)
			b.Write(id)
		}
		zw := zlib.NewWriter(&b)
		zw.Write(e.data)
		zw.Close()
	}
	sum := sha1.Sum(b.Bytes())
	b.Write(sum[:])
	return b.Bytes()
}

// copyDelta is a delta that copies a base of n bytes times times.
func copyDelta(n, times int) []byte {
	varint := func(v int) []byte {
		var out []byte
		for {
			c := byte(v & 0x7f)
			v >>= 7
			if v == 0 {
				return append(out, c)
			}
			out = append(out, c|0x80)
		}
	}
	d := append(varint(n), varint(n*times)...)
	for i := 0; i < times; i++ {
		// copy offset 0, size n (n < 64K: two size bytes)
		d = append(d, 0x80|0x10|0x20, byte(n), byte(n>>8))
	}
	return d
}

func TestScanDeltas(t *testing.T) {
	p := newPackRepo(t)
	lim := Limits{BlobBytes: 1 << 20, CommitBytes: 64 << 10, TreeBytes: 128 << 10}
	base := randomBytes(60 << 10)
	inRepo := p.object("blob", base)
	commitBase := p.object("commit", []byte("tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor A <a@b> 1 +0000\ncommitter A <a@b> 1 +0000\n\nm\n"))
	bases := func(ids []string) (map[string]string, error) {
		return objectTypes(context.Background(), p.git, p.dir, nil, ids)
	}
	for _, tc := range []struct {
		name    string
		entries []rawEntry
		reason  string // "" for a pass
	}{
		{"ofs delta over the blob limit", []rawEntry{{typ: objBlob, data: base}, {typ: objOfsDelta, data: copyDelta(len(base), 20), ofsBack: 0}}, "blob"},
		{"ofs delta under it", []rawEntry{{typ: objBlob, data: base}, {typ: objOfsDelta, data: copyDelta(len(base), 2), ofsBack: 0}}, ""},
		{"chain of deltas", []rawEntry{{typ: objBlob, data: base}, {typ: objOfsDelta, data: copyDelta(len(base), 1), ofsBack: 0}, {typ: objOfsDelta, data: copyDelta(len(base), 30), ofsBack: 1}}, "blob"},
		{"ref delta over every limit", []rawEntry{{typ: objRefDelta, data: copyDelta(len(base), 20), refBase: inRepo}}, "delta"},
		{"ref delta on a blob of the repository, under its limit", []rawEntry{{typ: objRefDelta, data: copyDelta(len(base), 10), refBase: inRepo}}, ""},
		{"ref delta on a commit, over the commit limit", []rawEntry{{typ: objRefDelta, data: copyDelta(100, 1000), refBase: commitBase}}, "commit"},
		{"ref delta, base not in the repository", []rawEntry{{typ: objRefDelta, data: copyDelta(len(base), 2), refBase: strings.Repeat("ab", 20)}}, "unknown"},
		{"ofs delta on an unknown ref delta", []rawEntry{{typ: objRefDelta, data: copyDelta(100, 1), refBase: strings.Repeat("ab", 20)}, {typ: objOfsDelta, data: copyDelta(100, 1000), ofsBack: 0}}, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pack := buildPack(tc.entries)
			var out bytes.Buffer
			err := scanPack(bytes.NewReader(pack), &out, lim, bases)
			if tc.reason == "" {
				if err != nil || !bytes.Equal(out.Bytes(), pack) {
					t.Fatalf("refused a good pack: %v", err)
				}
				return
			}
			e, ok := errdefs.As(err)
			if !ok || e.Reason != errdefs.ObjectTooLarge {
				t.Fatalf("got %v", err)
			}
			if tc.reason == "unknown" {
				if !strings.Contains(e.Message, "not in the repository") {
					t.Fatalf("got %v", err)
				}
			} else if e.Metadata["type"] != tc.reason {
				t.Fatalf("got %v (%v)", err, e.Metadata)
			}
			// The trailer never reached git, so it never resolved a delta.
			if out.Len() > len(pack)-20 {
				t.Fatalf("%d of %d bytes passed", out.Len(), len(pack))
			}
		})
	}
}

func TestScanObjectCount(t *testing.T) {
	p := newPackRepo(t)
	pack := p.pack(p.object("blob", []byte("a\n")), p.object("blob", []byte("b\n")), p.object("blob", []byte("c\n")))
	var out bytes.Buffer
	err := scanPack(bytes.NewReader(pack), &out, Limits{Objects: 2}, nil)
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.PackTooManyObjects || e.Metadata["limit"] != "2" || out.Len() != 0 {
		t.Fatalf("got %v, %d bytes passed", err, out.Len())
	}
	out.Reset()
	if err := scanPack(bytes.NewReader(pack), &out, Limits{Objects: 3}, nil); err != nil || !bytes.Equal(out.Bytes(), pack) {
		t.Fatalf("3 of 3: %v", err)
	}
}

// The sum of a pack's declared inflated sizes is bounded, a delta counted
// by its result: deltas each under the object bound, against one base,
// are refused once together they pass it, before the trailer (so before
// git builds any of them); a pack at the bound passes.
func TestScanInflatedSum(t *testing.T) {
	base := randomBytes(60 << 10)
	entries := []rawEntry{{typ: objBlob, data: base}}
	for i := 0; i < 10; i++ {
		entries = append(entries, rawEntry{typ: objOfsDelta, data: copyDelta(len(base), 10), ofsBack: 0})
	}
	pack := buildPack(entries)
	total := int64(len(base)) * (1 + 10*10)
	lim := Limits{BlobBytes: 1 << 20, CommitBytes: 1 << 20, TreeBytes: 1 << 20}
	var out bytes.Buffer
	lim.InflatedBytes = total - 1
	err := scanPack(bytes.NewReader(pack), &out, lim, nil)
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.PushInflatedTooLarge || e.Metadata["entry"] != "11" || e.Metadata["size"] != fmt.Sprint(total) {
		t.Fatalf("one byte over: %v", err)
	}
	if out.Len() > len(pack)-20 {
		t.Fatalf("%d of %d bytes passed", out.Len(), len(pack))
	}
	out.Reset()
	lim.InflatedBytes = total
	if err := scanPack(bytes.NewReader(pack), &out, lim, nil); err != nil || !bytes.Equal(out.Bytes(), pack) {
		t.Fatalf("at the bound: %v", err)
	}
}

// A REF_DELTA's base counts toward the sum once, by the size its delta
// declares: index-pack reads it (and appends one the repository holds), so
// deltas of a few bytes against large objects of the repository are not
// free. A base size past what a 64-bit number holds, which would lower
// the sum, is refused as a malformed delta.
func TestScanInflatedSumCountsRefBases(t *testing.T) {
	const baseSize = 1 << 20
	a, b := strings.Repeat("ab", 20), strings.Repeat("cd", 20)
	one := copyDelta(baseSize, 0) // a delta of a 1 MiB base to nothing
	pack := buildPack([]rawEntry{
		{typ: objRefDelta, data: one, refBase: a},
		{typ: objRefDelta, data: one, refBase: a},
		{typ: objRefDelta, data: one, refBase: b},
	})
	lim := Limits{BlobBytes: 1 << 20, CommitBytes: 1 << 20, TreeBytes: 1 << 20, InflatedBytes: 2*baseSize - 1}
	var out bytes.Buffer
	err := scanPack(bytes.NewReader(pack), &out, lim, nil)
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.PushInflatedTooLarge || e.Metadata["entry"] != "3" || e.Metadata["size"] != fmt.Sprint(2*baseSize) {
		t.Fatalf("two bases of 1 MiB under a bound of 2 MiB - 1: %v", err)
	}
	if out.Len() > len(pack)-20 {
		t.Fatalf("%d of %d bytes passed", out.Len(), len(pack))
	}
	out.Reset()
	lim.InflatedBytes = 2 * baseSize
	if err := scanPack(bytes.NewReader(pack), &out, lim, nil); err != nil || !bytes.Equal(out.Bytes(), pack) {
		t.Fatalf("at the bound (base a counted once): %v", err)
	}

	// 2^63 as a varint: ten bytes, the last with bit 63 set.
	negative := append(bytes.Repeat([]byte{0x80}, 9), 0x01, 0x00)
	bad := buildPack([]rawEntry{{typ: objRefDelta, data: negative, refBase: a}})
	out.Reset()
	var pe *PackError
	if err := scanPack(bytes.NewReader(bad), &out, lim, nil); !errors.As(err, &pe) || !strings.Contains(pe.Msg, "delta without a header") {
		t.Fatalf("a base size of 2^63: %v", err)
	}
}

// BenchmarkScanPack is the scanner's own cost on a pack like the full push
// of `make bench` (200 random 35,000-byte blobs), against a plain copy.
func BenchmarkScanPack(b *testing.B) {
	g, err := gitcmd.New(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	p := &packRepo{git: g, dir: b.TempDir()}
	if err := g.Run(context.Background(), gitcmd.Cmd{Sub: "init", Flags: []string{"--bare", "--quiet"}, Args: []string{p.dir}}); err != nil {
		b.Fatal(err)
	}
	var ids []string
	for i := 0; i < 200; i++ {
		id, err := g.Line(context.Background(), gitcmd.Cmd{GitDir: p.dir, Sub: "hash-object",
			Flags: []string{"-w", "--stdin", "-tblob"}, Stdin: bytes.NewReader(randomBytes(35000))}, gitcmd.MaxLine)
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, id)
	}
	var pack bytes.Buffer
	if err := g.Run(context.Background(), gitcmd.Cmd{GitDir: p.dir, Sub: "pack-objects", Flags: []string{"--stdout", "-q"},
		Stdin: strings.NewReader(strings.Join(ids, "\n") + "\n"), Stdout: &pack}); err != nil {
		b.Fatal(err)
	}
	lim := Limits{BlobBytes: 100 << 20, CommitBytes: 1 << 20, TreeBytes: 16 << 20, Objects: 1 << 20}
	b.Run("scan", func(b *testing.B) {
		b.SetBytes(int64(pack.Len()))
		for b.Loop() {
			if err := scanPack(bytes.NewReader(pack.Bytes()), io.Discard, lim, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(pack.Len()))
		for b.Loop() {
			io.Copy(io.Discard, bytes.NewReader(pack.Bytes()))
		}
	})
}
