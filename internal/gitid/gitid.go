// Package gitid is the one validator of git object ids and reference names
// for the whole project: the bus host is SHA-1 only (40 lowercase hex
// digits), and the refs it moves are full names under refs/. The broker,
// the bundle reader, gitd and the reader of git's storage (gitobj) all
// call it; it imports nothing of bushost, so any package may.
//
// An object id is canonical or it is not one: upper-case or mixed-case hex
// is refused wherever an id enters (a request, a bundle's header, a ref
// file, a commit's tree and parent lines), never folded to lower case.
// git itself reads hex in either case, but writes only lower case, so an
// id in upper case comes from a person typing it or from a crafted object;
// folding it would make two spellings of one id, and records and refs
// that compare ids as strings would disagree about them. The refusal says
// to give the id as git prints it (git rev-parse).
package gitid

import (
	"fmt"
	"strings"

	"github.com/bushost/bushost/internal/textsafe"
)

// ObjectID is a full SHA-1 object id: 40 lowercase hexadecimal digits.
type ObjectID string

// Zero is the all-zero id git's update-ref takes as "the ref must not
// exist".
const Zero ObjectID = "0000000000000000000000000000000000000000"

// HexLen is the length of an ObjectID.
const HexLen = 40

// Valid reports whether s is a full lowercase SHA-1 object id.
func Valid(s string) bool {
	return len(s) == HexLen && strings.Trim(s, "0123456789abcdef") == ""
}

// ParseObjectID returns s as an ObjectID, or an error that quotes at most
// 80 bytes of it (and, for hex in upper case, says to give it in lower).
func ParseObjectID(s string) (ObjectID, error) {
	if !Valid(s) {
		if Valid(strings.ToLower(s)) {
			return "", fmt.Errorf("%q is not a full object id: ids are 40 lowercase hex digits, as git rev-parse prints them", clip(s))
		}
		return "", fmt.Errorf("%q is not a full object id (40 lowercase hex digits)", clip(s))
	}
	return ObjectID(s), nil
}

// IsZero reports whether o is Zero or empty.
func (o ObjectID) IsZero() bool { return o == "" || o == Zero }

// ReferenceName is a full ref name: refs/ and components git accepts
// (git check-ref-format, without its --allow-onelevel and --normalize).
type ReferenceName string

// maxRefBytes bounds a ref name.
const maxRefBytes = 1024

// CheckReferenceName returns why s is not a full ref name, or nil.
func CheckReferenceName(s string) error {
	bad := func(why string) error { return fmt.Errorf("ref %q: %s", clip(s), why) }
	if len(s) > maxRefBytes {
		return bad("too long")
	}
	if !strings.HasPrefix(s, "refs/") {
		return bad("must start with refs/")
	}
	if strings.Contains(s, "..") || strings.Contains(s, "@{") || strings.HasSuffix(s, ".") {
		return bad(`must not contain ".." or "@{", nor end in "."`)
	}
	for _, c := range strings.Split(s, "/") {
		if c == "" || c[0] == '.' || strings.HasSuffix(c, ".lock") {
			return bad("each part between '/' is non-empty, starts with no '.' and does not end in .lock")
		}
		for i := 0; i < len(c); i++ {
			switch b := c[i]; {
			case b < 0x20 || b == 0x7f, b == ' ', b == '~', b == '^', b == ':', b == '?', b == '*', b == '[', b == '\\':
				return bad("has a character git refuses in a ref")
			}
		}
	}
	return nil
}

func clip(s string) string { return textsafe.Clip(s, 80) }
