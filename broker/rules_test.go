package broker

import (
	"context"
	"strings"
	"sync"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// team is one task with a worker, a reviewer and a closer.
type team struct {
	worker, reviewer, closer actor
}

func (e *env) team(task string) team {
	e.t.Helper()
	e.task("acme", "web", task)
	return team{
		worker:   e.grant("acme", "web", task, "worker", authz.CapPushWorking, authz.CapReviewRequest),
		reviewer: e.grant("acme", "web", task, "reviewer", authz.CapReviewVerdict),
		closer:   e.grant("acme", "web", task, "closer", authz.CapTaskClose),
	}
}

func (e *env) request(a actor) *brokerv1.RequestReviewResponse {
	e.t.Helper()
	r, err := e.srv.RequestReview(a.ctx(), &brokerv1.RequestReviewRequest{})
	if err != nil {
		e.t.Fatalf("RequestReview: %v", err)
	}
	return r
}

// verdict gives v on request id, naming the request's own commit as the
// one the reviewer saw (verdict_test.go tries the others), or some commit
// for a request that does not exist.
func (e *env) verdict(a actor, id string, v brokerv1.Verdict) error {
	r, ok, err := e.b.st.read().request(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	if !ok {
		r.Commit = commit(0)
	}
	_, err = e.srv.SubmitVerdict(a.ctx(), &brokerv1.SubmitVerdictRequest{RequestId: id, Verdict: v, Commit: r.Commit})
	return err
}

func (e *env) close(a actor) error {
	_, err := e.srv.CloseTask(a.ctx(), &brokerv1.CloseTaskRequest{})
	return err
}

func TestPushes(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		e.team("t2")
		ctx := context.Background()
		if err := e.b.TaskOpen(ctx, tm.worker.G); err != nil {
			t.Fatalf("TaskOpen: %v", err)
		}
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		before := e.head()
		g := tm.worker.G
		for _, c := range []struct {
			name string
			g    authz.Grant
			p    authz.Push
			code errdefs.Kind
		}{
			{"another task", g, authz.Push{Business: "acme", Project: "web", Task: "t2", Commit: commit(2)}, errdefs.KindPermissionDenied},
			{"another ref", g, authz.Push{Business: "acme", Project: "web", Task: "t1", Commit: commit(2), Ref: "refs/heads/main"}, errdefs.KindInvalidArgument},
			{"short commit", g, authz.Push{Business: "acme", Project: "web", Task: "t1", Commit: "abc"}, errdefs.KindInvalidArgument},
			{"no push capability", tm.reviewer.G, authz.Push{Business: "acme", Project: "web", Task: "t1", Commit: commit(2)}, errdefs.KindPermissionDenied},
			{"host", authz.Grant{ID: authz.HostID, Host: true}, authz.Push{Business: "acme", Project: "web", Task: "t1", Commit: commit(2)}, errdefs.KindPermissionDenied},
			{"forged grant struct", authz.Grant{ID: tm.reviewer.ID, Business: "acme", Project: "web", Task: "t1", Caps: []string{authz.CapPushWorking}}, authz.Push{Business: "acme", Project: "web", Task: "t1", Commit: commit(2)}, errdefs.KindPermissionDenied},
		} {
			e.refused(e.b.RecordPush(ctx, c.g, c.p, authz.Peer{}), c.code, before, c.name)
		}
		if err := e.push(tm.worker, 3); err != nil {
			t.Fatal(err)
		}
		last, err := e.b.LastPushes(ctx, "acme", "web")
		if err != nil || len(last) != 1 || last["t1"] != commit(3) {
			t.Fatalf("LastPushes: %v %v", last, err)
		}
		evs := e.events(Filter{Task: "t1"})
		p := evs[len(evs)-1]
		if p.Type != TypeActionAllowed || p.Actor != tm.worker.ID || p.Peer != "pid=42,uid=1000,gid=1000" ||
			p.Data != `{"capability":"git.push.working","commit":"`+commit(3)+`","previous":"`+commit(1)+`","ref":"refs/work/t1"}` {
			t.Fatalf("push event: %+v", p)
		}
	})
}

