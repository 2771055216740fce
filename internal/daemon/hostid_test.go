package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/home"
)

// The host id: a flag must be a valid name; without one the id is made at
// first start and kept; a kept id that is not a name, or a link, is
// refused and left as it was.
func TestHostID(t *testing.T) {
	h := home.At(t.TempDir())
	if _, err := hostID(h, "Bad/Name"); err == nil || !strings.Contains(err.Error(), "--host-id") {
		t.Fatalf("invalid --host-id: %v", err)
	}
	if id, err := hostID(h, "host-a"); err != nil || id != "host-a" {
		t.Fatalf("--host-id host-a: %q %v", id, err)
	}
	if _, err := os.Stat(h.HostID()); err == nil {
		t.Fatal("--host-id wrote HOME/host-id")
	}
	made, err := hostID(h, "")
	if err != nil || made == "" {
		t.Fatalf("first start: %q %v", made, err)
	}
	if again, err := hostID(h, ""); err != nil || again != made {
		t.Fatalf("second start: %q %v, want %q", again, err, made)
	}

	bad := home.At(t.TempDir())
	path := bad.HostID()
	if err := os.WriteFile(path, []byte("../other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := hostID(bad, ""); err == nil {
		t.Fatal("a kept id that is not a name was taken")
	}
	if b, _ := os.ReadFile(path); string(b) != "../other\n" {
		t.Fatalf("the refused file changed: %q", b)
	}

	linked := home.At(t.TempDir())
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Symlink(target, linked.HostID()); err != nil {
		t.Fatal(err)
	}
	if _, err := hostID(linked, ""); err == nil {
		t.Fatal("a host-id that is a link was followed")
	}
	if _, err := os.Lstat(target); err == nil {
		t.Fatal("the link's target was written")
	}
}
