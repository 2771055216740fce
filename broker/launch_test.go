package broker

import (
	"context"
	"slices"
	"strings"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// TestLaunchSets: a grant with session.launch carries its launch set
// (stored, in grant.created, returned by Whoami); a bad set is refused
// with nothing appended; a launched grant is one launch deeper; session.*
// events come only from the host.
func TestLaunchSets(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		before := e.head()
		lr := func(role string, caps ...string) *brokerv1.LaunchRole {
			return &brokerv1.LaunchRole{Role: role, Capabilities: caps}
		}
		for _, c := range []struct {
			name   string
			caps   []string
			launch []*brokerv1.LaunchRole
		}{
			{"launch set without session.launch", []string{"git.push.working"}, []*brokerv1.LaunchRole{lr("worker", "git.push.working")}},
			{"bad role name", []string{"session.launch"}, []*brokerv1.LaunchRole{lr("Worker/..", "git.push.working")}},
			{"unknown capability", []string{"session.launch"}, []*brokerv1.LaunchRole{lr("worker", "git.push.everything")}},
			{"network.audit in a set", []string{"session.launch"}, []*brokerv1.LaunchRole{lr("worker", "network.audit")}},
			{"role with no capabilities", []string{"session.launch"}, []*brokerv1.LaunchRole{lr("worker")}},
			{"role given twice", []string{"session.launch"}, []*brokerv1.LaunchRole{lr("worker", "git.push.working"), lr("worker", "review.request")}},
		} {
			_, err := e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "lead", Capabilities: c.caps, Launch: c.launch})
			e.refused(err, errdefs.KindInvalidArgument, before, c.name)
		}

		r, err := e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "lead",
			Capabilities: []string{"session.launch"},
			Launch:       []*brokerv1.LaunchRole{lr("worker", "review.request", "git.push.working"), lr("reviewer", "review.verdict")}})
		if err != nil {
			t.Fatalf("CreateGrant with a launch set: %v", err)
		}
		w, err := e.srv.Whoami(withToken(r.Token), &brokerv1.WhoamiRequest{})
		if err != nil {
			t.Fatalf("Whoami: %v", err)
		}
		got := map[string][]string{}
		for _, x := range w.Launch {
			got[x.Role] = x.Capabilities
		}
		if w.GrantId != r.GrantId || w.Task != "t1" || w.LaunchDepth != 0 || len(got) != 2 ||
			!slices.Equal(got["worker"], []string{"git.push.working", "review.request"}) || !slices.Equal(got["reviewer"], []string{"review.verdict"}) {
			t.Fatalf("Whoami = %v", w)
		}
		evs := e.events(Filter{Task: "t1"})
		last := evs[len(evs)-1]
		if last.Type != TypeGrantCreated || !strings.Contains(last.Data, `"launch":{"reviewer":["review.verdict"],"worker":["git.push.working","review.request"]}`) {
			t.Fatalf("grant.created = %s", last.Data)
		}

		c, err := e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "worker",
			Capabilities: []string{"git.push.working"}, LaunchedBy: r.GrantId})
		if err != nil {
			t.Fatal(err)
		}
		cw, err := e.srv.Whoami(withToken(c.Token), &brokerv1.WhoamiRequest{})
		if err != nil || cw.LaunchedBy != r.GrantId || cw.LaunchDepth != 1 || len(cw.Launch) != 0 {
			t.Fatalf("launched grant: %v %v", cw, err)
		}

		// session.* is reserved to the host: a grant cannot forge it.
		ev := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		before = e.head()
		_, err = e.srv.RecordEvent(ev.ctx(), &brokerv1.RecordEventRequest{Type: "session.ended", Data: `{}`})
		e.refused(err, errdefs.KindPermissionDenied, before, "a grant recording session.ended")
		_, err = e.srv.RecordEvent(ev.ctx(), &brokerv1.RecordEventRequest{Type: "session.ended", Business: "acme", Project: "web", Task: "t1"})
		e.refused(err, errdefs.KindPermissionDenied, before, "a grant recording a host session event")
		_, err = e.srv.RecordEvent(e.host(), &brokerv1.RecordEventRequest{Type: "agent.step", Business: "acme", Project: "web", Task: "t1"})
		e.refused(err, errdefs.KindInvalidArgument, before, "the host recording a non-session event")
		for range 2 {
			if _, err := e.srv.RecordEvent(e.host(), &brokerv1.RecordEventRequest{Type: "session.ended", Data: `{"id":"s-1"}`, Business: "acme", Project: "web", Task: "t1", IdempotencyKey: "s-1"}); err != nil {
				t.Fatalf("host session.ended: %v", err)
			}
		}
		if h := e.head(); h != before+1 {
			t.Fatalf("session.ended twice with one key appended %d events", h-before)
		}
		e.verify()

		// A launch set widened in the table is named by log verify.
		e.exec(`UPDATE grants SET launch = $1 WHERE id = $2`, `{"worker":["git.push.working","task.land"]}`, r.GrantId)
		v, err := e.b.VerifyLog(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if joined := strings.Join(v.Differences, "\n"); v.OK || !strings.Contains(joined, "grants "+r.GrantId+": launch is") {
			t.Fatalf("log verify after widening a launch set: %+v", v)
		}
	})
}

