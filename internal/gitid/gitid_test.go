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
		{strings.ToUpper(good), false}, {strings.ToUpper(good[:20]) + good[20:], false},
		{good[:39] + "A", false}, {good[:39], false}, {good + "0", false},
		{strings.Repeat("a", 64), false}, {"", false}, {good[:39] + "g", false},
	} {
		if Valid(tc.s) != tc.ok {
			t.Errorf("Valid(%q) = %v", tc.s, !tc.ok)
		}
		if _, err := ParseObjectID(tc.s); (err == nil) != tc.ok {
			t.Errorf("ParseObjectID(%q) = %v", tc.s, err)
		}
	}
	// Upper case is refused, never folded, with a word on what to give.
	if _, err := ParseObjectID(strings.ToUpper(good)); err == nil || !strings.Contains(err.Error(), "lowercase") || !strings.Contains(err.Error(), "rev-parse") {
		t.Errorf("upper case: %v", err)
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
		if err := CheckReferenceName(tc.s); (err == nil) != tc.ok {
			t.Errorf("CheckReferenceName(%q) = %v", tc.s, err)
		}
	}
}
