package broker

import (
	"fmt"
	"strings"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// network.egress comes only from a grant holding network.audit (a
// session's launcher), which may record nothing else; a session's
// event.record cannot write it or any other network.* type.
func TestNetworkAuditOnly(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		session := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		launcher := e.grant("acme", "web", "t1", "launcher", authz.CapNetworkAudit)
		before := e.head()
		_, err := e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: TypeNetworkEgress, Data: `{"decisions":[]}`})
		e.refused(err, errdefs.KindPermissionDenied, before, "network.egress from event.record")
		_, err = e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: "network.other"})
		e.refused(err, errdefs.KindPermissionDenied, before, "network.other from event.record")
		_, err = e.srv.RecordEvent(launcher.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, errdefs.KindPermissionDenied, before, "note from network.audit")
		_, err = e.srv.RecordEvent(launcher.ctx(), &brokerv1.RecordEventRequest{Type: "network.other"})
		e.refused(err, errdefs.KindPermissionDenied, before, "network.other from network.audit")
		r, err := e.srv.RecordEvent(launcher.ctx(), &brokerv1.RecordEventRequest{Type: TypeNetworkEgress, Data: `{"conn":1,"decision":"allowed","host":"a.test","port":443}`})
		if err != nil {
			t.Fatal(err)
		}
		if r.Event.Type != TypeNetworkEgress || r.Event.Task != "t1" || r.Event.Actor != launcher.ID {
			t.Fatalf("recorded %+v", r.Event)
		}
		e.verify()
	})
}

// A launcher records each egress decision as its own network.egress
// event, a batch of them in one RecordEvents call (all or none), counted
// against network.egress's own bound: a session at its event quota does
// not stop its audit, nor does the audit use up the session's quota.
func TestNetworkAuditBatch(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.b.quota = newEventQuota(1, 1<<20)
		e.b.egressQuota = newEgressQuota(5, 1<<20)
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		session := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		launcher := e.grant("acme", "web", "t1", "launcher", authz.CapNetworkAudit)
		egress := func(datas ...string) *brokerv1.RecordEventsRequest {
			r := &brokerv1.RecordEventsRequest{}
			for _, d := range datas {
				r.Events = append(r.Events, &brokerv1.RecordEventRequest{Type: TypeNetworkEgress, Data: d})
			}
			return r
		}

		// The session spends its quota of one event.
		if _, err := e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: "note"}); err != nil {
			t.Fatal(err)
		}
		before := e.head()
		_, err := e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, errdefs.KindResourceExhausted, before, "the session past its quota")

		// Its audit still goes in, one event per decision, in order.
		r, err := e.srv.RecordEvents(launcher.ctx(), egress(
			`{"conn":1,"decision":"allowed","host":"a.test","port":443}`,
			`{"conn":2,"decision":"denied","host":"b.test","port":443,"why":"EGRESS_DENIED"}`,
			`{"bytes_in":10,"bytes_out":5,"conn":1,"decision":"closed","host":"a.test","port":443}`))
		if err != nil {
			t.Fatalf("audit with the session at its quota: %v", err)
		}
		if len(r.Events) != 3 {
			t.Fatalf("recorded %d events, want 3", len(r.Events))
		}
		for i, ev := range r.Events {
			if ev.Seq != before+int64(i)+1 || ev.Type != TypeNetworkEgress || ev.Task != "t1" || ev.Actor != launcher.ID {
				t.Fatalf("event %d: %+v", i, ev)
			}
		}
		if !strings.Contains(r.Events[1].Data, `"decision":"denied"`) || !strings.Contains(r.Events[2].Data, `"bytes_in":10`) {
			t.Fatalf("data not as sent: %s / %s", r.Events[1].Data, r.Events[2].Data)
		}

		// network.egress's own bound (5 a minute here): a batch past it is
		// refused whole, with the flag that sets it.
		before = e.head()
		_, err = e.srv.RecordEvents(launcher.ctx(), egress(`{"conn":3}`, `{"conn":4}`, `{"conn":5}`))
		e.refused(err, errdefs.KindResourceExhausted, before, "a batch past the egress bound")
		if got := errdefs.Of(err); got.Reason != errdefs.EventRateExceeded || !strings.Contains(got.Message, "--egress-event-rate") {
			t.Fatalf("%+v", got)
		}
		if _, err := e.srv.RecordEvents(launcher.ctx(), egress(`{"conn":3}`, `{"conn":4}`)); err != nil {
			t.Fatalf("what is left of the bound: %v", err)
		}

		// A batch is checked event by event: one the grant may not
		// record refuses it all; so does one past the batch's bounds.
		other := e.grant("acme", "web", "t1", "launcher2", authz.CapNetworkAudit)
		before = e.head()
		mixed := egress(`{"conn":1}`)
		mixed.Events = append(mixed.Events, &brokerv1.RecordEventRequest{Type: "note"})
		_, err = e.srv.RecordEvents(other.ctx(), mixed)
		e.refused(err, errdefs.KindPermissionDenied, before, "a note in the launcher's batch")
		_, err = e.srv.RecordEvents(session.ctx(), egress(`{"conn":1}`))
		e.refused(err, errdefs.KindPermissionDenied, before, "network.egress in the session's batch")
		big := make([]string, MaxBatchEvents+1)
		for i := range big {
			big[i] = fmt.Sprintf(`{"conn":%d}`, i)
		}
		_, err = e.srv.RecordEvents(other.ctx(), egress(big...))
		e.refused(err, errdefs.KindResourceExhausted, before, "a batch of 257")
		if got := errdefs.Of(err); got.Reason != errdefs.EventBatchTooLarge {
			t.Fatalf("%+v", got)
		}
		_, err = e.srv.RecordEvents(other.ctx(), egress(`{"conn":1}`, `not json`))
		e.refused(err, errdefs.KindInvalidArgument, before, "a batch with one bad event")
		// The refusals charged nothing: other's bound is whole.
		if _, err := e.srv.RecordEvents(other.ctx(), egress(`{"a":1}`, `{"a":2}`, `{"a":3}`, `{"a":4}`, `{"a":5}`)); err != nil {
			t.Fatalf("a whole bound after refusals: %v", err)
		}
		e.verify()
	})
}

