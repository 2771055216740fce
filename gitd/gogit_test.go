package gitd

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-git/go-billy/v5/osfs"
)

// A pack index is read through a buffer (go-git reads it field by field);
// reads and seeks through the buffer see the file as it is, and every
// other file, or an index opened for writing, is the filesystem's own.
func TestBufferedIndexes(t *testing.T) {
	dir := t.TempDir()
	body := make([]byte, 3*indexBuffer+17)
	for i := range body {
		body[i] = byte(i * 7)
	}
	for _, name := range []string{"pack-1.idx", "pack-1.pack"} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := bufferedIndexes{osfs.New(dir)}
	f, err := fs.Open("pack-1.idx")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, ok := f.(*bufferedFile); !ok {
		t.Fatalf("an index opened as %T, not buffered", f)
	}
	p := make([]byte, 10)
	if _, err := io.ReadFull(f, p); err != nil || string(p) != string(body[:10]) {
		t.Fatalf("first read: %v", err)
	}
	// The buffer holds far more than was read: a relative seek counts
	// from what the reader saw, not from where the file stands.
	if at, err := f.Seek(5, io.SeekCurrent); err != nil || at != 15 {
		t.Fatalf("seek +5 after 10 bytes: at %d, %v", at, err)
	}
	if _, err := io.ReadFull(f, p); err != nil || string(p) != string(body[15:25]) {
		t.Fatalf("read after a relative seek: %v", err)
	}
	if at, err := f.Seek(int64(2*indexBuffer), io.SeekStart); err != nil || at != int64(2*indexBuffer) {
		t.Fatalf("absolute seek: at %d, %v", at, err)
	}
	rest, err := io.ReadAll(f)
	if err != nil || string(rest) != string(body[2*indexBuffer:]) {
		t.Fatalf("read to the end after an absolute seek: %d bytes, %v", len(rest), err)
	}
	for _, open := range []func() (interface{ Close() error }, error){
		func() (interface{ Close() error }, error) { return fs.Open("pack-1.pack") },
		func() (interface{ Close() error }, error) { return fs.OpenFile("pack-1.idx", os.O_RDWR, 0) },
	} {
		g, err := open()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := g.(*bufferedFile); ok {
			t.Error("a pack, or an index opened for writing, was buffered")
		}
		g.Close()
	}
	sub, err := fs.Chroot(".")
	if err != nil {
		t.Fatal(err)
	}
	if g, err := sub.Open("pack-1.idx"); err != nil {
		t.Fatal(err)
	} else if _, ok := g.(*bufferedFile); !ok {
		t.Errorf("an index opened through a chroot as %T", g)
	} else {
		g.Close()
	}
}
