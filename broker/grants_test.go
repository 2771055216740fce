package broker

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

func TestProjectsAndTasks(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		before := e.head()
		_, err := e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: "t1"})
		e.refused(err, errdefs.KindNotFound, before, "task of an unknown project")

		e.project("acme", "web")
		e.project("acme", "web") // idempotent
		err = e.b.EnsureProject(context.Background(), "acme", "../etc")
		e.refused(err, errdefs.KindInvalidArgument, before, "project with a bad name")

		r, err := e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: "t1"})
		if err != nil || !r.Created {
			t.Fatalf("AddTask: %v %v", r, err)
		}
		before = e.head()
		r, err = e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: "t1"})
		if err != nil || r.Created {
			t.Fatalf("AddTask again: %v %v", r, err)
		}
		if e.head() != before {
			t.Fatal("adding an existing task appended an event")
		}
		for _, bad := range []string{"", "T1", "..", "a/b", "t1.lock", " t1"} {
			_, err = e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: bad})
			e.refused(err, errdefs.KindInvalidArgument, before, "task name "+bad)
		}
		evs := e.events(Filter{Task: "t1"})
		if len(evs) != 1 || evs[0].Type != TypeTaskAdded || evs[0].Actor != authz.HostID {
			t.Fatalf("events: %+v", evs)
		}
	})
}

func TestGrants(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		before := e.head()

		for _, c := range []struct {
			name string
			req  *brokerv1.CreateGrantRequest
			code errdefs.Kind
		}{
			{"unknown capability", &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "w", Capabilities: []string{"git.push.everything"}}, errdefs.KindInvalidArgument},
			{"no capability", &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "w"}, errdefs.KindInvalidArgument},
			{"unknown task", &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t2", Role: "w", Capabilities: []string{authz.CapPushWorking}}, errdefs.KindNotFound},
			{"no task", &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Role: "w", Capabilities: []string{authz.CapPushWorking}}, errdefs.KindInvalidArgument},
			{"bad role", &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "Worker!", Capabilities: []string{authz.CapPushWorking}}, errdefs.KindInvalidArgument},
			{"negative ttl", &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "w", Capabilities: []string{authz.CapPushWorking}, TtlSeconds: -1}, errdefs.KindInvalidArgument},
		} {
			_, err := e.srv.CreateGrant(e.host(), c.req)
			e.refused(err, c.code, before, c.name)
		}

		w := e.grant("acme", "web", "t1", "worker", authz.CapPushWorking, authz.CapReviewRequest)
		if w.G.Business != "acme" || w.G.Task != "t1" || w.G.Role != "worker" || !w.G.Has(authz.CapPushWorking) || w.G.Has(authz.CapTaskClose) {
			t.Fatalf("grant: %+v", w.G)
		}
		ctx := context.Background()

		// A grant's token on a host call, the host's token on a grant's call.
		before = e.head()
		_, err := e.srv.CreateGrant(w.ctx(), &brokerv1.CreateGrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "w", Capabilities: []string{authz.CapTaskClose}})
		e.refused(err, errdefs.KindPermissionDenied, before, "grant issuing a grant")
		_, err = e.srv.AddTask(w.ctx(), &brokerv1.AddTaskRequest{Business: "acme", Project: "web", Task: "t9"})
		e.refused(err, errdefs.KindPermissionDenied, before, "grant adding a task")
		_, err = e.srv.VerifyLog(w.ctx(), &brokerv1.VerifyLogRequest{})
		e.refused(err, errdefs.KindPermissionDenied, before, "grant verifying the log")
		_, err = e.srv.CloseTask(e.host(), &brokerv1.CloseTaskRequest{})
		e.refused(err, errdefs.KindPermissionDenied, before, "host closing a task without a grant")
		_, err = e.srv.CloseTask(w.ctx(), &brokerv1.CloseTaskRequest{})
		e.refused(err, errdefs.KindPermissionDenied, before, "close without task.close")
		_, err = e.srv.RecordEvent(w.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, errdefs.KindPermissionDenied, before, "record without event.record")
		_, err = e.srv.RecordEvent(withToken("bht_not-a-token"), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, errdefs.KindUnauthenticated, before, "unknown token")
		_, err = e.srv.RecordEvent(context.Background(), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, errdefs.KindUnauthenticated, before, "no token")
		if _, err := e.b.Authorize(ctx, w.Token); err == nil {
			t.Fatal("a grant passed as the host")
		}

		// Revoked: refused at once, and a push authorized just before the
		// revocation is refused too.
		if _, err := e.srv.RevokeGrant(e.host(), &brokerv1.RevokeGrantRequest{GrantId: w.ID}); err != nil {
			t.Fatal(err)
		}
		before = e.head()
		_, err = e.b.Authorize(ctx, w.Token, authz.CapPushWorking)
		e.refused(err, errdefs.KindUnauthenticated, before, "revoked token")
		e.refused(e.push(w, 1), errdefs.KindUnauthenticated, before, "push with a grant revoked after Authorize")
		if _, err := e.srv.RevokeGrant(e.host(), &brokerv1.RevokeGrantRequest{GrantId: w.ID}); err != nil {
			t.Fatalf("revoking twice: %v", err)
		}
		if e.head() != before {
			t.Fatal("revoking twice appended")
		}
		_, err = e.srv.RevokeGrant(e.host(), &brokerv1.RevokeGrantRequest{GrantId: "g-nope"})
		e.refused(err, errdefs.KindNotFound, before, "revoke unknown grant")

		// Expired.
		ig, err := e.b.CreateGrant(ctx, "", GrantRequest{Business: "acme", Project: "web", Task: "t1", Role: "w", Caps: []string{authz.CapEventRecord}, TTL: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		before = e.head()
		_, err = e.srv.RecordEvent(withToken(ig.Token), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, errdefs.KindUnauthenticated, before, "expired token")

		kinds := map[string]bool{}
		for _, ev := range e.events(Filter{}) {
			kinds[ev.Type] = true
		}
		if !kinds[TypeGrantCreated] || !kinds[TypeGrantRevoked] {
			t.Fatalf("grant events missing: %v", kinds)
		}
		e.verify()
	})
}

// The token is shown once and never stored: the database file holds its
// hash only.
func TestTokenNotStored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "broker.db")
	e := newEnv(t, path)
	e.project("acme", "web")
	e.task("acme", "web", "t1")
	a := e.grant("acme", "web", "t1", "worker", authz.CapPushWorking)
	if err := e.b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(a.Token)) {
			t.Fatalf("%s holds the token itself", f)
		}
		if fi, err := os.Stat(f); err == nil && fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	b, _ := os.ReadFile(path)
	w, _ := os.ReadFile(path + "-wal")
	if !bytes.Contains(append(b, w...), []byte(tokenHash(a.Token))) {
		t.Fatal("the token's hash is not in the database either: the test reads the wrong file")
	}
}
