package metrics

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A grant noted in a call's context reaches that call's record, and only
// its ids: a context without a call takes the note without effect.
func TestNoteGrant(t *testing.T) {
	NoteGrant(context.Background(), "g-1", "t1")
	c := &Call{}
	ctx := WithCall(context.Background(), c)
	if id, task := c.Grant(); id != "" || task != "" {
		t.Fatalf("fresh call has grant %q task %q", id, task)
	}
	NoteGrant(ctx, "g-2", "t2")
	if id, task := c.Grant(); id != "g-2" || task != "t2" {
		t.Fatalf("grant %q task %q, want g-2 t2", id, task)
	}
}

// The registry gathers bushost's own metrics with the Go and process
// collectors, and build_info says which build runs.
func TestRegistry(t *testing.T) {
	Write(nil, 0)
	IndexPack(0)
	n, err := testutil.GatherAndCount(Registry, "bushost_build_info", "bushost_broker_writes_total", "bushost_index_pack_duration_seconds", "go_goroutines")
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Fatalf("gathered %d of the 4 series", n)
	}
	if err := testutil.GatherAndCompare(Registry, strings.NewReader(`
# HELP bushost_broker_writes_total Broker log writes, by result: committed (it appended its events) or refused (it appended nothing).
# TYPE bushost_broker_writes_total counter
bushost_broker_writes_total{result="committed"} 1
`), "bushost_broker_writes_total"); err != nil {
		t.Fatal(err)
	}
}

// Each NewRegistry holds the collectors every bushost process shares, and
// none of bushostd's own: two of them (two supervisors in one test binary)
// never collide.
func TestNewRegistry(t *testing.T) {
	a, b := NewRegistry(), NewRegistry()
	for _, r := range []*prometheus.Registry{a, b} {
		n, err := testutil.GatherAndCount(r, "bushost_build_info", "go_goroutines", "process_start_time_seconds")
		if err != nil {
			t.Fatal(err)
		}
		if n != 3 {
			t.Fatalf("gathered %d of the 3 series", n)
		}
		if n, _ := testutil.GatherAndCount(r, "bushost_pushes_total", "bushost_push_duration_seconds"); n != 0 {
			t.Errorf("a fresh registry holds %d of bushostd's series", n)
		}
	}
}
