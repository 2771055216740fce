package broker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// project list sums both repository layouts of a project; a grant sees its
// own project and its own task's grants only; no listing carries a token
// or its hash.
func TestListProjectsAndGrants(t *testing.T) {
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
		write("acme/web.git/objects/pack/a.pack", 1000)
		write("acme/web/pool.git/HEAD", 23)
		write("acme/web/tasks/t1.git/objects/x", 7)
		if err := os.Symlink("/etc", filepath.Join(repos, "acme/web/tasks/link")); err != nil {
			t.Fatal(err)
		}
		e.project("acme", "web")
		e.project("acme", "api")
		e.project("other", "web")
		tm := e.team("t1")
		e.task("acme", "web", "t2")
		e.task("other", "web", "t9")
		stranger := e.grant("other", "web", "t9", "worker", authz.CapPushWorking)
		if err := e.push(tm.worker, 3); err != nil {
			t.Fatal(err)
		}
		if _, err := e.srv.RevokeGrant(e.host(), &brokerv1.RevokeGrantRequest{GrantId: tm.closer.ID}); err != nil {
			t.Fatal(err)
		}

		// other/web is placed on another host sharing the store.
		if err := e.b.write(context.Background(), func(ctx context.Context, q *writeTx) error {
			_, err := q.db.ExecContext(ctx, `UPDATE projects SET host = $1 WHERE business = $2 AND project = $3`, "bus2", "other", "web")
			return err
		}); err != nil {
			t.Fatal(err)
		}

		all, err := e.srv.ListProjects(e.host(), &brokerv1.ListProjectsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range all.GetProjects() {
			got = append(got, p.GetBusiness()+"/"+p.GetProject())
		}
		if strings.Join(got, " ") != "acme/api acme/web other/web" {
			t.Fatalf("host's project list: %v", got)
		}
		web := all.GetProjects()[1]
		if web.GetSizeBytes() != 1030 || !web.GetHere() || web.GetHost() != DefaultHostID || web.GetTasks() != 2 || web.GetLastPushCommit() != commit(3) || web.GetLastPushTask() != "t1" || web.GetLastPushTime() == "" {
			t.Fatalf("acme/web: %+v", web)
		}
		if api := all.GetProjects()[0]; api.GetHere() || api.GetHost() != DefaultHostID || api.GetSizeBytes() != 0 || api.GetLastPushSeq() != 0 {
			t.Fatalf("acme/api, with no repository here: %+v", api)
		}
		if o := all.GetProjects()[2]; o.GetHost() != "bus2" || o.GetHere() || o.GetSizeBytes() != 0 || o.GetTasks() != 1 {
			t.Fatalf("other/web, placed on another host: %+v", o)
		}
		own, err := e.srv.ListProjects(tm.reviewer.ctx(), &brokerv1.ListProjectsRequest{Business: "other"})
		if err != nil || len(own.GetProjects()) != 0 {
			t.Fatalf("a grant's project list of another business: %v %v", own, err)
		}
		own, err = e.srv.ListProjects(tm.reviewer.ctx(), &brokerv1.ListProjectsRequest{})
		if err != nil || len(own.GetProjects()) != 1 || own.GetProjects()[0].GetProject() != "web" || own.GetProjects()[0].GetBusiness() != "acme" ||
			own.GetProjects()[0].GetTasks() != 1 || own.GetProjects()[0].GetLastPushTask() != "t1" {
			t.Fatalf("a grant's project list: %v %v", own, err)
		}
		// t2's grant sees nothing of t1's push.
		t2 := e.grant("acme", "web", "t2", "worker", authz.CapPushWorking)
		if o, err := e.srv.ListProjects(t2.ctx(), &brokerv1.ListProjectsRequest{}); err != nil || len(o.GetProjects()) != 1 ||
			o.GetProjects()[0].GetTasks() != 1 || o.GetProjects()[0].GetLastPushSeq() != 0 || o.GetProjects()[0].GetLastPushCommit() != "" {
			t.Fatalf("t2's project list shows another task's push: %v %v", o, err)
		}

		gs, err := e.srv.ListGrants(e.host(), &brokerv1.ListGrantsRequest{})
		if err != nil || len(gs.GetGrants()) != 5 {
			t.Fatalf("host's grant list: %v %v", gs, err)
		}
		gs, err = e.srv.ListGrants(e.host(), &brokerv1.ListGrantsRequest{Task: "t1"})
		if err != nil || len(gs.GetGrants()) != 3 {
			t.Fatalf("host's grant list of t1: %v %v", gs, err)
		}
		for _, gi := range gs.GetGrants() {
			if (gi.GetId() == tm.closer.ID) != (gi.GetRevokedSeq() != 0) || gi.GetExpired() || gi.GetExpiresAt() == "" || len(gi.GetCapabilities()) == 0 {
				t.Fatalf("grant %+v", gi)
			}
		}
		mine, err := e.srv.ListGrants(tm.worker.ctx(), &brokerv1.ListGrantsRequest{})
		// Its task's three, the revoked closer's too.
		if err != nil || len(mine.GetGrants()) != 3 {
			t.Fatalf("a grant's grant list: %v %v", mine, err)
		}
		for _, gi := range mine.GetGrants() {
			if gi.GetTask() != "t1" || gi.GetBusiness() != "acme" {
				t.Fatalf("a grant sees grant %+v of another task", gi)
			}
		}
		before := e.head()
		_, err = e.srv.ListGrants(tm.worker.ctx(), &brokerv1.ListGrantsRequest{Task: "t9"})
		e.refused(err, errdefs.KindPermissionDenied, before, "a grant's grant list of another task")
		_, err = e.srv.ListGrants(e.host(), &brokerv1.ListGrantsRequest{Task: "../x"})
		e.refused(err, errdefs.KindInvalidArgument, before, "a grant list with a bad name")

		// No listing carries a token or a token's hash.
		var seen []string
		for _, m := range []interface{ String() string }{all, own, gs, mine} {
			seen = append(seen, m.String())
		}
		text := strings.Join(seen, "\n")
		for _, a := range []actor{tm.worker, tm.reviewer, tm.closer, stranger, t2} {
			if strings.Contains(text, a.Token) || strings.Contains(text, tokenHash(a.Token)) {
				t.Fatalf("a listing shows the token of grant %s", a.ID)
			}
		}
		if _, err := e.b.ListProjects(context.Background(), authz.Grant{ID: authz.HostID, Host: true}, "Bad Name"); codesOf(err) != errdefs.KindInvalidArgument {
			t.Fatalf("project list with a bad business: %v", err)
		}
	})
}
