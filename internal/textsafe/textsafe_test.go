package textsafe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"plain text, ünïcödé ✓":      "plain text, ünïcödé ✓",
		"\x1b]0;pwned\x07title":      `\u001b]0;pwned\u0007title`,
		"a\x1b[2Jb":                  `a\u001b[2Jb`,
		"csi\u009b31m":               `csi\u009b31m`,
		"del\x7f":                    `del\u007f`,
		"abc\u202edcba":              `abc\u202edcba`,
		"\u2066iso\u2069":            `\u2066iso\u2069`,
		"two\nlines\ttab":            "two\nlines\ttab",
		"bad \xff\x9b byte":          `bad \xff\x9b byte`,
		"\x1b]8;;http://x\x1b\\link": `\u001b]8;;http://x\u001b\link`,
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

// The Writer keeps lines, escapes controls, and holds a UTF-8 sequence
// split across writes until it completes.
func TestWriter(t *testing.T) {
	var out bytes.Buffer
	w := NewWriter(&out)
	in := "ok ✓\n\x1b[31mred\u009b\u202e\n"
	for i := 0; i < len(in); i++ {
		if _, err := w.Write([]byte{in[i]}); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	if want := "ok ✓\n\\u001b[31mred\\u009b\\u202e\n"; out.String() != want {
		t.Fatalf("got %q, want %q", out.String(), want)
	}
}

// JSON through a Writer stays valid and decodes to the same string; the
// controls that encoding/json leaves raw come out as \uXXXX.
func TestWriterKeepsJSON(t *testing.T) {
	s := "esc\x1b c1\u009b del\x7f bidi\u202e iso\u2068 nl\n"
	var out bytes.Buffer
	w := NewWriter(&out)
	if err := json.NewEncoder(w).Encode(map[string]string{"data": s}); err != nil {
		t.Fatal(err)
	}
	for _, esc := range []string{`\u001b`, `\u009b`, `\u007f`, `\u202e`, `\u2068`, `\n`} {
		if !strings.Contains(out.String(), esc) {
			t.Errorf("%q lacks %s", out.String(), esc)
		}
	}
	for _, r := range "\x1b\u009b\x7f\u202e\u2068" {
		if strings.ContainsRune(out.String(), r) {
			t.Errorf("%q has %U raw", out.String(), r)
		}
	}
	var back map[string]string
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || back["data"] != s {
		t.Fatalf("round trip: %q, %v", back["data"], err)
	}
}
