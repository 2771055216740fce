package gitd

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
)

// parseGitmodules reads a .gitmodules as git's config parser does, for
// the beyond-git walk (beyondgit.go): "\r\n" is read as "\n" everywhere
// (a lone "\r" is kept, which is what CVE-2025-48384 plays on); sections
// are [name] or [name "subsection"] (the old [name.sub] form too);
// values may be quoted, with \" \\ \n \t \b escapes, a backslash at the
// end of a line continuing it; ; and # start comments outside quotes. It
// returns the [submodule "NAME"] sections with their path and url values;
// what git could not parse is an error.
func parseGitmodules(data []byte) ([]*submodule, error) {
	data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, errors.New("a NUL byte")
	}
	p := &cfgParser{s: string(data), line: 1}
	var subs []*submodule
	byName := map[string]*submodule{}
	var cur *submodule // nil outside a [submodule "..."] section
	inSection := false
	for {
		p.skipSpace(true)
		if p.eof() {
			return subs, nil
		}
		c := p.peek()
		switch {
		case c == '\n':
			p.next()
		case c == ';' || c == '#':
			p.skipLine()
		case c == '[':
			name, sub, hasSub, err := p.section()
			if err != nil {
				return nil, err
			}
			inSection = true
			cur = nil
			if strings.EqualFold(name, "submodule") && hasSub {
				if cur = byName[sub]; cur == nil {
					cur = &submodule{name: sub}
					byName[sub] = cur
					subs = append(subs, cur)
				}
			}
		default:
			if !inSection {
				return nil, p.errorf("a variable outside any section")
			}
			key, val, err := p.variable()
			if err != nil {
				return nil, err
			}
			if cur != nil {
				switch strings.ToLower(key) {
				case "path":
					cur.path = append(cur.path, val)
				case "url":
					cur.url = append(cur.url, val)
				}
			}
		}
	}
}

type cfgParser struct {
	s    string
	i    int
	line int
}

func (p *cfgParser) eof() bool  { return p.i >= len(p.s) }
func (p *cfgParser) peek() byte { return p.s[p.i] }
func (p *cfgParser) next() byte {
	c := p.s[p.i]
	p.i++
	if c == '\n' {
		p.line++
	}
	return c
}

func (p *cfgParser) errorf(format string, a ...any) error {
	return fmt.Errorf("line %d: %s", p.line, fmt.Sprintf(format, a...))
}

// skipSpace skips blanks (and, at the start of a line, the UTF-8 BOM git
// also skips when first).
func (p *cfgParser) skipSpace(bom bool) {
	if bom && p.i == 0 && strings.HasPrefix(p.s, "\xef\xbb\xbf") {
		p.i = 3
	}
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t' || p.peek() == '\r' || p.peek() == '\f' || p.peek() == '\v') {
		p.next()
	}
}

func (p *cfgParser) skipLine() {
	for !p.eof() && p.next() != '\n' {
	}
}

func isKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

// section reads "[name]", "[name "sub"]" or "[name.sub]".
func (p *cfgParser) section() (name, sub string, hasSub bool, err error) {
	p.next() // [
	start := p.i
	for !p.eof() && (isKeyChar(p.peek()) || p.peek() == '.') {
		p.next()
	}
	name = p.s[start:p.i]
	if p.eof() {
		return "", "", false, p.errorf("an unterminated section header")
	}
	switch p.peek() {
	case ']':
		p.next()
		if name == "" {
			return "", "", false, p.errorf("an empty section name")
		}
		if dot := strings.IndexByte(name, '.'); dot >= 0 {
			return name[:dot], name[dot+1:], true, nil
		}
		return name, "", false, nil
	case ' ', '\t':
		if name == "" || strings.Contains(name, ".") {
			return "", "", false, p.errorf("a bad section name %q", name)
		}
		p.skipSpace(false)
		if p.eof() || p.next() != '"' {
			return "", "", false, p.errorf("a subsection name that is not quoted")
		}
		var b strings.Builder
		for {
			if p.eof() {
				return "", "", false, p.errorf("an unterminated subsection name")
			}
			c := p.next()
			switch c {
			case '\n':
				return "", "", false, p.errorf("a newline in a subsection name")
			case '"':
				if p.eof() || p.next() != ']' {
					return "", "", false, p.errorf("bytes after a subsection name")
				}
				return name, b.String(), true, nil
			case '\\':
				if p.eof() || p.peek() == '\n' {
					return "", "", false, p.errorf("a backslash at the end of a subsection name")
				}
				b.WriteByte(p.next())
			default:
				b.WriteByte(c)
			}
		}
	}
	return "", "", false, p.errorf("a bad character %q in a section header", p.peek())
}

// variable reads "key", "key = value" to the end of its line.
func (p *cfgParser) variable() (key, val string, err error) {
	start := p.i
	if !(p.peek() >= 'a' && p.peek() <= 'z' || p.peek() >= 'A' && p.peek() <= 'Z') {
		return "", "", p.errorf("a variable name must start with a letter")
	}
	for !p.eof() && isKeyChar(p.peek()) {
		p.next()
	}
	key = p.s[start:p.i]
	p.skipSpace(false)
	if p.eof() || p.peek() == '\n' {
		return key, "", nil // a boolean true
	}
	if p.peek() == ';' || p.peek() == '#' {
		p.skipLine()
		return key, "", nil
	}
	if p.next() != '=' {
		return "", "", p.errorf("bytes after variable %s", key)
	}
	p.skipSpace(false)
	// As git: blanks outside quotes count only once the value has begun,
	// and are written only when more of it follows.
	var b strings.Builder
	quoted := false
	space := 0
	for {
		if p.eof() {
			if quoted {
				return "", "", p.errorf("an unterminated quote in %s", key)
			}
			return key, b.String(), nil
		}
		c := p.next()
		if c == '\n' {
			if quoted {
				return "", "", p.errorf("a newline inside quotes in %s", key)
			}
			return key, b.String(), nil
		}
		if !quoted {
			if c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' {
				if b.Len() > 0 {
					space++
				}
				continue
			}
			if c == ';' || c == '#' {
				p.skipLine()
				return key, b.String(), nil
			}
		}
		b.WriteString(strings.Repeat(" ", space))
		space = 0
		switch c {
		case '"':
			quoted = !quoted
		case '\\':
			if p.eof() {
				return "", "", p.errorf("a backslash at the end of %s", key)
			}
			switch e := p.next(); e {
			case '\n': // a continued line
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'b':
				b.WriteByte('\b')
			case '\\', '"':
				b.WriteByte(e)
			default:
				return "", "", p.errorf("a bad escape \\%c in %s", e, key)
			}
		default:
			b.WriteByte(c)
		}
	}
}
