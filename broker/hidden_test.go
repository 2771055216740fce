package broker

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
)

// SQLite keeps a BLOB as written, whatever a column's type, and a BLOB
// is never equal to a TEXT: a database writer that rewrites a genuine
// event's type as the same bytes in a BLOB hides it from the gate's
// queries (type = ...), while its content, hash and signature read the
// same. Hiding the task's reopening brings back the approve it withdrew;
// log verify must not call that log whole.
func TestBlobHiddenEventIsNamed(t *testing.T) {
	e := newEnv(t, filepath.Join(t.TempDir(), "broker.db"))
	ctx := context.Background()
	e.project("acme", "web")
	tm := e.team("t1")
	if err := e.push(tm.worker, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.verdict(tm.reviewer, e.request(tm.worker).RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
		t.Fatal(err)
	}
	if err := e.close(tm.closer); err != nil {
		t.Fatal(err)
	}
	reopened, err := e.b.ReopenTask(ctx, "", "acme", "web", "t1")
	if err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE events SET type = CAST(type AS BLOB) WHERE seq = $1`, reopened)
	if err := e.close(tm.closer); err == nil {
		t.Logf("the gate, selecting by type, closed the task again on the approve the hidden reopening withdrew")
	}

	v, err := e.b.VerifyLog(ctx)
	if err == nil && v.OK {
		t.Fatalf("log verify calls whole a log whose reopening (event %d) is hidden from the gate: %+v", reopened, v)
	}
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("event %d: its type is stored as bytes", reopened)) {
		t.Fatalf("log verify on a hidden reopening: %+v %v", v, err)
	}
}
