package gitid

import (
	"strings"
	"testing"
)

func TestObjectID(t *testing.T) {
	good := strings.Repeat("0123456789abcdef", 3)[:40]
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{good, true}, {string(Zero), true},
		{strings.ToUpper(good), false}, {good[:39], false}, {good + "0", false},
		{strings.Repeat("a", 64), false}, {"", false}, {good[:39] + "g", false},
	} {
		if Valid(tc.s) != tc.ok {
			t.Errorf("Valid(%q) = %v", tc.s, !tc.ok)
		}
		if _, err := ParseObjectID(tc.s); (err == nil) != tc.ok {
			t.Errorf("ParseObjectID(%q) = %v", tc.s, err)
		}
	}
}

func TestReferenceName(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"refs/heads/main", true}, {"refs/work/t1", true}, {"refs/work/a.b-c_d", true},
		{"HEAD", false}, {"refs/heads/", false}, {"refs//x", false}, {"refs/heads/a..b", false},
		{"refs/heads/.x", false}, {"refs/heads/x.lock", false}, {"refs/heads/x.", false},
		{"refs/heads/a b", false}, {"refs/heads/a~1", false}, {"refs/heads/a@{1}", false},
		{"refs/heads/a\nb", false}, {"refs/" + strings.Repeat("x", 1100), false},
	} {
		if _, err := ParseReferenceName(tc.s); (err == nil) != tc.ok {
			t.Errorf("ParseReferenceName(%q) = %v", tc.s, err)
		}
	}
}
