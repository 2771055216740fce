package broker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// exec runs one statement on the broker's store, as an attacker with the
// database would.
func (e *env) exec(stmt string, args ...any) {
	e.t.Helper()
	if _, err := e.b.st.read().db.ExecContext(context.Background(), stmt, args...); err != nil {
		e.t.Fatalf("%s: %v", stmt, err)
	}
}

// The gate decides from the log: an edited derived row (the request's
// verdict set to approve, the task's last push set to none) does not open
// it, and log verify names each edited row.
func TestGateReadsTheLog(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		tm := e.team("t1")
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		r := e.request(tm.worker)
		e.exec(`UPDATE review_requests SET verdict = 'approve', verdict_seq = 1, reviewer = $1 WHERE id = $2`, tm.reviewer.ID, r.RequestId)
		before := e.head()
		err := e.close(tm.closer)
		e.refused(err, errdefs.KindFailedPrecondition, before, "close with a forged approve row")
		if !strings.Contains(err.Error(), "no verdict yet") {
			t.Fatalf("close with a forged row: %v", err)
		}
		e.exec(`UPDATE tasks SET last_push_seq = 0, last_push_commit = '' WHERE task = 't1'`)
		e.refused(e.close(tm.closer), errdefs.KindFailedPrecondition, before, "close with the last push erased from the row")

		v, err := e.b.VerifyLog(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		joined := strings.Join(v.Differences, "\n")
		if v.OK || v.FirstBadSeq != 0 ||
			!strings.Contains(joined, "review_requests "+r.RequestId+": verdict is \"approve\" in the table, \"\" in the log") ||
			!strings.Contains(joined, "tasks acme/web/t1: last_push_seq is \"0\"") {
			t.Fatalf("log verify after the edits: %+v", v)
		}
	})
}

// A rewrite of the chain with every hash recomputed fails at its first
// event: the hashes fit, the signatures do not; and against a recorded
// head. Deleting the last events is caught by a recorded head.
func TestVerifyAgainstRecordedHeads(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.team("t1")
		a := e.grant("acme", "web", "t1", "agent", "event.record")
		for i := 0; i < 5; i++ {
			if _, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note"}); err != nil {
				t.Fatal(err)
			}
		}
		ctx := context.Background()
		var heads []Head
		for seq := int64(1); seq <= e.head(); seq++ {
			ev, _, _ := e.b.st.read().event(ctx, seq)
			heads = append(heads, Head{ev.Seq, ev.Hash})
		}
		if v, err := e.b.VerifyLog(ctx, heads...); err != nil || !v.OK {
			t.Fatalf("untouched log: %+v %v", v, err)
		}
		last := e.head()
		bad := last - 2
		e.rewrite(bad)
		if v, _ := e.b.VerifyLog(ctx); v.OK || v.FirstBadSeq != bad || !strings.Contains(v.Reason, fmt.Sprintf("event %d (agent.note by %s) has a signature that key", bad, a.ID)) {
			t.Fatalf("a rehashed chain, no head: %+v", v)
		}
		v, _ := e.b.VerifyLog(ctx, heads...)
		if v.OK || v.FirstBadSeq != bad {
			t.Fatalf("rewritten from %d: %+v", bad, v)
		}
		e.exec(`DELETE FROM events WHERE seq > $1`, bad-1)
		if v, _ := e.b.VerifyLog(ctx); !v.OK {
			t.Fatalf("a cut log, no head, verifies: %+v", v)
		}
		v, _ = e.b.VerifyLog(ctx, heads[len(heads)-1])
		if v.OK || v.FirstBadSeq != bad || !strings.Contains(v.Reason, "deleted") {
			t.Fatalf("truncated to %d: %+v", bad-1, v)
		}
	})
}

// rewrite changes event from's data and recomputes the chain from it on,
// as an attacker who knows the encoding would.
func (e *env) rewrite(from int64) {
	e.t.Helper()
	ctx := context.Background()
	prev := ""
	if from > 1 {
		p, _, _ := e.b.st.read().event(ctx, from-1)
		prev = p.Hash
	}
	for seq := from; seq <= e.head(); seq++ {
		ev, _, err := e.b.st.read().event(ctx, seq)
		if err != nil {
			e.t.Fatal(err)
		}
		if seq == from {
			ev.Data = `{"forged":true}`
		}
		ev.PrevHash = prev
		ev.Hash = HashEvent(ev)
		e.exec(`UPDATE events SET data = $1, prev_hash = $2, hash = $3 WHERE seq = $4`, ev.Data, ev.PrevHash, ev.Hash, seq)
		prev = ev.Hash
	}
}

