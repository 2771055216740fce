package broker

import (
	"context"
	"fmt"
	"sync"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// Two brokers on one store, as two bushostd sharing a PostgreSQL database
// (or, for SQLite, two processes on one file): grants, events and the close
// gate agree, because the serialization lives in the database, not in
// either process.
func TestTwoBrokersShareOneStore(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			a, b := newEnv(t, dsn), newEnv(t, dsn)
			a.project("acme", "web")
			ctx := context.Background()

			// A grant issued through one is honoured by the other.
			a.task("acme", "web", "shared")
			w := a.grant("acme", "web", "shared", "agent", authz.CapEventRecord)
			if _, err := b.b.Authorize(ctx, w.Token, authz.CapEventRecord); err != nil {
				t.Fatalf("grant from A refused by B: %v", err)
			}

			// Appends from both interleave into one gapless, valid chain.
			var wg sync.WaitGroup
			for _, e := range []*env{a, b, a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 25; i++ {
						if _, err := e.srv.RecordEvent(w.ctx(), &brokerv1.RecordEventRequest{Type: "n"}); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			a.verify()

			// The gate holds across them: a push through A racing a close
			// through B never both succeed.
			for i := 0; i < 25; i++ {
				task := fmt.Sprintf("race%02d", i)
				tm := a.team(task)
				if err := a.push(tm.worker, 1); err != nil {
					t.Fatal(err)
				}
				r := b.request(tm.worker)
				if err := b.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
					t.Fatal(err)
				}
				var pushErr, closeErr error
				wg.Add(2)
				go func() { defer wg.Done(); pushErr = a.push(tm.worker, 2) }()
				go func() { defer wg.Done(); closeErr = b.close(tm.closer) }()
				wg.Wait()
				if (pushErr == nil) == (closeErr == nil) {
					t.Fatalf("round %d: push %v, close %v: exactly one must win", i, pushErr, closeErr)
				}
				for _, err := range []error{pushErr, closeErr} {
					if err != nil && codesOf(err) != errdefs.KindFailedPrecondition {
						t.Fatalf("round %d: refused with %v", i, err)
					}
				}
			}
			b.verify()
			if a.head() != b.head() {
				t.Fatalf("the two disagree on the log's head: %d vs %d", a.head(), b.head())
			}
		})
	}
}
