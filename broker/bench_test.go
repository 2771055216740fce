package broker

import (
	"context"
	"fmt"
	"github.com/bushost/bushost/internal/errdefs"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

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
			if _, err := e.b.CloseTask(context.Background(), pending.closer.G, ""); codesOf(errdefs.ToGRPC(err)) != codes.FailedPrecondition {
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
