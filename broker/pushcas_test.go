package broker

import (
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// TestPushExtendsLatestRecorded: recording a push is a compare-and-swap on
// the task's latest recorded push, so two hosts sharing the store can never
// both extend the same commit, and the log's pushes of a task form one
// chain. A retry of a push whose record committed is answered as accepted.
func TestPushExtendsLatestRecorded(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		if err := e.pushFrom(tm.worker, 1, ""); err != nil {
			t.Fatalf("first push: %v", err)
		}
		// The fork: another first push of the same task.
		before := e.head()
		err := e.pushFrom(tm.worker, 2, "")
		e.refused(err, errdefs.KindAborted, before, "a second first push")
		if r := errdefs.ReasonOf(err); r != errdefs.PushConflict {
			t.Fatalf("reason %s, want PUSH_CONFLICT", r)
		}
		if ee, _ := errdefs.As(err); ee.Metadata["latest"] != commit(1) {
			t.Fatalf("conflict does not name the latest push: %+v", ee)
		}
		// A push from a commit that was never the latest.
		e.refused(e.pushFrom(tm.worker, 3, commit(9)), errdefs.KindAborted, before, "a push from an unrecorded commit")
		// The retry of the first push (same commit, same previous) is
		// accepted without a second record.
		if err := e.pushFrom(tm.worker, 1, ""); err != nil {
			t.Fatalf("retry of a recorded push: %v", err)
		}
		if e.head() != before {
			t.Fatalf("the retry appended an event")
		}
		if err := e.pushFrom(tm.worker, 2, commit(1)); err != nil {
			t.Fatalf("push extending the latest: %v", err)
		}
		// An old push replayed after a newer one is a conflict, not a retry.
		before = e.head()
		e.refused(e.pushFrom(tm.worker, 1, ""), errdefs.KindAborted, before, "a replay of an older push")
		// The task's pushes form one chain.
		prev := ""
		for _, ev := range e.events(Filter{Task: "t1"}) {
			f, err := fieldsOf(ev)
			if err != nil {
				t.Fatal(err)
			}
			if !isPush(ev, f) {
				continue
			}
			if f.Previous != prev {
				t.Fatalf("push %d names previous %q, want %q", ev.Seq, f.Previous, prev)
			}
			prev = f.Commit
		}
		if prev != commit(2) {
			t.Fatalf("chain ends at %q", prev)
		}
	})
}