func TestReviewRules(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		before := e.head()
		_, err := e.srv.RequestReview(tm.worker.ctx(), &brokerv1.RequestReviewRequest{})
		e.refused(err, errdefs.KindFailedPrecondition, before, "review of no push")
		_, err = e.srv.RequestReview(tm.closer.ctx(), &brokerv1.RequestReviewRequest{})
		e.refused(err, errdefs.KindPermissionDenied, before, "review request without the capability")

		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		r1 := e.request(tm.worker)
		if !r1.Created || r1.Commit != commit(1) {
			t.Fatalf("request: %+v", r1)
		}
		before = e.head()
		again := e.request(tm.worker)
		if again.Created || again.RequestId != r1.RequestId || e.head() != before {
			t.Fatalf("asking again: %+v, log %d -> %d", again, before, e.head())
		}

		e.refused(e.verdict(tm.reviewer, r1.RequestId, brokerv1.Verdict_VERDICT_UNSPECIFIED), errdefs.KindInvalidArgument, before, "unspecified verdict")
		e.refused(e.verdict(tm.reviewer, "r-0000000000000000", brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindNotFound, before, "unknown request")
		e.refused(e.verdict(tm.worker, r1.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindPermissionDenied, before, "verdict without the capability")

		// Stale: a newer push makes r1's verdict meaningless.
		if err := e.push(tm.worker, 2); err != nil {
			t.Fatal(err)
		}
		before = e.head()
		e.refused(e.verdict(tm.reviewer, r1.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindFailedPrecondition, before, "stale verdict")
		r2 := e.request(tm.worker)
		if r2.RequestId == r1.RequestId || r2.Commit != commit(2) {
			t.Fatalf("request after a new push: %+v", r2)
		}
		if err := e.verdict(tm.reviewer, r2.RequestId, brokerv1.Verdict_VERDICT_REJECT); err != nil {
			t.Fatal(err)
		}
		before = e.head()
		e.refused(e.verdict(tm.reviewer, r2.RequestId, brokerv1.Verdict_VERDICT_REJECT), errdefs.KindFailedPrecondition, before, "second verdict, same")
		e.refused(e.verdict(tm.reviewer, r2.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindFailedPrecondition, before, "second verdict, changed")
		e.verify()
	})
}

func TestCloseGate(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")

		// A task without a push closes.
		quiet := e.team("quiet")
		if err := e.close(quiet.closer); err != nil {
			t.Fatalf("close of a task without a push: %v", err)
		}

		tm := e.team("t1")
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		before := e.head()
		e.refused(e.close(tm.closer), errdefs.KindFailedPrecondition, before, "close with no review")
		r := e.request(tm.worker)
		before = e.head()
		e.refused(e.close(tm.closer), errdefs.KindFailedPrecondition, before, "close with a pending review")
		if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_REJECT); err != nil {
			t.Fatal(err)
		}
		before = e.head()
		e.refused(e.close(tm.closer), errdefs.KindFailedPrecondition, before, "close with a reject")

		if err := e.push(tm.worker, 2); err != nil {
			t.Fatal(err)
		}
		r = e.request(tm.worker)
		if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatal(err)
		}
		if err := e.close(tm.closer); err != nil {
			t.Fatalf("close after approve: %v", err)
		}

		// Closed: no more pushes, reviews, verdicts or closes.
		before = e.head()
		e.refused(e.push(tm.worker, 3), errdefs.KindFailedPrecondition, before, "push to a closed task")
		if err := e.b.TaskOpen(context.Background(), tm.worker.G); err == nil {
			t.Fatal("TaskOpen of a closed task")
		}
		_, err := e.srv.RequestReview(tm.worker.ctx(), &brokerv1.RequestReviewRequest{})
		e.refused(err, errdefs.KindFailedPrecondition, before, "review of a closed task")
		e.refused(e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindFailedPrecondition, before, "verdict on a closed task")
		e.refused(e.close(tm.closer), errdefs.KindFailedPrecondition, before, "second close")
		_, err = e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "late", Capabilities: []string{authz.CapPushWorking}})
		e.refused(err, errdefs.KindFailedPrecondition, before, "grant for a closed task")

		var types []string
		for _, ev := range e.events(Filter{Task: "t1"}) {
			types = append(types, ev.Type)
		}
		want := "task.added grant.created grant.created grant.created action.allowed review.request review.verdict action.allowed review.request review.verdict task.closed"
		if got := strings.Join(types, " "); got != want {
			t.Fatalf("events:\n got %s\nwant %s", got, want)
		}
		e.verify()
	})
}

