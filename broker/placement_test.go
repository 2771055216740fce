package broker

import (
	"context"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// A project is placed on the host that adds it: another host sharing the
// store cannot add it, and CheckPlacement there names the owner. A project
// registered before placement existed (no host) is claimed by the first
// host that adds it, and served meanwhile.
func TestPlacement(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			ctx := context.Background()
			open := func(id string) *Broker {
				b, err := Open(ctx, Options{DSN: dsn, AdminToken: adminToken, HostID: id, SigningKey: testKey})
				if err != nil {
					t.Fatalf("Open %s: %v", id, err)
				}
				t.Cleanup(func() { b.Close() })
				return b
			}
			a, b := open("host-a"), open("host-b")
			if err := a.EnsureProject(ctx, "acme", "web"); err != nil {
				t.Fatal(err)
			}
			if err := a.EnsureProject(ctx, "acme", "web"); err != nil {
				t.Fatalf("adding again on the owner: %v", err)
			}
			for what, err := range map[string]error{
				"add on B":   b.EnsureProject(ctx, "acme", "web"),
				"check on B": b.CheckPlacement(ctx, "acme", "web"),
			} {
				e, ok := errdefs.As(err)
				if !ok || e.Reason != errdefs.ProjectOnOtherHost || e.Metadata["host"] != "host-a" {
					t.Fatalf("%s: %v, want PROJECT_ON_OTHER_HOST naming host-a", what, err)
				}
			}
			if err := a.CheckPlacement(ctx, "acme", "web"); err != nil {
				t.Fatalf("check on the owner: %v", err)
			}
			if err := b.CheckPlacement(ctx, "acme", "unknown"); err != nil {
				t.Fatalf("an unknown project is not refused by placement: %v", err)
			}
			if host, ok, err := b.Placement(ctx, "acme", "web"); err != nil || !ok || host != "host-a" {
				t.Fatalf("Placement: %q %v %v", host, ok, err)
			}

			// A project from before placement: served by any host until one
			// adds it, then that host's.
			if _, err := a.st.read().db.ExecContext(ctx, `INSERT INTO projects (business, project) VALUES ('acme', 'old')`); err != nil {
				t.Fatal(err)
			}
			for _, h := range []*Broker{a, b} {
				if err := h.CheckPlacement(ctx, "acme", "old"); err != nil {
					t.Fatalf("unplaced project refused: %v", err)
				}
			}
			if err := b.EnsureProject(ctx, "acme", "old"); err != nil {
				t.Fatalf("claim: %v", err)
			}
			if err := a.CheckPlacement(ctx, "acme", "old"); errdefs.ReasonOf(err) != errdefs.ProjectOnOtherHost {
				t.Fatalf("after B claimed it, A: %v", err)
			}
		})
	}
}
