package bundle

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/bushost/bushost/internal/gitcmd"
)

// The writeback beside index-pack (writeback.go) changes when the pack
// reaches the disk, never what is written or kept: a small and a large
// pack are indexed and migrated whole, a pack git refuses leaves nothing,
// and every goroutine has ended once Remove returns.
func TestIndexPackWriteback(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int
		large bool
	}{
		{"small", 1 << 10, false},
		{"large", 3 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPackRepo(t)
			content := randomBytes(tc.size)
			id := p.object("blob", content)
			pack := p.pack(id)
			into := t.TempDir()
			if err := os.Mkdir(filepath.Join(into, "pack"), 0o755); err != nil {
				t.Fatal(err)
			}
			q, err := NewQuarantineFor(filepath.Join(p.dir, "objects"), into, filepath.Join(p.dir, "objects"))
			if err != nil {
				t.Fatal(err)
			}
			q.Limits = Limits{BlobBytes: 8 << 20, CommitBytes: 1 << 20, TreeBytes: 1 << 20}
			q.IndexConfig = []string{"core.fsync=none"}
			name, err := q.IndexPack(context.Background(), p.git, p.dir, bytes.NewReader(pack))
			if err != nil {
				t.Fatal(err)
			}
			if got := q.wb.large.Load(); got != tc.large {
				t.Errorf("large = %v, want %v", got, tc.large)
			}
			if err := q.Migrate(); err != nil {
				t.Fatal(err)
			}
			if err := q.Remove(); err != nil {
				t.Fatal(err)
			}
			// The migrated pack holds the blob, byte for byte.
			var out bytes.Buffer
			err = p.git.Run(context.Background(), gitcmd.Cmd{GitDir: p.dir, Sub: "cat-file", Flags: []string{"-p"}, Args: []string{id},
				Env: []string{"GIT_OBJECT_DIRECTORY=" + into}, Stdout: &out})
			if err != nil || !bytes.Equal(out.Bytes(), content) {
				t.Fatalf("the migrated pack-%s does not give the blob back: %v", name, err)
			}
			if _, err := os.Stat(q.Dir); !os.IsNotExist(err) {
				t.Fatalf("quarantine left behind: %v", err)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		p := newPackRepo(t)
		pack := p.pack(p.object("blob", randomBytes(3<<20)))
		// A flipped byte in the trailer: git reads the whole pack, then
		// refuses it.
		pack[len(pack)-1] ^= 0xff
		q, err := NewQuarantine(filepath.Join(p.dir, "objects"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.IndexPack(context.Background(), p.git, p.dir, bytes.NewReader(pack)); err == nil {
			t.Fatal("a pack with a bad checksum was taken")
		}
		if err := q.Remove(); err != nil {
			t.Fatal(err)
		}
		ents, _ := os.ReadDir(filepath.Join(p.dir, "objects", "pack"))
		if len(ents) != 0 {
			t.Fatalf("left %v", ents)
		}
	})
}
