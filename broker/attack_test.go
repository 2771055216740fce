package broker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// A session's project list must not tell it anything of its project's
// other tasks (docs/broker.md, Inspecting). size_bytes summed over the
// whole project does: another task's repository growing shows in it, so a
// session watches its neighbours' pushes and their sizes.
func TestAttackProjectListSizeShowsOtherTasks(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		repos := t.TempDir()
		e.b.reposDir = repos
		write := func(rel string, n int) {
			p := filepath.Join(repos, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, make([]byte, n), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		write("acme/web/pool.git/HEAD", 23)
		write("acme/web/tasks/t1.git/objects/x", 7)
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		e.task("acme", "web", "t2")
		me := e.grant("acme", "web", "t1", "worker", authz.CapPushWorking)
		size := func() int64 {
			r, err := e.srv.ListProjects(me.ctx(), &brokerv1.ListProjectsRequest{})
			if err != nil || len(r.GetProjects()) != 1 {
				t.Fatalf("t1's project list: %v %v", r, err)
			}
			return r.GetProjects()[0].GetSizeBytes()
		}
		before := size()
		// t2 (not t1's) pushes 12345 bytes.
		write("acme/web/tasks/t2.git/objects/pack/p.pack", 12345)
		if after := size(); after != before {
			t.Fatalf("t1's grant sees t2's push in its project list: size_bytes %d, then %d after t2 pushed %d bytes", before, after, after-before)
		}
	})
}

// A session's listing must cost what its own task costs, not what the
// whole store holds: task list and project list read every task of every
// business (and every landing) for any grant and filter in Go, so one
// session's calls cost the daemon memory and time in the size of all
// hosts' tasks sharing the store.
func TestAttackSessionListingReadsWholeStore(t *testing.T) {
	// Not eachStore: AllocsPerRun counts the whole process, so the two
	// stores run one after the other.
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) { sessionListingCost(t, newEnv(t, k.dsn(t))) })
	}
}

