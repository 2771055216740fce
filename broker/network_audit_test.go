package broker

import (
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"google.golang.org/grpc/codes"
)

// network.egress comes only from a grant holding network.audit (a
// session's launcher), which may record nothing else; a session's
// event.record cannot write it or any other network.* type.
func TestNetworkAuditOnly(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		session := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		launcher := e.grant("acme", "web", "t1", "launcher", authz.CapNetworkAudit)
		before := e.head()
		_, err := e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: TypeNetworkEgress, Data: `{"decisions":[]}`})
		e.refused(err, codes.PermissionDenied, before, "network.egress from event.record")
		_, err = e.srv.RecordEvent(session.ctx(), &brokerv1.RecordEventRequest{Type: "network.other"})
		e.refused(err, codes.PermissionDenied, before, "network.other from event.record")
		_, err = e.srv.RecordEvent(launcher.ctx(), &brokerv1.RecordEventRequest{Type: "note"})
		e.refused(err, codes.PermissionDenied, before, "note from network.audit")
		_, err = e.srv.RecordEvent(launcher.ctx(), &brokerv1.RecordEventRequest{Type: "network.other"})
		e.refused(err, codes.PermissionDenied, before, "network.other from network.audit")
		r, err := e.srv.RecordEvent(launcher.ctx(), &brokerv1.RecordEventRequest{Type: TypeNetworkEgress, Data: `{"decisions":[{"decision":"allowed"}]}`})
		if err != nil {
			t.Fatal(err)
		}
		if r.Event.Type != TypeNetworkEgress || r.Event.Task != "t1" || r.Event.Actor != launcher.ID {
			t.Fatalf("recorded %+v", r.Event)
		}
		e.verify()
	})
}
