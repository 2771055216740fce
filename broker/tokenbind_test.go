package broker

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
)

// A database writer that cannot sign can still rewrite the grants table:
// it points the task's real reviewer grant at a token of its own making
// and calls the broker with it. The verdict would carry the real
// reviewer's grant id, which the log shows holding review.verdict, so the
// gate's replay (approvedBy) and log verify could not tell: the host must
// refuse to sign a verdict whose token is not the one the grant was
// created with.
func TestSwappedTokenGivesNoVerdict(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		r := e.request(tm.worker)

		const forged = "bht_chosen_by_the_database_writer"
		e.exec(`UPDATE grants SET token_hash = $1 WHERE id = $2`, tokenHash(forged), tm.reviewer.ID)
		intruder := actor{ID: tm.reviewer.ID, Token: forged}
		before := e.head()
		err := e.verdict(intruder, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE)
		e.refused(err, codes.Unauthenticated, before, "a verdict with a token swapped into the reviewer's grant")

		// Put back, the row is the reviewer's again: no verdict was
		// recorded, so the gate stays shut and the real reviewer may judge.
		e.exec(`UPDATE grants SET token_hash = $1 WHERE id = $2`, tokenHash(tm.reviewer.Token), tm.reviewer.ID)
		e.refused(e.close(tm.closer), codes.FailedPrecondition, before, "close after the refused verdict")
		if _, err := e.b.LandApproved(context.Background(), authz.Grant{ID: authz.HostID, Host: true}, "acme", "web", "t1", false); codesOf(err) != codes.FailedPrecondition {
			t.Fatalf("land after the refused verdict: %v", err)
		}
		if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatalf("the real reviewer's verdict: %v", err)
		}
		e.verify()
	})
}
