package broker

import (
	"context"
	"testing"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
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
		e.refused(err, errdefs.KindUnauthenticated, before, "a verdict with a token swapped into the reviewer's grant")
		if reasonOf(err) != errdefs.GrantTokenMismatch {
			t.Fatalf("a verdict with a token swapped into the reviewer's grant: %v", err)
		}

		// A grant.created of its own too, recording its token: unsigned,
		// it vouches for nothing.
		e.forge(Event{Business: "acme", Project: "web", Task: "t1", Type: TypeGrantCreated, Actor: authz.HostID,
			Data: mustData(map[string]any{"grant_id": tm.reviewer.ID, "role": "reviewer", "capabilities": []string{authz.CapReviewVerdict},
				"expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "token_hash": tokenHash(forged)})})
		before = e.head()
		err = e.verdict(intruder, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE)
		e.refused(err, errdefs.KindUnauthenticated, before, "a verdict with a swapped token and a forged grant.created")
		if reasonOf(err) != errdefs.GrantTokenMismatch {
			t.Fatalf("a verdict with a swapped token and a forged grant.created: %v", err)
		}
		e.exec(`DELETE FROM events WHERE seq = $1`, before)
		before = e.head()

		// Put back, the row is the reviewer's again: no verdict was
		// recorded, so the gate stays shut and the real reviewer may judge.
		e.exec(`UPDATE grants SET token_hash = $1 WHERE id = $2`, tokenHash(tm.reviewer.Token), tm.reviewer.ID)
		e.refused(e.close(tm.closer), errdefs.KindFailedPrecondition, before, "close after the refused verdict")
		if _, err := e.b.LandApproved(context.Background(), authz.Grant{ID: authz.HostID, Host: true}, "acme", "web", "t1", false); codesOf(err) != errdefs.KindFailedPrecondition {
			t.Fatalf("land after the refused verdict: %v", err)
		}
		if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatalf("the real reviewer's verdict: %v", err)
		}
		e.verify()
	})
}

// The same swap on the worker's row lets a reviewer push as the worker
// and then approve what it pushed itself, with its own token: the log
// would show a push by the worker and a verdict by another grant. So a
// push, too, is recorded only with the token its grant was created with.
func TestSwappedTokenPushesAsNoOne(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		const forged = "bht_the_reviewer_pushing_as_the_worker"
		e.exec(`UPDATE grants SET token_hash = $1 WHERE id = $2`, tokenHash(forged), tm.worker.ID)
		g, err := e.b.Authorize(context.Background(), forged, authz.CapPushWorking)
		if err != nil || g.ID != tm.worker.ID {
			t.Fatalf("the swapped row does not answer the token: %v %v", g, err)
		}
		before := e.head()
		err = e.b.RecordPush(context.Background(), g, authz.Push{Business: "acme", Project: "web", Task: "t1", Commit: commit(1), Ref: "refs/work/t1"}, authz.Peer{})
		e.refused(err, errdefs.KindUnauthenticated, before, "a push with a token swapped into the worker's grant")
		if reasonOf(err) != errdefs.GrantTokenMismatch {
			t.Fatalf("a push with a token swapped into the worker's grant: %v", err)
		}
		e.exec(`UPDATE grants SET token_hash = $1 WHERE id = $2`, tokenHash(tm.worker.Token), tm.worker.ID)
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatalf("the real worker's push: %v", err)
		}
		e.verify()
	})
}