// TestLaunchBounds: a launch set's network modes, ceilings, task pattern
// and egress are stored canonically, in grant.created, returned by Whoami
// and ListGrants; bad ones (or any without session.launch) are refused
// with nothing appended; bounds widened in the table are named by log
// verify.
func TestLaunchBounds(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		before := e.head()
		worker := []*brokerv1.LaunchRole{{Role: "worker", Capabilities: []string{"git.push.working"}}}
		for _, c := range []struct {
			name string
			caps []string
			lb   *brokerv1.LaunchBounds
		}{
			{"bounds without session.launch", []string{"git.push.working"}, &brokerv1.LaunchBounds{Net: []string{"host"}}},
			{"unknown network mode", []string{"session.launch"}, &brokerv1.LaunchBounds{Net: []string{"everything"}}},
			{"unknown limit", []string{"session.launch"}, &brokerv1.LaunchBounds{Max: map[string]string{"gpu": "1"}}},
			{"bad ceiling", []string{"session.launch"}, &brokerv1.LaunchBounds{Max: map[string]string{"pids": "lots"}}},
			{"bad task pattern", []string{"session.launch"}, &brokerv1.LaunchBounds{Tasks: "../t"}},
			{"bad domain", []string{"session.launch"}, &brokerv1.LaunchBounds{AllowDomains: []string{"*"}}},
		} {
			_, err := e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "lead", Capabilities: c.caps, Launch: worker, LaunchBounds: c.lb})
			e.refused(err, errdefs.KindInvalidArgument, before, c.name)
		}
		r, err := e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "lead",
			Capabilities: []string{"session.launch"}, Launch: worker,
			LaunchBounds: &brokerv1.LaunchBounds{Net: []string{"proxy", "none"}, Max: map[string]string{"memory": "1024M", "timeout": "2h"}, Tasks: "t*", AllowHosts: []string{"DB:5432"}}})
		if err != nil {
			t.Fatal(err)
		}
		w, err := e.srv.Whoami(withToken(r.Token), &brokerv1.WhoamiRequest{})
		lb := w.GetLaunchBounds()
		if err != nil || strings.Join(lb.GetNet(), ",") != "none,proxy" || lb.GetMax()["memory"] != "1G" || lb.GetMax()["timeout"] != "2h0m0s" ||
			lb.GetTasks() != "t*" || strings.Join(lb.GetAllowHosts(), ",") != "db:5432" {
			t.Fatalf("Whoami's launch bounds: %v %v", lb, err)
		}
		l, err := e.srv.ListGrants(e.host(), &brokerv1.ListGrantsRequest{Task: "t1"})
		if err != nil || len(l.Grants) != 1 || l.Grants[0].GetLaunchBounds().GetTasks() != "t*" {
			t.Fatalf("ListGrants: %v %v", l, err)
		}
		evs := e.events(Filter{Task: "t1"})
		if last := evs[len(evs)-1]; !strings.Contains(last.Data, `"launch_bounds":{"net":["none","proxy"],"max":{"memory":"1G","timeout":"2h0m0s"},"tasks":"t*","allow_hosts":["db:5432"]}`) {
			t.Fatalf("grant.created = %s", last.Data)
		}
		e.verify()
		e.exec(`UPDATE grants SET launch_bounds = $1 WHERE id = $2`, `{"net":["none","proxy","host"]}`, r.GrantId)
		v, err := e.b.VerifyLog(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if joined := strings.Join(v.Differences, "\n"); v.OK || !strings.Contains(joined, "grants "+r.GrantId+": launch_bounds is") {
			t.Fatalf("log verify after widening launch bounds: %+v", v)
		}
	})
}