func sessionListingCost(t *testing.T, e *env) {
	{
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		me := e.grant("acme", "web", "t1", "worker", authz.CapPushWorking)
		ctx := me.ctx()
		cost := func() (tasks, projects float64) {
			tasks = testing.AllocsPerRun(3, func() {
				if _, err := e.srv.ListTasks(ctx, &brokerv1.ListTasksRequest{}); err != nil {
					t.Fatal(err)
				}
			})
			projects = testing.AllocsPerRun(3, func() {
				if _, err := e.srv.ListProjects(ctx, &brokerv1.ListProjectsRequest{}); err != nil {
					t.Fatal(err)
				}
			})
			return
		}
		t0, p0 := cost()
		// Other businesses' tasks, as other hosts sharing the store add
		// them, half of them landed.
		const n = 4000
		if err := e.b.write(context.Background(), func(ctx context.Context, q *writeTx) error {
			for i := range n {
				b := fmt.Sprintf("other%d", i%50)
				task := fmt.Sprintf("t%d", i)
				if _, err := q.db.ExecContext(ctx, `INSERT INTO tasks (business, project, task) VALUES ($1, $2, $3)`, b, "p", task); err != nil {
					return err
				}
				if i%2 == 0 {
					if _, err := q.db.ExecContext(ctx, `INSERT INTO events (seq, business, project, task, type, actor, data, time, peer, prev_hash, hash)
						VALUES ($1, $2, $3, $4, $5, 'host', '{}', '', '', '', '')`, 1000000+i, b, "p", task, TypeTaskLanded); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t1, p1 := cost()
		t.Logf("allocations of one session's call, before and after %d other tasks: task list %.0f -> %.0f, project list %.0f -> %.0f", n, t0, t1, p0, p1)
		if t1 > 2*t0+100 || p1 > 2*p0+100 {
			t.Fatalf("a session's listing grows with the store: task list %.0f -> %.0f allocations, project list %.0f -> %.0f, after %d other tasks", t0, t1, p0, p1, n)
		}
	}
}

// A session's grant (event.record) tries to slip a broker-only type into
// a batch behind a free-form one, network.egress to use the egress bound
// instead of its own, and one key twice with two bodies: each batch is
// refused whole and the log does not grow. Then it tries to go past its
// quota in batches: the batch that would pass it is refused whole.
func TestAttackRecordEventsBatch(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.b.quota = newEventQuota(10, 1<<20)
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		s := e.grant("acme", "web", "t1", "worker", authz.CapPushWorking, authz.CapEventRecord, authz.CapReviewRequest)
		rec := func(evs ...*brokerv1.RecordEventRequest) error {
			_, err := e.srv.RecordEvents(s.ctx(), &brokerv1.RecordEventsRequest{Events: evs})
			return err
		}
		note := &brokerv1.RecordEventRequest{Type: "note", Data: `{"a":1}`}
		before := e.head()
		for _, typ := range []string{TypeTaskLanded, TypeTaskClosed, TypeReviewVerdict, TypeActionAllowed, TypeGrantCreated, TypeTaskRepaired,
			TypeNetworkEgress, "network.other", "network", "task", "review.x", "grant"} {
			err := rec(note, &brokerv1.RecordEventRequest{Type: typ, Data: `{"capability":"git.push.working","commit":"` + commit(1) + `"}`})
			if err == nil {
				t.Fatalf("a session's batch recorded %s", typ)
			}
			e.refused(err, codesOf(err), before, "a batch with "+typ)
		}
		err := rec(&brokerv1.RecordEventRequest{Type: "note", Data: `{"a":1}`, IdempotencyKey: "k"},
			&brokerv1.RecordEventRequest{Type: "note", Data: `{"a":2}`, IdempotencyKey: "k"})
		e.refused(err, codesOf(err), before, "one key, two bodies, in one batch")
		// The quota: a refused batch charged nothing, so all 10 are
		// left. A batch of 11 is refused whole, a batch of 10 goes in,
		// then nothing more.
		eleven := make([]*brokerv1.RecordEventRequest, 11)
		for i := range eleven {
			eleven[i] = &brokerv1.RecordEventRequest{Type: "note", Data: fmt.Sprintf(`{"i":%d}`, i)}
		}
		before = e.head()
		e.refused(rec(eleven...), errdefs.KindResourceExhausted, before, "a batch past the quota")
		if err := rec(eleven[:10]...); err != nil {
			t.Fatalf("what is left of the quota: %v", err)
		}
		before = e.head()
		e.refused(rec(note), errdefs.KindResourceExhausted, before, "one past the quota")
		e.verify()
	})
}

// Two hosts share one store, each with a project of its own. A session of
// host A's project, asking host B (whose broker serves any task's calls),
// learns host A's id (its own project's placement) and nothing of host B's
// projects or host B's id, from any listing or its task's events.
func TestAttackSessionLearnsNoOtherHost(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			dsn := k.dsn(t)
			ctx := context.Background()
			open := func(id string) *Broker {
				b, err := Open(ctx, Options{DSN: dsn, AdminToken: adminToken, HostID: id, ReposDir: t.TempDir(), SigningKey: testKey})
				if err != nil {
					t.Fatalf("Open %s: %v", id, err)
				}
				t.Cleanup(func() { b.Close() })
				if err := b.EnsureProject(ctx, "acme", "on-"+id); err != nil {
					t.Fatal(err)
				}
				return b
			}
			ba, bb := open("host-a"), open("host-b")
			a, b := NewServer(ba), NewServer(bb)
			e := &env{t: t, b: ba, srv: a, admin: adminToken}
			e.task("acme", "on-host-a", "t1")
			e.task("acme", "on-host-b", "t2")
			s := e.grant("acme", "on-host-a", "t1", "worker", authz.CapPushWorking, authz.CapEventRecord)
			var seen []string
			for _, srv := range []brokerv1.BrokerServiceServer{a, b} {
				ps, err := srv.ListProjects(s.ctx(), &brokerv1.ListProjectsRequest{})
				if err != nil || len(ps.GetProjects()) != 1 || ps.GetProjects()[0].GetHost() != "host-a" {
					t.Fatalf("the session's project list: %v %v", ps, err)
				}
				seen = append(seen, ps.String())
				ts, err := srv.ListTasks(s.ctx(), &brokerv1.ListTasksRequest{Business: "acme", Project: "on-host-b"})
				if err != nil || len(ts.GetTasks()) != 0 {
					t.Fatalf("the session's task list of the other host's project: %v %v", ts, err)
				}
				gs, err := srv.ListGrants(s.ctx(), &brokerv1.ListGrantsRequest{})
				if err != nil {
					t.Fatal(err)
				}
				seen = append(seen, gs.String())
				if _, err := srv.RecordEvent(s.ctx(), &brokerv1.RecordEventRequest{Type: "note"}); err != nil {
					t.Fatal(err)
				}
			}
			text := fmt.Sprint(seen)
			if strings.Contains(text, "host-b") || strings.Contains(text, "on-host-b") || strings.Contains(text, "t2") {
				t.Fatalf("the session learned of host B: %s", text)
			}
		})
	}
}

