package broker

import (
	"context"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// A reopening withdraws the approvals given before it: the approve that
// closed the task once opens neither close nor land again, whatever the
// derived tables say; a new push with its own approve does.
func TestReopenWithdrawsApproval(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.project("acme", "web")
		tm := e.team("t1")
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		r := e.request(tm.worker)
		if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatal(err)
		}
		if err := e.close(tm.closer); err != nil {
			t.Fatalf("close after approve: %v", err)
		}
		if _, err := e.b.ReopenTask(ctx, "", "acme", "web", "t1"); err != nil {
			t.Fatalf("reopen: %v", err)
		}

		before := e.head()
		err := e.close(tm.closer)
		e.refused(err, errdefs.KindFailedPrecondition, before, "close on an approve given before the reopening")
		if got := errdefs.Of(err); got.Reason != errdefs.GateNoApproval || got.Metadata["review"] != "withdrawn" {
			t.Fatalf("close after reopen: %+v", got)
		}
		_, err = e.b.LandApproved(ctx, authz.Grant{ID: authz.HostID, Host: true}, "acme", "web", "t1", false)
		e.refused(err, errdefs.KindFailedPrecondition, before, "land on an approve given before the reopening")
		land := authz.Landing{Business: "acme", Project: "web", Task: "t1", Approved: commit(1), Old: commit(9), New: commit(1)}
		_, err = e.b.RecordLanding(ctx, authz.Grant{ID: authz.HostID, Host: true}, land, authz.Peer{})
		e.refused(err, errdefs.KindFailedPrecondition, before, "landing recorded on an approve given before the reopening")
		// The same request takes no second verdict: the way on is a new push.
		e.refused(e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindFailedPrecondition, before, "second verdict after the reopening")
		// Nor is it asked for again in silence: a review request names the
		// withdrawn verdict and the new push it needs.
		_, err = e.srv.RequestReview(tm.worker.ctx(), &brokerv1.RequestReviewRequest{})
		e.refused(err, errdefs.KindFailedPrecondition, before, "review request of a push whose verdict the reopening withdrew")
		if got := errdefs.Of(err); got.Reason != errdefs.VerdictGiven || got.Metadata["request"] != r.RequestId || got.Metadata["reopened_seq"] == "" {
			t.Fatalf("review request after reopen: %+v", got)
		}

		if err := e.push(tm.worker, 2); err != nil {
			t.Fatal(err)
		}
		r2 := e.request(tm.worker)
		if r2.RequestId == r.RequestId {
			t.Fatalf("the new push reuses request %s", r.RequestId)
		}
		if err := e.verdict(tm.reviewer, r2.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatal(err)
		}
		if c, err := e.b.LandApproved(ctx, authz.Grant{ID: authz.HostID, Host: true}, "acme", "web", "t1", false); err != nil || c != commit(2) {
			t.Fatalf("land after a new approve: %q %v", c, err)
		}
		if err := e.close(tm.closer); err != nil {
			t.Fatalf("close after a new approve: %v", err)
		}
		e.verify()
	})
}
