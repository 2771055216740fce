package broker

import (
	"context"
	"fmt"
	"github.com/bushost/bushost/internal/errdefs"
	"path/filepath"
	"testing"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
)

// fill appends n free-form events to task t in one transaction (a fast way
// to make a long log; the rules do not care how it grew).
func fill(b *testing.B, br *Broker, t team, n int) {
	b.Helper()
	err := br.write(context.Background(), func(ctx context.Context, q *writeTx) error {
		for i := 0; i < n; i++ {
			e := Event{Business: t.worker.G.Business, Project: t.worker.G.Project, Task: t.worker.G.Task, Type: "filler", Actor: t.worker.ID, Data: `{"i":` + fmt.Sprint(i) + `}`}
			if err := appendEvent(ctx, q, &e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCloseDecision shows that the task.close gate costs the same at
// 1,000 and 100,000 events in the log (all of them in the task closed): it
// reads the task's row and the review of its latest push, never the log.
// "refused" is the decision alone (the gate refuses: no commit); "accepted"
// is a close that passes and commits durably.
func BenchmarkCloseDecision(b *testing.B) {
	sizes := []int{1000, 100000}
	refused := map[int]time.Duration{}
	accepted := map[int]time.Duration{}
	for _, n := range sizes {
		e := newEnv(b, filepath.Join(b.TempDir(), "broker.db"))
		e.project("acme", "web")
		pending := e.team("pending")
		if err := e.push(pending.worker, 1); err != nil {
			b.Fatal(err)
		}
		e.request(pending.worker)
		fill(b, e.b, pending, n)
		const approvedTasks = 50
		var ready []team
		for i := 0; i < approvedTasks; i++ {
			tm := e.team(fmt.Sprintf("ready%d", i))
			if err := e.push(tm.worker, 1); err != nil {
				b.Fatal(err)
			}
			r := e.request(tm.worker)
			if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
				b.Fatal(err)
			}
			fill(b, e.b, tm, 10)
			ready = append(ready, tm)
		}
		if h := e.head(); h < int64(n) {
			b.Fatalf("log has %d events, want at least %d", h, n)
		}
		const decisions = 2000
		start := time.Now()
		for i := 0; i < decisions*b.N; i++ {
			if _, err := e.b.CloseTask(context.Background(), pending.closer.G, ""); codesOf(err) != errdefs.KindFailedPrecondition {
				b.Fatalf("close of a task pending review: %v", err)
			}
		}
		refused[n] = time.Since(start) / time.Duration(decisions*b.N)
		start = time.Now()
		for _, tm := range ready {
			if _, err := e.b.CloseTask(context.Background(), tm.closer.G, ""); err != nil {
				b.Fatal(err)
			}
		}
		accepted[n] = time.Since(start) / approvedTasks
		e.verify()
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(refused[1000]), "µs/decision@1k")
	b.ReportMetric(us(refused[100000]), "µs/decision@100k")
	b.ReportMetric(us(accepted[1000]), "µs/close@1k")
	b.ReportMetric(us(accepted[100000]), "µs/close@100k")
	fmt.Printf("task.close decision (refused, no commit): %.0f µs at 1,000 events, %.0f µs at 100,000 events (ratio %.2f); accepted durable close: %.0f µs vs %.0f µs\n",
		us(refused[1000]), us(refused[100000]), us(refused[100000])/us(refused[1000]), us(accepted[1000]), us(accepted[100000]))
}

// BenchmarkEventProof is what authorship costs per event: the signature
// appendEvent makes (on the push path, once per event) and the proof the
// gate and log verify check, each beside the hash every event already
// costs.
func BenchmarkEventProof(b *testing.B) {
	s := NewSigner(testKey)
	keys := NewKeyring(s.Public())
	e := Event{Seq: 42, Business: "acme", Project: "web", Task: "t1", Type: TypeReviewVerdict, Actor: "g-0123456789abcdef",
		Data: `{"comment":"","commit":"` + commit(1) + `","push_seq":41,"request_id":"r-0123456789abcdef","verdict":"approve"}`,
		Time: now(), Peer: "pid=1,uid=1000,gid=1000", PrevHash: HashEvent(Event{Seq: 41})}
	var hash, sign, prove time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		e.Hash = HashEvent(e)
		t1 := time.Now()
		e.Sig = s.sign(e.Hash)
		t2 := time.Now()
		if err := keys.prove(e); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		hash, sign, prove = hash+t1.Sub(t0), sign+t2.Sub(t1), prove+t3.Sub(t2)
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(b.N) }
	b.ReportMetric(us(hash), "µs/hash")
	b.ReportMetric(us(sign), "µs/sign")
	b.ReportMetric(us(prove), "µs/prove")
}

// BenchmarkVerifyLog is what proving every event adds to log verify: the
// whole check (chain, proofs, verdicts, derived tables) beside the walk of
// the chain alone, on one log of 20,000 events, in the same run.
func BenchmarkVerifyLog(b *testing.B) {
	e := newEnv(b, filepath.Join(b.TempDir(), "broker.db"))
	e.project("acme", "web")
	tm := e.team("t1")
	fill(b, e.b, tm, 20000)
	ctx := context.Background()
	var chain, full time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if v, err := e.b.verify(ctx, nil, false); err != nil || !v.OK {
			b.Fatalf("%+v %v", v, err)
		}
		t1 := time.Now()
		if v, err := e.b.VerifyLog(ctx); err != nil || !v.OK {
			b.Fatalf("%+v %v", v, err)
		}
		chain, full = chain+t1.Sub(t0), full+time.Since(t1)
	}
	n := float64(e.head()) * float64(b.N)
	b.ReportMetric(float64(chain)/float64(time.Microsecond)/n, "µs/event-chain")
	b.ReportMetric(float64(full)/float64(time.Microsecond)/n, "µs/event-verify")
	b.ReportMetric(float64(full)/float64(chain), "ratio")
}
