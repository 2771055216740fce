// Package bundle reads git bundles and brings their objects into a
// repository the checked way: the header is parsed here in Go and bounded,
// the pack goes through `git index-pack --strict --fix-thin` into a
// quarantine object directory, and only a pack that passed moves into the
// repository's objects. The server (gitd) and the client (bushost
// fetch-review) both use it, so a bundle is checked the same way on either
// side. It never moves a ref: that is its callers' job.
package bundle

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/textsafe"
	"io"
	"strings"
)

// Limits on the header, so that a hostile peer cannot make the reader hold
// an endless line or an endless list in memory.
const (
	// MaxLineBytes bounds one header line (an object id, a ref name, a
	// capability).
	MaxLineBytes = 4096
	// MaxHeaderBytes bounds the whole header.
	MaxHeaderBytes = 1 << 20
)

// Header is a bundle's header: what it claims to carry and what it needs.
type Header struct {
	Version       int
	Capabilities  map[string]string
	Prerequisites []string
	Refs          []Ref
}

// Ref is one ref line of a bundle.
type Ref struct {
	Name   string
	Commit string
}

// FormatError is a header that is not a bundle this project accepts. Its
// message says why in words a user can act on.
type FormatError struct{ Msg string }

func (e *FormatError) Error() string { return "malformed bundle: " + e.Msg }

// Classify names the refusal: BUNDLE_INVALID.
func (e *FormatError) Classify() *errdefs.Error {
	return errdefs.InvalidArgument(errdefs.BundleInvalid, "%s", e.Error())
}

func formatErr(format string, a ...any) error {
	return &FormatError{Msg: fmt.Sprintf(format, a...)}
}

// ReadHeader reads a bundle header from r up to and including the blank
// line that ends it, leaving r at the first byte of the pack. It accepts a
// v2 bundle, or a v3 bundle whose only capability is object-format=sha1,
// and any number of refs; callers that need exactly one check Refs.
func ReadHeader(r *bufio.Reader) (*Header, error) {
	total := 0
	first, err := readLine(r, &total)
	if err != nil {
		return nil, err
	}
	h := &Header{Capabilities: map[string]string{}}
	switch first {
	case "# v2 git bundle":
		h.Version = 2
	case "# v3 git bundle":
		h.Version = 3
	default:
		return nil, formatErr("not a v2 or v3 git bundle (first line %q)", clip(first))
	}
	for {
		line, err := readLine(r, &total)
		if err != nil {
			return nil, err
		}
		switch {
		case line == "":
			return h, nil
		case line[0] == '@':
			if h.Version != 3 || len(h.Prerequisites) > 0 || len(h.Refs) > 0 {
				return nil, formatErr("capability line %q outside a v3 header", clip(line))
			}
			k, v, _ := strings.Cut(line[1:], "=")
			if k != "object-format" {
				return nil, formatErr("unsupported bundle capability @%s (only @object-format=sha1 is accepted)", clip(k))
			}
			if v != "sha1" {
				return nil, formatErr("unsupported object format %q (only sha1)", clip(v))
			}
			h.Capabilities[k] = v
		case line[0] == '-':
			if len(h.Refs) > 0 {
				return nil, formatErr("prerequisite after a ref line")
			}
			oid, _, _ := strings.Cut(line[1:], " ")
			if !gitid.Valid(oid) {
				return nil, formatErr("bad prerequisite line %q", clip(line))
			}
			h.Prerequisites = append(h.Prerequisites, oid)
		default:
			oid, name, ok := strings.Cut(line, " ")
			if !ok || !gitid.Valid(oid) || name == "" {
				return nil, formatErr("bad ref line %q", clip(line))
			}
			h.Refs = append(h.Refs, Ref{Name: name, Commit: oid})
		}
	}
}

// readLine reads one '\n'-terminated line without the newline, refusing
// lines longer than MaxLineBytes and headers longer than MaxHeaderBytes
// before it has buffered them.
func readLine(r *bufio.Reader, total *int) (string, error) {
	var b []byte
	for {
		frag, err := r.ReadSlice('\n')
		b = append(b, frag...)
		*total += len(frag)
		if len(b) > MaxLineBytes+1 {
			return "", formatErr("header line longer than %d bytes", MaxLineBytes)
		}
		if *total > MaxHeaderBytes {
			return "", formatErr("header longer than %d bytes", MaxHeaderBytes)
		}
		if err == nil {
			return string(b[:len(b)-1]), nil
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			return "", formatErr("header ends before its blank line (truncated bundle)")
		}
		return "", err
	}
}

func clip(s string) string { return textsafe.Clip(s, 80) }
