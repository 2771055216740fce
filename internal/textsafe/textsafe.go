// Package textsafe makes text from the bus host or another party safe to
// print on a terminal: every control character that could move the
// cursor, retitle the window, hide text, open a link or reorder what is
// shown is printed as an escape instead. One rule for every printer of the
// client: C0 controls (but newline and tab, which only break lines), DEL,
// C1 controls, and the bidirectional controls U+202A-U+202E and
// U+2066-U+2069 become \uXXXX; a byte that is not UTF-8 becomes \xNN.
//
// \uXXXX is also what JSON writes for the same character, so JSON passed
// through a Writer stays valid and decodes to the same strings: --json
// output has the controls as \uXXXX too.
package textsafe

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// unsafe reports whether r must not reach a terminal raw; newline and tab
// only break lines.
func unsafe(r rune) bool {
	switch {
	case r == '\n' || r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// Text returns s with every control escaped but newline and tab, as a
// Writer writes it.
func Text(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unsafe) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Writer escapes what is written through it as Text does: wrap a
// command's stdout and stderr in one. A UTF-8 sequence split across
// writes is held until its end arrives.
type Writer struct {
	w    io.Writer
	tail []byte // an incomplete UTF-8 sequence at the end of the last write
}

// NewWriter returns a Writer onto w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write implements io.Writer; it reports len(p) written when the escaped
// text was written whole.
func (w *Writer) Write(p []byte) (int, error) {
	buf := append(w.tail, p...)
	w.tail = nil
	// Hold back a trailing sequence that may yet complete.
	if k := incompleteTail(buf); k > 0 {
		w.tail = append([]byte(nil), buf[len(buf)-k:]...)
		buf = buf[:len(buf)-k]
	}
	if _, err := io.WriteString(w.w, Text(string(buf))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a held incomplete sequence (escaped: it never completed).
func (w *Writer) Flush() error {
	if len(w.tail) == 0 {
		return nil
	}
	t := w.tail
	w.tail = nil
	_, err := io.WriteString(w.w, Text(string(t)))
	return err
}

// incompleteTail returns how many bytes at the end of b start a UTF-8
// sequence that is not complete yet (0 if none).
func incompleteTail(b []byte) int {
	for k := 1; k <= 3 && k <= len(b); k++ {
		if utf8.RuneStart(b[len(b)-k]) {
			if !utf8.FullRune(b[len(b)-k:]) {
				return k
			}
			return 0
		}
	}
	return 0
}

// Clip keeps at most n bytes of s, marking a cut with "...": for quoting
// a caller's value in an error without echoing a huge one back.
func Clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
