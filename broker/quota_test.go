package broker

import (
	"strings"
	"sync"
	"testing"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

func TestEventQuotaBucket(t *testing.T) {
	now := time.Unix(1700000000, 0)
	q := newEventQuota(60, 1000)
	buckets := map[string]*bucket{}
	take := func(grant string, size int) error {
		b, ok := buckets[grant]
		if !ok {
			b = &bucket{events: q.perMin, bytes: q.bytesPerMin, at: now}
			buckets[grant] = b
		}
		return q.spend(b, now, grant, 1, size)
	}
	for i := 0; i < 60; i++ {
		if err := take("a", 10); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	err := take("a", 10)
	e, ok := errdefs.As(err)
	if !ok || e.Reason != errdefs.EventRateExceeded || e.Metadata["limit"] != "60" || e.RetryAfter != time.Second {
		t.Fatalf("61st event: %v %+v", err, e)
	}
	// Another grant is not touched.
	if err := take("b", 10); err != nil {
		t.Fatal(err)
	}
	// One second refills one event.
	now = now.Add(time.Second)
	if err := take("a", 10); err != nil {
		t.Fatal(err)
	}
	// A clock behind the bucket's (another host's) refills nothing.
	now = now.Add(-30 * time.Second)
	if err := take("a", 10); errdefs.ReasonOf(err) != errdefs.EventRateExceeded {
		t.Fatalf("a clock behind refilled: %v", err)
	}
	now = now.Add(30 * time.Second)
	// Bytes: b spends nearly all of its minute; 100 more is over, and the
	// refusal says when it would pass.
	if err := take("b", 985); err != nil {
		t.Fatal(err)
	}
	err = take("b", 100)
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.EventBytesRate || e.Metadata["limit"] != "1000" || e.RetryAfter <= 0 {
		t.Fatalf("bytes: %v", err)
	}
	// An event larger than a minute's bytes never passes: no retry hint.
	err = take("c", 2000)
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.EventBytesRate || e.RetryAfter != 0 {
		t.Fatalf("oversized: %v", err)
	}
}

func TestRecordEventQuota(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.b.quota = newEventQuota(5, 1<<20)
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		e.task("acme", "web", "t2")
		a := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		b := e.grant("acme", "web", "t2", "agent", authz.CapEventRecord)
		for i := 0; i < 5; i++ {
			if _, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "note"}); err != nil {
				t.Fatal(err)
			}
		}
		before := e.head()
		_, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, errdefs.KindResourceExhausted, before, "past the quota")
		got := errdefs.Of(err)
		if got.Reason != errdefs.EventRateExceeded || got.RetryAfter <= 0 || !strings.Contains(got.Message, "--event-rate") {
			t.Fatalf("%+v", got)
		}
		if _, err := e.srv.RecordEvent(b.ctx(), &brokerv1.RecordEventRequest{Type: "note"}); err != nil {
			t.Fatalf("another grant: %v", err)
		}
	})
}

// Three brokers on one store, as three bushostd sharing a PostgreSQL: one
// grant's event quota holds in total, not per broker, and a refused event
// charges nothing.
func TestEventQuotaHeldInTheStore(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			hosts := []*env{newEnv(t, dsn), newEnv(t, dsn), newEnv(t, dsn)}
			for _, h := range hosts {
				h.b.quota = newEventQuota(7, 1<<20)
			}
			a := hosts[0]
			a.project("acme", "web")
			a.task("acme", "web", "t1")
			g := a.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
			var mu sync.Mutex
			var wg sync.WaitGroup
			ok, refused := 0, 0
			for _, h := range hosts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 5; i++ {
						_, err := h.srv.RecordEvent(g.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
						mu.Lock()
						switch {
						case err == nil:
							ok++
						case errdefs.Of(err).Reason == errdefs.EventRateExceeded:
							refused++
						default:
							t.Error(err)
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			// A minute's quota of 7, and the few events the refill of
			// the seconds the test ran may have added.
			if ok < 7 || ok > 8 || ok+refused != 15 {
				t.Fatalf("%d events recorded, %d refused across three brokers; the quota is 7 a minute", ok, refused)
			}
			var notes int
			for _, ev := range a.events(Filter{}) {
				if ev.Type == "note" {
					notes++
				}
			}
			if notes != ok {
				t.Fatalf("%d notes in the log, %d answered recorded", notes, ok)
			}
		})
	}
}
