// Package treesnap records a directory tree, every directory and every
// file's SHA-256, so that a test can show that a refused operation left the
// tree as it found it.
package treesnap

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Vanished marks an entry that was listed but gone when read: the tree was
// changing under the walk, so the snapshot differs from any settled one and
// a caller that waits for the tree to settle goes on waiting.
const Vanished = "vanished while read"

// Take records the tree under root: "rel/" -> "dir" for each directory,
// "rel" -> the SHA-256 of each file, and Vanished for an entry removed
// between being listed and being read (a daemon finishing a cancelled call
// removes its temporary directory on its own time). A root it cannot read,
// or any other error, fails the test.
func Take(t testing.TB, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		if err != nil {
			if p != root && errors.Is(err, fs.ErrNotExist) {
				m[rel] = Vanished
				return nil
			}
			return err
		}
		if d.IsDir() {
			m[rel+"/"] = "dir"
			return nil
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			m[rel] = Vanished
			return nil
		}
		if err != nil {
			return err
		}
		h := sha256.Sum256(b)
		m[rel] = hex.EncodeToString(h[:])
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return m
}

// Diff lists, one per line and sorted, what was removed, changed or added
// between snapshots a and b; "" if nothing.
func Diff(a, b map[string]string) string {
	var out []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			out = append(out, "removed "+k)
		} else if w != v {
			out = append(out, "changed "+k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, "added "+k)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
