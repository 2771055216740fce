package sock

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/metadata"
)

// TestGrantSlots: a grant holds at most max slots, refused with full(n)
// past them; another grant's and the host's calls, and a call with no
// token, are not counted against it; a released slot is taken again, and
// no counter is left once every slot is back.
func TestGrantSlots(t *testing.T) {
	g := NewGrantSlots("admin")
	with := func(tok string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
	}
	errFull := errors.New("full")
	var held []int
	full := func(n int) error { held = append(held, n); return errFull }
	var releases []func()
	for range 2 {
		r, err := g.Take(with("lead"), 2, full)
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, r)
	}
	if _, err := g.Take(with("lead"), 2, full); err != errFull || len(held) != 1 || held[0] != 2 {
		t.Fatalf("a third slot of the grant: %v (full told %v), want the refusal naming 2", err, held)
	}
	for _, ctx := range []context.Context{with("other"), with("admin"), context.Background()} {
		r, err := g.Take(ctx, 2, full)
		if err != nil {
			t.Fatalf("a slot of another caller: %v", err)
		}
		defer r()
	}
	releases[0]()
	r, err := g.Take(with("lead"), 2, full)
	if err != nil {
		t.Fatalf("the grant's slot once one was released: %v", err)
	}
	r()
	releases[1]()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.n) != 1 {
		t.Errorf("counters: %v, want other's alone", g.n)
	}
}