// A closed task takes no more events from a session's grant (which
// outlives the close), in a batch or alone, and an idempotent retry of one
// recorded before the close still gets it back; its launcher's egress audit
// still lands, being a record of what the session did before it ended.
func TestClosedTaskTakesNoEvents(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		session := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		launcher := e.grant("acme", "web", "t1", "launcher", authz.CapNetworkAudit)
		first, err := e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: "note", Data: `{"n":1}`, IdempotencyKey: "k1"})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.close(tm.closer); err != nil {
			t.Fatal(err)
		}
		before := e.head()
		_, err = e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: "note", Data: `{"n":2}`})
		e.refused(err, errdefs.KindFailedPrecondition, before, "an event on a closed task")
		if errdefs.Of(err).Reason != errdefs.TaskClosed {
			t.Fatalf("reason %v, want %s", err, errdefs.TaskClosed)
		}
		_, err = e.srv.RecordEvents(session.ctx(), &brokerv1.RecordEventsRequest{Events: []*brokerv1.RecordEventRequest{{Type: "note", Data: `{"n":3}`}}})
		e.refused(err, errdefs.KindFailedPrecondition, before, "a batch on a closed task")
		again, err := e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: "note", Data: `{"n":1}`, IdempotencyKey: "k1"})
		if err != nil || again.Event.Seq != first.Event.Seq {
			t.Fatalf("retry of an event recorded before the close: %v, %v", again, err)
		}
		if _, err := e.srv.RecordEvent(launcher.ctx(), &brokerv1.RecordEventRequest{Type: TypeNetworkEgress, Data: `{"conn":1,"decision":"allowed","host":"a.test","port":443}`}); err != nil {
			t.Fatalf("egress audit after the close: %v", err)
		}
		e.verify()
	})
}