// The checkpoint file: every commit's head is appended before its caller
// hears back; a broker opened on a log that no longer matches refuses to
// serve (but still authorizes, for the git service's fetches); and a
// checkpoint that cannot be written stops new events until it can.
func TestCheckpointFile(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			cpPath := filepath.Join(t.TempDir(), "heads")
			e := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, CheckpointFile: cpPath})
			e.project("acme", "web")
			e.team("t1")
			a := e.grant("acme", "web", "t1", "agent", "event.record")
			for i := 0; i < 3; i++ {
				if _, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note"}); err != nil {
					t.Fatal(err)
				}
			}
			heads := readHeads(t, cpPath)
			seq, hash, _ := e.b.LogHead(context.Background())
			if len(heads) == 0 || heads[len(heads)-1] != (Head{seq, hash}) {
				t.Fatalf("checkpoint %v, log head %d %s", heads, seq, hash)
			}

			// Appending fails: the event is refused, and so is the next,
			// until the file can be written again.
			e.b.cp.f.Close()
			_, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note"})
			if errdefs.Of(err).Reason != errdefs.LogCheckpointAppend {
				t.Fatalf("append failed: %v", err)
			}
			before := e.head()
			_, err = e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note"})
			e.refused(err, errdefs.KindUnavailable, before, "event while the checkpoint cannot be written")
			f, err := os.OpenFile(cpPath, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			e.b.cp.f = f
			if _, err := e.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note"}); err != nil {
				t.Fatalf("after the file came back: %v", err)
			}
			last := e.head()
			e.b.Close()

			// Delete the last two events: the broker opened again halts.
			newEnv(t, dsn).exec(`DELETE FROM events WHERE seq > $1`, last-2)
			h := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, CheckpointFile: cpPath})
			herr := errdefs.Of(h.b.Halted())
			if herr == nil || herr.Reason != errdefs.LogCheckpointMismatch || herr.Metadata["first_bad_seq"] != strconv.FormatInt(last-1, 10) {
				t.Fatalf("opened on a truncated log: %+v", herr)
			}
			_, err = h.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note"})
			if errdefs.Of(err).Reason != errdefs.LogCheckpointMismatch || codesOf(err) != errdefs.KindUnavailable {
				t.Fatalf("RecordEvent on a halted broker: %v", err)
			}
			if _, err := h.b.Authorize(context.Background(), a.Token, "event.record"); err != nil {
				t.Fatalf("a halted broker still authorizes fetches: %v", err)
			}
			if _, err := h.srv.VerifyLog(h.host(), &brokerv1.VerifyLogRequest{}); err != nil {
				t.Fatalf("the host's log verify on a halted broker: %v", err)
			}
			if n := len(readHeads(t, cpPath)); n != len(heads)+2 {
				t.Fatalf("a halted broker appended to its checkpoint: %d lines", n)
			}
		})
	}
}

func newEnvWith(t testing.TB, o Options) *env {
	t.Helper()
	if o.SigningKey == nil {
		o.SigningKey = testKey
	}
	b, err := Open(context.Background(), o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return &env{t: t, b: b, srv: NewServer(b), admin: o.AdminToken, dsn: o.DSN}
}

func readHeads(t *testing.T, path string) []Head {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hs, err := ReadHeads(f)
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// log verify reads a snapshot and takes no lock: a write goes on while a
// snapshot is open (on SQLite and on PostgreSQL, where the write lock is
// the fleet's), and the snapshot does not see it.
func TestSnapshotTakesNoWriteLock(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		e.task("acme", "web", "t1")
		g := e.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
		ctx := context.Background()
		tx, err := e.b.st.snapshot(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.done()
		seq, _, err := tx.head(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := e.srv.RecordEvent(metadata.NewIncomingContext(wctx, metadata.Pairs("authorization", "Bearer "+g.Token)), &brokerv1.RecordEventRequest{Type: "note"}); err != nil {
			t.Fatalf("a write while a snapshot is open: %v", err)
		}
		if again, _, err := tx.head(ctx); err != nil || again != seq {
			t.Fatalf("the snapshot's head moved from %d to %d (%v)", seq, again, err)
		}
		if e.head() != seq+1 {
			t.Fatalf("the log's head is %d, want %d", e.head(), seq+1)
		}
	})
}
