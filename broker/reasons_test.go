package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// TestRefusalReasons: the broker's refusals reach a client with their
// reason and metadata in the status's ErrorInfo (and the Authority's, in
// process, as domain errors with the same reason), and append nothing.
func TestRefusalReasons(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.project("acme", "web")
		tm := e.team("t1")
		agent := e.grant("acme", "web", "t1", "agent", authz.CapPushWorking, authz.CapReviewRequest, authz.CapReviewVerdict)
		reason := func(err error, want errdefs.Reason, what string) *errdefs.Error {
			t.Helper()
			before := e.head()
			got := errdefs.Of(err)
			if err == nil || got.Reason != want {
				t.Fatalf("%s: reason %q (%v), want %s", what, got.Reason, err, want)
			}
			if e.head() != before {
				t.Fatalf("%s: the log grew", what)
			}
			return got
		}
		_, err := e.srv.RecordEvent(ctx, &brokerv1.RecordEventRequest{Type: "note"})
		reason(err, errdefs.TokenMissing, "no token")
		_, err = e.srv.RecordEvent(withToken("bht_not-a-token"), &brokerv1.RecordEventRequest{Type: "note"})
		reason(err, errdefs.TokenUnknown, "unknown token")
		_, err = e.b.Authorize(ctx, tm.reviewer.Token, authz.CapPushWorking)
		reason(err, errdefs.CapabilityMissing, "Authority: missing capability")
		_, err = e.srv.CloseTask(e.host(), &brokerv1.CloseTaskRequest{})
		reason(err, errdefs.HostNotAGrant, "host closing")
		_, err = e.srv.AddTask(tm.worker.ctx(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: "t9"})
		reason(err, errdefs.HostOnly, "grant adding a task")
		_, err = e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: "acme/web/t3"})
		reason(err, errdefs.NameInvalid, "task name with slashes")
		_, err = e.srv.RequestReview(tm.worker.ctx(), &brokerv1.RequestReviewRequest{})
		reason(err, errdefs.NoPushToReview, "review of no push")

		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		reason(e.close(tm.closer), errdefs.GateNoApproval, "close with no review")
		r1 := e.request(tm.worker)
		if x := reason(e.close(tm.closer), errdefs.GateNoApproval, "close pending"); x.Metadata["review"] != "pending" || x.Metadata["commit"] != commit(1) {
			t.Fatalf("gate metadata: %v", x.Metadata)
		}
		if err := e.push(tm.worker, 2); err != nil {
			t.Fatal(err)
		}
		x := reason(e.verdict(tm.reviewer, r1.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.ReviewStale, "stale verdict")
		if x.Metadata["latest"] != commit(2) || errdefs.ExitCode(x) != errdefs.ExitConflict {
			t.Fatalf("stale: %v exit %d", x.Metadata, errdefs.ExitCode(x))
		}
		r2 := e.request(tm.worker)
		if err := e.verdict(tm.reviewer, r2.RequestId, brokerv1.Verdict_VERDICT_REJECT); err != nil {
			t.Fatal(err)
		}
		reason(e.verdict(tm.reviewer, r2.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.VerdictGiven, "second verdict")
		if x := reason(e.close(tm.closer), errdefs.GateNoApproval, "close rejected"); x.Metadata["review"] != "rejected" {
			t.Fatalf("gate metadata: %v", x.Metadata)
		}
		// Asking again for a review of the rejected push is refused, naming
		// the reject and what comes next, rather than answering the same
		// request id.
		_, err = e.srv.RequestReview(tm.worker.ctx(), &brokerv1.RequestReviewRequest{})
		if x := reason(err, errdefs.VerdictGiven, "review request of a rejected push"); x.Metadata["request"] != r2.RequestId ||
			x.Metadata["verdict"] != Reject || x.Metadata["commit"] != commit(2) || !strings.Contains(x.Message, "push a new commit") {
			t.Fatalf("review request of a rejected push: %v %q", x.Metadata, x.Message)
		}

		// Self-review: the agent pushed, and may not judge its own push.
		if err := e.push(agent, 3); err != nil {
			t.Fatal(err)
		}
		r3 := e.request(agent)
		reason(e.verdict(agent, r3.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.SelfReview, "self-review")

		_, err = e.srv.RecordEvent(tm.worker.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
		reason(err, errdefs.CapabilityMissing, "record without event.record")
		rec := e.grant("acme", "web", "t1", "rec", authz.CapEventRecord)
		_, err = e.srv.RecordEvent(rec.ctx(), &brokerv1.RecordEventRequest{Type: "task.closed"})
		reason(err, errdefs.EventTypeReserved, "reserved type")
		_, err = e.srv.RecordEvent(rec.ctx(), &brokerv1.RecordEventRequest{Type: "Note"})
		reason(err, errdefs.EventTypeInvalid, "bad type")
		_, err = e.srv.RecordEvent(rec.ctx(), &brokerv1.RecordEventRequest{Type: "note", Data: "[1]"})
		reason(err, errdefs.EventDataInvalid, "data not an object")

		if _, err := e.srv.RevokeGrant(e.host(), &brokerv1.RevokeGrantRequest{GrantId: rec.ID}); err != nil {
			t.Fatal(err)
		}
		_, err = e.srv.RecordEvent(rec.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
		reason(err, errdefs.GrantRevoked, "revoked")
		ig, err := e.b.CreateGrant(ctx, "", GrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "w", Caps: []string{authz.CapEventRecord}, TTL: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.srv.RecordEvent(withToken(ig.Token), &brokerv1.RecordEventRequest{Type: "note"})
		reason(err, errdefs.TokenExpired, "expired")
	})
}
