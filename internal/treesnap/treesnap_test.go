package treesnap

import (
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// A tree whose entries come and go while it is walked (a daemon removing a
// cancelled call's temporary directory) is recorded, never a failed test:
// the entries that vanished are marked, and the settled ones are right.
func TestTakeWhileTheTreeChanges(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "kept"), []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	settled := Take(t, root)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			dir := filepath.Join(root, "incoming-"+strconv.Itoa(i%4))
			if err := os.MkdirAll(dir, 0o755); err == nil {
				_ = os.WriteFile(filepath.Join(dir, "pack"), []byte("x"), 0o644)
			}
			_ = os.RemoveAll(dir)
		}
	}()
	vanished := 0
	for i := 0; i < 2000; i++ {
		m := Take(t, root)
		if m["kept"] != settled["kept"] {
			t.Fatalf("kept file recorded as %q, want %q", m["kept"], settled["kept"])
		}
		for _, v := range m {
			if v == Vanished {
				vanished++
			}
		}
	}
	close(stop)
	wg.Wait()
	if d := Diff(settled, Take(t, root)); d != "" {
		t.Fatalf("the settled tree differs:\n%s", d)
	}
	t.Logf("%d entries vanished while read", vanished)
}
