package broker

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/sock"
)

func TestRecordEventRules(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		a := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		before := e.head()
		for _, c := range []struct {
			typ, data string
			code      errdefs.Kind
		}{
			{"", "", errdefs.KindInvalidArgument},
			{"Note", "", errdefs.KindInvalidArgument},
			{"note ", "", errdefs.KindInvalidArgument},
			{" note", "", errdefs.KindInvalidArgument},
			{"no te", "", errdefs.KindInvalidArgument},
			{"note.", "", errdefs.KindInvalidArgument},
			{".note", "", errdefs.KindInvalidArgument},
			{"note..x", "", errdefs.KindInvalidArgument},
			{"1note", "", errdefs.KindInvalidArgument},
			{"note-x", "", errdefs.KindInvalidArgument},
			{"nоte", "", errdefs.KindInvalidArgument}, // Cyrillic o
			{"note\n", "", errdefs.KindInvalidArgument},
			{"note\x00", "", errdefs.KindInvalidArgument},
			{strings.Repeat("a", 200), "", errdefs.KindInvalidArgument},
			{"action.allowed", "", errdefs.KindPermissionDenied},
			{"review.verdict", "", errdefs.KindPermissionDenied},
			{"task.closed", "", errdefs.KindPermissionDenied},
			{"grant.created", "", errdefs.KindPermissionDenied},
			{"task", "", errdefs.KindPermissionDenied},
			{"note", "[]", errdefs.KindInvalidArgument},
			{"note", `"x"`, errdefs.KindInvalidArgument},
			{"note", "null", errdefs.KindInvalidArgument},
			{"note", "{", errdefs.KindInvalidArgument},
			{"note", "{} {}", errdefs.KindInvalidArgument},
			{"note", "{\"a\":\"\xff\"}", errdefs.KindInvalidArgument},
			{"note", `{"":10e700}`, errdefs.KindInvalidArgument},
			{"note", `{"a":[{"b":-1e309}]}`, errdefs.KindInvalidArgument},
			{"note", `{"a":"` + strings.Repeat("x", MaxDataBytes) + `"}`, errdefs.KindResourceExhausted},
		} {
			_, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: c.typ, Data: c.data})
			e.refused(err, c.code, before, "type "+clip(c.typ)+" data "+clip(c.data))
		}

		r, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note_1", Data: ` {"b": 1.50, "a": [true, null], "c": "<&>"} `})
		if err != nil {
			t.Fatal(err)
		}
		ev := r.Event
		if ev.Type != "agent.note_1" || ev.Actor != a.ID || ev.Task != "t1" || ev.Data != `{"a":[true,null],"b":1.50,"c":"<&>"}` || ev.Seq != before+1 {
			t.Fatalf("recorded: %+v", ev)
		}
		// A number too small for a float reads as 0 everywhere: kept as written.
		r, err = e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "tiny", Data: `{"n":1e-400,"m":1.7976931348623157e308}`})
		if err != nil || r.Event.Data != `{"m":1.7976931348623157e308,"n":1e-400}` {
			t.Fatalf("tiny and largest numbers: %v %v", r, err)
		}
		r, err = e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "empty"})
		if err != nil || r.Event.Data != "{}" {
			t.Fatalf("empty data: %v %v", r, err)
		}

		// Idempotency: the same key and body (up to canonical form) return
		// the first event; another body is refused.
		first, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "step", Data: `{"n":1,"m":2}`, IdempotencyKey: "k1"})
		if err != nil {
			t.Fatal(err)
		}
		before = e.head()
		again, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "step", Data: `{"m":2, "n":1}`, IdempotencyKey: "k1"})
		if err != nil || again.Event.Seq != first.Event.Seq || again.Event.Hash != first.Event.Hash || e.head() != before {
			t.Fatalf("same key and body: %v %v", again, err)
		}
		_, err = e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "step", Data: `{"n":2}`, IdempotencyKey: "k1"})
		e.refused(err, errdefs.KindAlreadyExists, before, "same key, other data")
		_, err = e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "other", Data: `{"m":2,"n":1}`, IdempotencyKey: "k1"})
		e.refused(err, errdefs.KindAlreadyExists, before, "same key, other type")
		e.verify()
	})
}

// Concurrent writers share commits; the chain must stay gapless and valid.
func TestConcurrentAppends(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		a := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		before := e.head()
		const writers, each = 8, 40
		var wg sync.WaitGroup
		errs := make(chan error, writers*each)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					data := `{"w":` + string(rune('0'+w)) + `}`
					if i%10 == 0 {
						data = "[]" // refused inside a batch: must not disturb the others
					}
					_, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "load", Data: data})
					if (err != nil) != (i%10 == 0) {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("unexpected outcome: %v", err)
		}
		if got, want := e.head()-before, int64(writers*each*9/10); got != want {
			t.Fatalf("appended %d, want %d", got, want)
		}
		e.verify()
	})
}

