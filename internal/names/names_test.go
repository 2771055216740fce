package names

import (
	"regexp"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	good := []string{"a", "acme", "web-site", "p.1", "t_2", "0", strings.Repeat("a", 63)}
	for _, s := range good {
		if err := Check("task", s); err != nil {
			t.Errorf("Check(%q) = %v", s, err)
		}
	}
	bad := []string{"", "../x", "a/b", "..", "a..b", ".a", "-a", "_a", "A", "aB", "a b", "a\n",
		strings.Repeat("a", 64), strings.Repeat("a", 200), "ünï", "tаsk" /* Cyrillic a */, "a.lock", "a.", "a\x00b", "a\\b"}
	for _, s := range bad {
		if err := Check("task", s); err == nil {
			t.Errorf("Check(%q) accepted", s)
		} else if !strings.Contains(err.Error(), "invalid task name") {
			t.Errorf("Check(%q) = %v", s, err)
		}
	}
}

func TestPathsAndRefs(t *testing.T) {
	if r, err := WorkRef("t1"); err != nil || r != "refs/work/t1" {
		t.Fatalf("WorkRef = %q, %v", r, err)
	}
	if _, err := ReviewRef("a/b"); err == nil {
		t.Fatal("ReviewRef accepted a/b")
	}
	if err := CheckScope(Scope{Business: "a", Project: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := CheckScope(Scope{Business: "a", Project: "b", Task: "../c"}); err == nil {
		t.Fatal("CheckScope accepted ../c")
	}
}

func FuzzCheck(f *testing.F) {
	for _, s := range []string{"a", "../x", "a..b", "a.lock", strings.Repeat("z", 70)} {
		f.Add(s)
	}
	re := regexp.MustCompile(Pattern)
	f.Fuzz(func(t *testing.T, s string) {
		if Matches(s) != re.MatchString(s) {
			t.Fatalf("Matches(%q) = %v, the rule's regexp says %v", s, Matches(s), re.MatchString(s))
		}
		if Check("task", s) != nil {
			return
		}
		ref, err := WorkRef(s)
		if err != nil {
			t.Fatalf("valid name %q gave bad ref: %v", s, err)
		}
		if strings.Contains(s, "/") || strings.Contains(s, "..") || strings.HasSuffix(ref, ".lock") || s[0] == '.' || s[0] == '-' {
			t.Fatalf("accepted %q", s)
		}
	})
}
