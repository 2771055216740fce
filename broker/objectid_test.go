package broker

import (
	"context"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// A push's commit or previous commit in upper or mixed case is no object
// id (gitid): refused, and nothing is written to the log.
func TestPushObjectIDCase(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		ctx := context.Background()
		if err := e.b.TaskOpen(ctx, tm.worker.G); err != nil {
			t.Fatalf("TaskOpen: %v", err)
		}
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		before := e.head()
		id := commit(10) // "aaaa..."
		for name, spelt := range map[string]string{"upper": strings.ToUpper(id), "mixed": strings.ToUpper(id[:20]) + id[20:]} {
			for _, p := range []authz.Push{
				{Business: "acme", Project: "web", Task: "t1", Commit: spelt},
				{Business: "acme", Project: "web", Task: "t1", Commit: id, Previous: spelt},
			} {
				if err := e.b.RecordPush(ctx, tm.worker.G, p, authz.Peer{}); errdefs.ReasonOf(err) != errdefs.ObjectIDInvalid {
					t.Errorf("%s %+v: %v, want %s", name, p, err, errdefs.ObjectIDInvalid)
				}
				if h := e.head(); h != before {
					t.Fatalf("%s: the log moved from %d to %d", name, before, h)
				}
			}
		}
	})
}
