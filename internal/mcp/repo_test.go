package mcp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// TestRepoConfined sends repo arguments that leave the working directory
// and checks each refusal's reason; those inside come back joined to it.
func TestRepoConfined(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "root")
	outside := filepath.Join(base, "outside")
	for _, d := range []string{filepath.Join(root, "sub"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../outside", filepath.Join(root, "sub", "up")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sv := &server{root: root}
	for rel, want := range map[string]errdefs.Reason{
		"":                        errdefs.ArgumentInvalid,
		"..":                      errdefs.ArgumentInvalid,
		"../outside":              errdefs.ArgumentInvalid,
		"sub/../../outside":       errdefs.ArgumentInvalid,
		"sub/..":                  errdefs.ArgumentInvalid,
		outside:                   errdefs.ArgumentInvalid,
		"/":                       errdefs.ArgumentInvalid,
		"a\x00b":                  errdefs.ArgumentInvalid,
		strings.Repeat("a/", 600): errdefs.ArgumentInvalid,
		"link":                    errdefs.PathUnsafe,
		"link/new":                errdefs.PathUnsafe,
		"./link":                  errdefs.PathUnsafe,
		"sub/up/new":              errdefs.PathUnsafe,
		"file/new":                errdefs.PathUnsafe,
	} {
		got, err := sv.repo(rel)
		if errdefs.ReasonOf(err) != want {
			t.Errorf("repo %q: %q, %v; want %s", rel, got, err, want)
		}
	}
	for rel, want := range map[string]string{
		".":          root,
		"w":          filepath.Join(root, "w"),
		"./sub//w/":  filepath.Join(root, "sub", "w"),
		"new/deeper": filepath.Join(root, "new", "deeper"),
		"sub":        filepath.Join(root, "sub"),
	} {
		if got, err := sv.repo(rel); err != nil || got != want {
			t.Errorf("repo %q: %q, %v; want %s", rel, got, err, want)
		}
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Errorf("outside holds %d entries", len(left))
	}
}