// An agent holding every capability still cannot close without a real
// approve of its latest push by another grant of the same task.
func TestCannotForgeApproval(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		agent := e.grant("acme", "web", "t1", "agent", authz.Capabilities...)
		other := e.team("t2")
		if err := e.push(agent, 1); err != nil {
			t.Fatal(err)
		}
		r := e.request(agent)
		before := e.head()

		for _, typ := range []string{"review.verdict", "action.allowed", "task.closed", "grant.created", "review", "Review.verdict", "review.verdict ", "revіew.verdict"} {
			_, err := e.srv.RecordEvent(agent.ctx(), &brokerv1.RecordEventRequest{Type: typ,
				Data: `{"request_id":"` + r.RequestId + `","verdict":"approve","commit":"` + commit(1) + `"}`})
			if err == nil {
				t.Fatalf("forged %q accepted", typ)
			}
			e.refused(err, codesOf(err), before, "forged "+typ)
			if c := codesOf(err); c != errdefs.KindPermissionDenied && c != errdefs.KindInvalidArgument {
				t.Fatalf("forged %q: %v", typ, err)
			}
		}
		e.refused(e.close(agent), errdefs.KindFailedPrecondition, before, "close after forged events")

		// Its own approval.
		e.refused(e.verdict(agent, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindFailedPrecondition, before, "self-review")

		// An approval of another task, and a request id of another task.
		if err := e.push(other.worker, 9); err != nil {
			t.Fatal(err)
		}
		ro := e.request(other.worker)
		if err := e.verdict(other.reviewer, ro.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatal(err)
		}
		before = e.head()
		e.refused(e.verdict(agent, ro.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindNotFound, before, "request id of another task")
		e.refused(e.verdict(other.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE), errdefs.KindNotFound, before, "reviewer of another task")
		e.refused(e.close(agent), errdefs.KindFailedPrecondition, before, "close with another task's approve")

		// An approval of an older push.
		reviewer := e.grant("acme", "web", "t1", "reviewer", authz.CapReviewVerdict)
		if err := e.verdict(reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatal(err)
		}
		if err := e.push(agent, 2); err != nil {
			t.Fatal(err)
		}
		before = e.head()
		e.refused(e.close(agent), errdefs.KindFailedPrecondition, before, "close with an approve of an older push")
		r2 := e.request(agent)
		if err := e.verdict(reviewer, r2.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatal(err)
		}
		if err := e.close(agent); err != nil {
			t.Fatalf("close after a real approve: %v", err)
		}
		e.verify()
	})
}

// A push racing the close: whichever wins, never both, and the log never
// shows a push after the close.
func TestCloseRacesPush(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		const rounds = 60
		closedFirst, pushedFirst := 0, 0
		for i := 0; i < rounds; i++ {
			task := "race" + string(rune('a'+i/26)) + string(rune('a'+i%26))
			tm := e.team(task)
			if err := e.push(tm.worker, 1); err != nil {
				t.Fatal(err)
			}
			r := e.request(tm.worker)
			if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
				t.Fatal(err)
			}
			var pushErr, closeErr error
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); pushErr = e.push(tm.worker, 2) }()
			go func() { defer wg.Done(); closeErr = e.close(tm.closer) }()
			wg.Wait()
			switch {
			case pushErr == nil && closeErr == nil:
				t.Fatalf("round %d: both the push and the close were accepted", i)
			case pushErr != nil && closeErr != nil:
				t.Fatalf("round %d: both refused: push %v, close %v", i, pushErr, closeErr)
			case closeErr == nil:
				if codesOf(pushErr) != errdefs.KindFailedPrecondition {
					t.Fatalf("round %d: push refused with %v", i, pushErr)
				}
				closedFirst++
			default:
				if codesOf(closeErr) != errdefs.KindFailedPrecondition {
					t.Fatalf("round %d: close refused with %v", i, closeErr)
				}
				pushedFirst++
			}
			closed := false
			for _, ev := range e.events(Filter{Task: task}) {
				if ev.Type == TypeTaskClosed {
					closed = true
				}
				if closed && ev.Type == TypeActionAllowed {
					t.Fatalf("round %d: a push was appended after the close", i)
				}
			}
		}
		t.Logf("%d rounds: close won %d, push won %d", rounds, closedFirst, pushedFirst)
		e.verify()
	})
}
