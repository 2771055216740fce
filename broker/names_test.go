package broker

import (
	"context"
	"strings"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// TestTaskScopedCallsRefuseBadNames sends every task-scoped call a name
// no task can have: each is refused NAME_INVALID (not TASK_NOT_FOUND,
// not an empty answer) before any lookup, and the log does not grow.
func TestTaskScopedCallsRefuseBadNames(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		a := e.grant("acme", "web", "t1", "worker", authz.CapPushWorking)
		for _, bad := range []string{"../z", "a/b", strings.Repeat("z", 64), "Z"} {
			calls := []struct {
				name string
				call func() error
			}{
				{"ListEvents task", func() error {
					s := &eventStream{ctx: e.host(), got: make(chan *brokerv1.Event, 10)}
					return e.srv.ListEvents(&brokerv1.ListEventsRequest{Business: "acme", Project: "web", Task: bad}, s)
				}},
				{"ListEvents business", func() error {
					s := &eventStream{ctx: e.host(), got: make(chan *brokerv1.Event, 10)}
					return e.srv.ListEvents(&brokerv1.ListEventsRequest{Business: bad}, s)
				}},
				{"ListTasks", func() error {
					_, err := e.srv.ListTasks(e.host(), &brokerv1.ListTasksRequest{Business: "acme", Project: bad})
					return err
				}},
				{"ListGrants", func() error {
					_, err := e.srv.ListGrants(e.host(), &brokerv1.ListGrantsRequest{Business: "acme", Project: "web", Task: bad})
					return err
				}},
				{"AddTask", func() error {
					_, err := e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: bad})
					return err
				}},
				{"ReopenTask", func() error {
					_, err := e.srv.ReopenTask(e.host(), &brokerv1.ReopenTaskRequest{Business: "acme", Project: "web", Task: bad})
					return err
				}},
				{"CreateGrant", func() error {
					_, err := e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: bad, Role: "w", Capabilities: []string{authz.CapPushWorking}})
					return err
				}},
				{"session event", func() error {
					_, err := e.srv.RecordEvent(e.host(), &brokerv1.RecordEventRequest{Type: SessionPrefix + "started", Business: "acme", Project: "web", Task: bad})
					return err
				}},
				{"LastPush", func() error { _, _, err := e.b.LastPush(ctx, "acme", "web", bad); return err }},
				{"PushRecorded", func() error { _, err := e.b.PushRecorded(ctx, "acme", "web", bad, commit(1)); return err }},
				{"MarkNeedsRepair", func() error { return e.b.MarkNeedsRepair(ctx, "acme", "web", bad, "why", commit(1)) }},
				{"Repaired", func() error { _, err := e.b.Repaired(ctx, "acme", "web", bad, false, commit(1), ""); return err }},
				{"LandApproved", func() error {
					_, err := e.b.LandApproved(ctx, authz.Grant{ID: authz.HostID, Host: true}, "acme", "web", bad, false)
					return err
				}},
				{"LastPushes", func() error { _, err := e.b.LastPushes(ctx, "acme", bad); return err }},
				{"CheckPlacement", func() error { return e.b.CheckPlacement(ctx, bad, "web") }},
			}
			for _, c := range calls {
				before := e.head()
				err := c.call()
				wantReason(t, err, errdefs.KindInvalidArgument, errdefs.NameInvalid, c.name+" "+bad)
				if e.head() != before {
					t.Fatalf("%s %q: the log grew", c.name, bad)
				}
			}
		}
		// The empty name is "any" in a listing's filter, and refused
		// where a call names one task.
		for name, call := range map[string]func() error{
			"AddTask": func() error {
				_, err := e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web"})
				return err
			},
			"ReopenTask": func() error {
				_, err := e.srv.ReopenTask(e.host(), &brokerv1.ReopenTaskRequest{Business: "acme", Project: "web"})
				return err
			},
			"LastPush":        func() error { _, _, err := e.b.LastPush(ctx, "acme", "web", ""); return err },
			"PushRecorded":    func() error { _, err := e.b.PushRecorded(ctx, "acme", "web", "", commit(1)); return err },
			"MarkNeedsRepair": func() error { return e.b.MarkNeedsRepair(ctx, "acme", "web", "", "why", commit(1)) },
		} {
			before := e.head()
			wantReason(t, call(), errdefs.KindInvalidArgument, errdefs.NameInvalid, name+" with no task")
			if e.head() != before {
				t.Fatalf("%s with no task: the log grew", name)
			}
		}
		// The grant itself still works: nothing above touched its task.
		if err := e.push(a, 1); err != nil {
			t.Fatal(err)
		}
	})
}
