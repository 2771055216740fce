package supervisor

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWatcherRecursesAndIgnoresGit(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"src/old", ".git/objects", "src/node_modules/pkg"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	w, err := newWatcher(root, []string{"src"}, Default().Ignore, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	signalled := func() bool {
		select {
		case <-w.dirty:
			return true
		case <-time.After(300 * time.Millisecond):
			return false
		}
	}
	drain := func() {
		for signalled() {
		}
	}

	for _, tc := range []struct {
		name string
		path string
		want bool
	}{
		{"file in an existing dir", "src/old/a.txt", true},
		{"ignored dependency", "src/node_modules/pkg/index.js", false},
		{"outside the watched trees", "README", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			drain()
			writeFile(t, filepath.Join(root, tc.path), "x")
			if got := signalled(); got != tc.want {
				t.Errorf("signalled = %v, want %v", got, tc.want)
			}
		})
	}

	// A directory made after start is watched, however deep, so that a
	// later edit inside it is seen.
	drain()
	if err := os.MkdirAll(filepath.Join(root, "src", "new", "deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !signalled() {
		t.Fatal("new directory not seen")
	}
	drain()
	writeFile(t, filepath.Join(root, "src", "new", "deep", "f.txt"), "x")
	if !signalled() {
		t.Error("edit inside a new nested directory not seen")
	}

	// An overflow is answered by a rescan, which signals.
	drain()
	w.rescan()
	if !signalled() {
		t.Error("rescan did not signal")
	}
}
