package broker

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

func TestEventQuotaBucket(t *testing.T) {
	now := time.Unix(1700000000, 0)
	q := newEventQuota(60, 1000)
	q.now = func() time.Time { return now }
	for i := 0; i < 60; i++ {
		if err := q.take("a", 10); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	err := q.take("a", 10)
	e, ok := errdefs.As(err)
	if !ok || e.Reason != errdefs.EventRateExceeded || e.Metadata["limit"] != "60" || e.RetryAfter != time.Second {
		t.Fatalf("61st event: %v %+v", err, e)
	}
	// Another grant is not touched.
	if err := q.take("b", 10); err != nil {
		t.Fatal(err)
	}
	// One second refills one event.
	now = now.Add(time.Second)
	if err := q.take("a", 10); err != nil {
		t.Fatal(err)
	}
	// Bytes: b spends nearly all of its minute; 100 more is over, and the
	// refusal says when it would pass.
	if err := q.take("b", 995); err != nil {
		t.Fatal(err)
	}
	err = q.take("b", 100)
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.EventBytesRate || e.Metadata["limit"] != "1000" || e.RetryAfter <= 0 {
		t.Fatalf("bytes: %v", err)
	}
	// An event larger than a minute's bytes never passes: no retry hint.
	err = q.take("c", 2000)
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
		e.refused(err, codes.ResourceExhausted, before, "past the quota")
		got := errdefs.FromGRPC(err)
		if got.Reason != errdefs.EventRateExceeded || got.RetryAfter <= 0 || !strings.Contains(got.Message, "--event-rate") {
			t.Fatalf("%+v", got)
		}
		if _, err := e.srv.RecordEvent(b.ctx(), &brokerv1.RecordEventRequest{Type: "note"}); err != nil {
			t.Fatalf("another grant: %v", err)
		}
	})
}
