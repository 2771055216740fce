package broker

import (
	"context"
	"strconv"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// A landing whose merge was refused is recorded, and the same approved
// push is then refused LAND_REFUSED (naming the event and the cause)
// until --force or a new push: a lander cannot loop a minute-long merge.
// A grant without task.land records nothing.
func TestLandRefusalIsRecorded(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		host := authz.Grant{ID: authz.HostID, Host: true}
		e.project("acme", "web")
		tm := e.team("t1")
		approve := func(n byte) {
			if err := e.push(tm.worker, n); err != nil {
				t.Fatal(err)
			}
			r := e.request(tm.worker)
			if err := e.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
				t.Fatal(err)
			}
		}
		approve(1)
		land := authz.Landing{Business: "acme", Project: "web", Task: "t1", Approved: commit(1), Old: commit(9)}
		before := e.head()
		if _, err := e.b.RecordLandRefusal(ctx, authz.Grant{ID: tm.worker.ID, Business: "acme", Project: "web", Task: "t1", Caps: []string{authz.CapPushWorking}},
			land, string(errdefs.MergeTimeout), authz.Peer{}); errdefs.ReasonOf(err) != errdefs.CapabilityMissing || e.head() != before {
			t.Fatalf("a worker recorded a refused landing: %v", err)
		}
		seq, err := e.b.RecordLandRefusal(ctx, host, land, string(errdefs.MergeTimeout), authz.Peer{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.b.LandApproved(ctx, host, "acme", "web", "t1", false)
		got, ok := errdefs.As(err)
		if !ok || got.Reason != errdefs.LandRefused || got.Metadata["cause"] != string(errdefs.MergeTimeout) || got.Metadata["seq"] != strconv.FormatInt(seq, 10) {
			t.Fatalf("land after a refused one: %v", err)
		}
		if c, err := e.b.LandApproved(ctx, host, "acme", "web", "t1", true); err != nil || c != commit(1) {
			t.Fatalf("land --force: %q %v", c, err)
		}
		approve(2)
		if c, err := e.b.LandApproved(ctx, host, "acme", "web", "t1", false); err != nil || c != commit(2) {
			t.Fatalf("land of a new push: %q %v", c, err)
		}
		e.verify()
	})
}