func TestVerifyLogCatchesEdits(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		a := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		for i := 0; i < 5; i++ {
			if _, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "n"}); err != nil {
				t.Fatal(err)
			}
		}
		v, err := e.srv.VerifyLog(e.host(), &brokerv1.VerifyLogRequest{})
		if err != nil || !v.Ok || v.Events != e.head() {
			t.Fatalf("verify: %v %v", v, err)
		}
		db := e.b.st.db
		// Edits made and committed, the way someone with the file would.
		if _, err := db.Exec(`UPDATE events SET data = '{"forged":true}' WHERE seq = 4`); err != nil {
			t.Fatal(err)
		}
		v, err = e.srv.VerifyLog(e.host(), &brokerv1.VerifyLogRequest{})
		if err != nil || v.Ok || v.FirstBadSeq != 4 || !strings.Contains(v.Reason, "changed") {
			t.Fatalf("verify after an edit: %v %v", v, err)
		}
		if _, err := db.Exec(`DELETE FROM events WHERE seq = 2`); err != nil {
			t.Fatal(err)
		}
		v, _ = e.srv.VerifyLog(e.host(), &brokerv1.VerifyLogRequest{})
		if v.Ok || v.FirstBadSeq != 3 {
			t.Fatalf("verify after a delete: %v", v)
		}
	})
}

type eventStream struct {
	brokerv1.BrokerService_ListEventsServer
	ctx context.Context
	got chan *brokerv1.Event
}

func (s *eventStream) Context() context.Context { return s.ctx }
func (s *eventStream) Send(r *brokerv1.ListEventsResponse) error {
	s.got <- r.Event
	return nil
}

func TestListEvents(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		e.task("acme", "web", "t2")
		a := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		b := e.grant("acme", "web", "t2", "agent", authz.CapEventRecord)
		if _, err := e.srv.RecordEvent(b.ctx(), &brokerv1.RecordEventRequest{Type: "secret"}); err != nil {
			t.Fatal(err)
		}

		// A grant sees its own task and may not ask for another.
		s := &eventStream{ctx: a.ctx(), got: make(chan *brokerv1.Event, 100)}
		if err := e.srv.ListEvents(&brokerv1.ListEventsRequest{Task: "t2"}, s); codesOf(err) != errdefs.KindPermissionDenied {
			t.Fatalf("listing another task: %v", err)
		}
		if err := e.srv.ListEvents(&brokerv1.ListEventsRequest{}, s); err != nil {
			t.Fatal(err)
		}
		close(s.got)
		for ev := range s.got {
			if ev.Task != "t1" {
				t.Fatalf("grant of t1 saw %+v", ev)
			}
		}

		// Follow: events appended after the call arrive.
		ctx, cancel := context.WithCancel(a.ctx())
		defer cancel()
		s = &eventStream{ctx: ctx, got: make(chan *brokerv1.Event, 100)}
		done := make(chan error, 1)
		from := e.head()
		go func() { done <- e.srv.ListEvents(&brokerv1.ListEventsRequest{AfterSeq: from, Follow: true}, s) }()
		for i := 0; i < 3; i++ {
			if _, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "tick"}); err != nil {
				t.Fatal(err)
			}
			select {
			case ev := <-s.got:
				if ev.Type != "tick" || ev.Task != "t1" {
					t.Fatalf("followed %+v", ev)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("follow did not deliver a new event")
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("follow ended with %v", err)
		}

		// The host sees everything, and filters.
		s = &eventStream{ctx: e.host(), got: make(chan *brokerv1.Event, 100)}
		if err := e.srv.ListEvents(&brokerv1.ListEventsRequest{Task: "t2"}, s); err != nil {
			t.Fatal(err)
		}
		close(s.got)
		n := 0
		for ev := range s.got {
			if ev.Task != "t2" {
				t.Fatalf("host filter t2 gave %+v", ev)
			}
			n++
		}
		if n != 3 { // task.added, grant.created, secret
			t.Fatalf("host saw %d events of t2", n)
		}
	})
}

// The calling process (SO_PEERCRED) is written with each event it causes.
func TestPeerRecorded(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		a := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		md, _ := metadata.FromIncomingContext(a.ctx())
		ctx := peer.NewContext(metadata.NewIncomingContext(context.Background(), md),
			&peer.Peer{AuthInfo: sock.AuthInfo{Peer: authz.Peer{PID: 4242, UID: 1001, GID: 1002}}})
		r, err := e.srv.RecordEvent(ctx, &brokerv1.RecordEventRequest{Type: "note"})
		if err != nil {
			t.Fatal(err)
		}
		if r.Event.Peer != "pid=4242,uid=1001,gid=1002" {
			t.Fatalf("peer %q", r.Event.Peer)
		}
		e.verify()
	})
}

func TestReopenKeepsState(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			dsn := k.dsn(t)
			e := newEnv(t, dsn)
			e.project("acme", "web")
			e.task("acme", "web", "t1")
			a := e.grant("acme", "web", "t1", "worker", authz.CapPushWorking)
			if err := e.push(a, 7); err != nil {
				t.Fatal(err)
			}
			if err := e.b.Close(); err != nil {
				t.Fatal(err)
			}
			e2 := newEnv(t, dsn)
			if _, err := e2.b.Authorize(context.Background(), a.Token, authz.CapPushWorking); err != nil {
				t.Fatalf("grant lost across reopen: %v", err)
			}
			last, err := e2.b.LastPushes(context.Background(), "acme", "web")
			if err != nil || last["t1"] != commit(7) {
				t.Fatalf("pushes lost across reopen: %v %v", last, err)
			}
			e2.verify()
		})
	}
	if _, err := Open(context.Background(), Options{}); err == nil {
		t.Fatal("Open with no DSN")
	}
}
