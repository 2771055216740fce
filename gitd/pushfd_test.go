package gitd

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/sock"
)

// A passed file is read up to the size it had when taken, and a file that
// changed size by the end of the read is refused. (A rewrite in place is
// seen by its times, which kernels before 6.13 keep at a clock tick's
// grain: not tested here, since a test cannot wait for the tick.)
func TestPassedBodyRefusesAChangedFile(t *testing.T) {
	for name, change := range map[string]func(p string){
		"unchanged": func(string) {},
		"grew": func(p string) {
			f, _ := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			f.WriteString("more bytes")
			f.Close()
		},
		"shrank": func(p string) { os.Truncate(p, 4) },
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "b")
			os.WriteFile(p, []byte("0123456789"), 0o600)
			f, err := os.Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			pf, err := sock.CheckPassedFile(f)
			if err != nil {
				t.Fatal(err)
			}
			change(p)
			b := &passedBody{f: f, pf: pf, r: io.NewSectionReader(f, 0, pf.Size)}
			got, err := io.ReadAll(b)
			if name == "unchanged" {
				if err != nil || string(got) != "0123456789" || b.n != 10 {
					t.Fatalf("read %q (%d), %v", got, b.n, err)
				}
				return
			}
			if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.PushFDRefused {
				t.Fatalf("a file that %s: read %q, %v", name, got, err)
			}
			if len(got) > 10 {
				t.Fatalf("read %d bytes past the size taken", len(got))
			}
		})
	}
}
