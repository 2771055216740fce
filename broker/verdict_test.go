package broker

import (
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/errdefs"
)

// The verdict attack of issue 13: the reviewer fetched commit 1, the worker
// pushed 2 and asked for a review; the reviewer's approval names what it
// saw (1), so it cannot approve 2, and a verdict naming no commit is no
// verdict at all.
func TestVerdictNamesTheCommitSeen(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		seen := commit(1)
		if err := e.push(tm.worker, 2); err != nil {
			t.Fatal(err)
		}
		r := e.request(tm.worker)
		before := e.head()
		for _, c := range []struct {
			name   string
			commit string
			code   errdefs.Kind
			reason errdefs.Reason
		}{
			{"no commit", "", errdefs.KindInvalidArgument, errdefs.VerdictCommitMissing},
			{"short commit", "abc", errdefs.KindInvalidArgument, errdefs.VerdictCommitMissing},
			{"the commit seen before the push", seen, errdefs.KindFailedPrecondition, errdefs.VerdictCommitMismatch},
		} {
			_, err := e.srv.SubmitVerdict(tm.reviewer.ctx(), &brokerv1.SubmitVerdictRequest{RequestId: r.RequestId, Verdict: brokerv1.Verdict_VERDICT_APPROVE, Commit: c.commit})
			e.refused(err, c.code, before, c.name)
			if got := errdefs.Of(err); got.Reason != c.reason {
				t.Fatalf("%s: reason %q, want %q (%v)", c.name, got.Reason, c.reason, err)
			}
			if c.reason == errdefs.VerdictCommitMismatch {
				got := errdefs.Of(err)
				if got.Metadata["request_commit"] != commit(2) || got.Metadata["verdict_commit"] != seen {
					t.Fatalf("mismatch names %v, want both commits", got.Metadata)
				}
			}
		}
		e.refused(e.close(tm.closer), errdefs.KindFailedPrecondition, before, "close after the refused verdicts")
		if _, err := e.srv.SubmitVerdict(tm.reviewer.ctx(), &brokerv1.SubmitVerdictRequest{RequestId: r.RequestId, Verdict: brokerv1.Verdict_VERDICT_APPROVE, Commit: commit(2)}); err != nil {
			t.Fatalf("verdict on the commit seen: %v", err)
		}
		if err := e.close(tm.closer); err != nil {
			t.Fatalf("close after the approval: %v", err)
		}
		e.verify()
	})
}
