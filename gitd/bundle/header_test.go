package bundle

import (
	"bufio"
	"errors"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/gitid"
)

const oid1 = "1111111111111111111111111111111111111111"
const oid2 = "2222222222222222222222222222222222222222"

func TestReadHeader(t *testing.T) {
	good := []struct {
		in      string
		version int
		refs    int
		prereqs int
	}{
		{"# v2 git bundle\n" + oid1 + " refs/heads/main\n\nPACK", 2, 1, 0},
		{"# v2 git bundle\n-" + oid2 + " a comment\n" + oid1 + " HEAD\n\nPACK", 2, 1, 1},
		{"# v3 git bundle\n@object-format=sha1\n" + oid1 + " HEAD\n\nPACK", 3, 1, 0},
		{"# v2 git bundle\n" + oid1 + " a\n" + oid2 + " b\n\n", 2, 2, 0},
	}
	for _, g := range good {
		r := bufio.NewReader(strings.NewReader(g.in))
		h, err := ReadHeader(r)
		if err != nil {
			t.Fatalf("%q: %v", g.in, err)
		}
		if h.Version != g.version || len(h.Refs) != g.refs || len(h.Prerequisites) != g.prereqs {
			t.Fatalf("%q: %+v", g.in, h)
		}
		rest, _ := r.ReadString(0)
		if !strings.HasPrefix(g.in, "# v") || !strings.HasSuffix(g.in, rest) {
			t.Fatalf("reader not left at the pack: %q", rest)
		}
	}
	bad := []struct{ in, want string }{
		{"", "truncated"},
		{"# v4 git bundle\n\n", "not a v2 or v3"},
		{"# v2 git bundle\n@object-format=sha1\n\n", "outside a v3 header"},
		{"# v3 git bundle\n@filter=blob:none\n\n", "@filter"},
		{"# v3 git bundle\n@object-format=sha256\n\n", "sha256"},
		{"# v2 git bundle\n-xyz\n\n", "bad prerequisite"},
		{"# v2 git bundle\n" + oid1 + "\n\n", "bad ref line"},
		{"# v2 git bundle\n" + "ABCDEF" + oid1[6:] + " HEAD\n\n", "bad ref line"},
		// Hex in upper or mixed case is no object id (gitid).
		{"# v2 git bundle\n" + strings.ToUpper(oid2[:20]) + oid2[20:] + "\n\n", "bad ref line"},
		{"# v2 git bundle\n-" + "AbCdEf" + oid2[6:] + "\n" + oid1 + " HEAD\n\n", "bad prerequisite"},
		{"# v2 git bundle\n" + oid1 + " HEAD\n-" + oid2 + "\n\n", "prerequisite after a ref"},
		{"# v2 git bundle\n" + oid1 + " refs/heads/" + strings.Repeat("x", 1<<20) + "\n\n", "header line longer"},
		{"# v2 git bundle\n" + strings.Repeat("-"+oid1+"\n", 30000) + "\n", "header longer"},
		{"# v2 git bundle\n" + oid1 + " HEAD\n", "truncated"},
	}
	for _, b := range bad {
		_, err := ReadHeader(bufio.NewReader(strings.NewReader(b.in)))
		var fe *FormatError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%.60q: %v, want FormatError with %q", b.in, err, b.want)
		}
	}
}

// countingReader fails the test's bound if the parser reads far past a
// refused line.
type countingReader struct{ n int }

func (c *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	c.n += len(p)
	return len(p), nil
}

func TestReadHeaderEndlessLineIsBounded(t *testing.T) {
	cr := &countingReader{}
	r := bufio.NewReader(&prefixReader{prefix: "# v2 git bundle\n", r: cr})
	if _, err := ReadHeader(r); err == nil {
		t.Fatal("endless line accepted")
	}
	if cr.n > 2*MaxLineBytes+8192 {
		t.Fatalf("read %d bytes of an endless line", cr.n)
	}
}

type prefixReader struct {
	prefix string
	r      *countingReader
}

func (p *prefixReader) Read(b []byte) (int, error) {
	if p.prefix != "" {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.r.Read(b)
}

func FuzzReadHeader(f *testing.F) {
	f.Add("# v2 git bundle\n" + oid1 + " refs/heads/main\n\nPACK")
	f.Add("# v3 git bundle\n@object-format=sha1\n-" + oid2 + "\n" + oid1 + " HEAD\n\n")
	f.Add("# v3 git bundle\n@filter=blob:none\n\n")
	f.Fuzz(func(t *testing.T, in string) {
		h, err := ReadHeader(bufio.NewReader(strings.NewReader(in)))
		if err != nil {
			return
		}
		for _, r := range h.Refs {
			if !gitid.Valid(r.Commit) || r.Name == "" {
				t.Fatalf("accepted ref %+v", r)
			}
		}
		for _, p := range h.Prerequisites {
			if !gitid.Valid(p) {
				t.Fatalf("accepted prerequisite %q", p)
			}
		}
		if h.Version != 2 && h.Version != 3 {
			t.Fatalf("version %d", h.Version)
		}
	})
}