// The host's listings at their bounds (10000 rows of the longest names,
// every capability, the largest numbers) must fit in one message the
// client takes: bushost takes at most 4 MiB (internal/cli/cli.go), and a
// listing over it fails in the client with grpc's "received message
// larger than max" instead of the listing's own TOO_LONG reason. A grant
// carries its launch set (at most maxLaunchRoles roles), which is why
// grants are listed 1000 at most.
func TestAttackListsAtTheirBoundsFitTheClient(t *testing.T) {
	const clientMax = 4 << 20
	n := strings.Repeat("a", 63)
	big := int64(1) << 62
	gs := &brokerv1.ListGrantsResponse{}
	var launch []*brokerv1.LaunchRole
	for i := range maxLaunchRoles {
		launch = append(launch, &brokerv1.LaunchRole{Role: fmt.Sprintf("%s%02d", n[:61], i), Capabilities: authz.Capabilities})
	}
	for range maxListGrants {
		gs.Grants = append(gs.Grants, &brokerv1.GrantInfo{Id: randomID("g-", 8), Business: n, Project: n, Task: n, Role: n,
			Capabilities: authz.Capabilities, ExpiresAt: "2026-12-02T10:00:00Z", Expired: true, RevokedSeq: big,
			Launch: launch, LaunchedBy: randomID("g-", 8), LaunchDepth: big})
	}
	ps := &brokerv1.ListProjectsResponse{}
	for range maxListProjects {
		ps.Projects = append(ps.Projects, &brokerv1.ProjectInfo{Business: n, Project: n, Host: n, Here: true, SizeBytes: big,
			LastPushCommit: strings.Repeat("c", 64), LastPushSeq: big, LastPushTask: n, LastPushTime: "2026-12-01T10:00:00.123456789Z", Tasks: big})
	}
	ts := &brokerv1.ListTasksResponse{}
	for range maxListTasks {
		ts.Tasks = append(ts.Tasks, &brokerv1.TaskInfo{Business: n, Project: n, Task: n, State: StateLanded,
			LastPushCommit: strings.Repeat("c", 64), LastPushSeq: big, LandedSeq: big})
	}
	for what, m := range map[string]proto.Message{"grant list": gs, "project list": ps, "task list": ts} {
		size := proto.Size(m)
		t.Logf("%s at its bound: %d bytes (client takes %d)", what, size, clientMax)
		if size > clientMax {
			t.Errorf("%s at its bound is %d bytes; the client takes %d", what, size, clientMax)
		}
	}
}

// A launch set is bounded: one role more than maxLaunchRoles is refused.
func TestLaunchSetBounded(t *testing.T) {
	set := map[string][]string{}
	for i := range maxLaunchRoles + 1 {
		set[fmt.Sprintf("role%02d", i)] = []string{authz.CapPushWorking}
	}
	caps := []string{authz.CapSessionLaunch}
	if _, err := checkLaunchSet(caps, set); errdefs.ReasonOf(err) != errdefs.LaunchSetInvalid {
		t.Fatalf("%d roles: %v, want LAUNCH_SET_INVALID", len(set), err)
	}
	delete(set, "role00")
	if _, err := checkLaunchSet(caps, set); err != nil {
		t.Fatalf("%d roles: %v", len(set), err)
	}
}
