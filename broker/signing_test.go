package broker

import (
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// forgeVerdict appends an approve of request id by reviewer straight into
// the database, as a database writer would: the hash computed with the
// public HashEvent, chained to the head, and the derived review_requests
// row made to agree, so that only the missing signature gives it away.
func (e *env) forgeVerdict(reviewer actor, id string) Event {
	e.t.Helper()
	r, ok, err := e.b.st.read().request(context.Background(), id)
	if err != nil || !ok {
		e.t.Fatalf("request %s: %v %v", id, ok, err)
	}
	ev := e.forge(Event{Business: r.Business, Project: r.Project, Task: r.Task, Type: TypeReviewVerdict, Actor: reviewer.ID,
		Data: mustData(map[string]any{"request_id": r.ID, "verdict": Approve, "commit": r.Commit, "push_seq": r.PushSeq, "comment": ""})})
	e.exec(`UPDATE review_requests SET verdict = $1, verdict_seq = $2, reviewer = $3 WHERE id = $4`, Approve, ev.Seq, reviewer.ID, r.ID)
	return ev
}

// forge appends ev after the head straight into the database, unsigned,
// its hash computed with HashEvent.
func (e *env) forge(ev Event) Event {
	e.t.Helper()
	seq, prev, err := e.b.st.read().head(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	ev.Seq, ev.PrevHash, ev.Time, ev.Peer = seq+1, prev, now(), "pid=1,uid=1000,gid=1000"
	ev.Hash = HashEvent(ev)
	e.exec(`INSERT INTO events (seq, business, project, task, type, actor, data, time, peer, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		ev.Seq, ev.Business, ev.Project, ev.Task, ev.Type, ev.Actor, ev.Data, ev.Time, ev.Peer, ev.PrevHash, ev.Hash)
	return ev
}

func newKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	k, _, err := NewSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// reasonOf is err's reason once sent.
func reasonOf(err error) errdefs.Reason {
	if e := errdefs.Of(err); e != nil {
		return e.Reason
	}
	return ""
}

// A verdict appended straight into the database, with a hash that fits
// and the derived row agreeing: log verify names it, close and land stay
// shut, and a broker started with a checkpoint file refuses to anchor it
// (and so does one already running, at its next write).
func TestForgedVerdictIsUnproven(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			cpPath := filepath.Join(t.TempDir(), "heads")
			running := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, CheckpointFile: cpPath})
			running.project("acme", "web")
			tm := running.team("t1")
			if err := running.push(tm.worker, 1); err != nil {
				t.Fatal(err)
			}
			r := running.request(tm.worker)
			a := running.grant("acme", "web", "t1", "agent", authz.CapEventRecord)
			anchored := readHeads(t, cpPath)

			e := newEnv(t, dsn)
			forged := e.forgeVerdict(tm.reviewer, r.RequestId)
			before := e.head()

			v, err := e.b.VerifyLog(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if v.OK || v.FirstBadSeq != forged.Seq || len(v.Differences) != 0 ||
				!strings.Contains(v.Reason, "event "+strconv.FormatInt(forged.Seq, 10)+" (review.verdict by "+tm.reviewer.ID+") carries no signature") {
				t.Fatalf("log verify on a forged verdict: %+v", v)
			}

			err = e.close(tm.closer)
			e.refused(err, errdefs.KindFailedPrecondition, before, "close on a forged verdict")
			if reasonOf(err) != errdefs.LogEventUnproven || !strings.Contains(err.Error(), "event "+strconv.FormatInt(forged.Seq, 10)) {
				t.Fatalf("close on a forged verdict: %v", err)
			}
			host := authz.Grant{ID: authz.HostID, Host: true}
			_, err = e.b.LandApproved(context.Background(), host, "acme", "web", "t1", false)
			if reasonOf(err) != errdefs.LogEventUnproven {
				t.Fatalf("land on a forged verdict: %v", err)
			}
			_, err = e.b.RecordLanding(context.Background(), host, authz.Landing{Business: "acme", Project: "web", Task: "t1",
				Approved: commit(1), Old: commit(2), New: commit(1)}, authz.Peer{})
			e.refused(err, errdefs.KindFailedPrecondition, before, "landing recorded on a forged verdict")

			// The broker that was running when the row went in: its next
			// write finds an event past its anchor it cannot prove.
			_, err = running.srv.RecordEvent(a.ctx(), &brokerv1.RecordEventRequest{Type: "agent.note"})
			running.refused(err, errdefs.KindUnavailable, before, "a running broker writing past a forged event")
			if reasonOf(err) != errdefs.LogHeadUnproven || !strings.Contains(err.Error(), "event "+strconv.FormatInt(forged.Seq, 10)+" (review.verdict") {
				t.Fatalf("a running broker writing past a forged event: %v", err)
			}
			running.b.Close()

			// A broker started on it refuses to anchor it, naming it.
			h := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, CheckpointFile: cpPath})
			herr := h.b.Halted()
			if reasonOf(herr) != errdefs.LogHeadUnproven || !strings.Contains(herr.Error(), "event "+strconv.FormatInt(forged.Seq, 10)+" (review.verdict by "+tm.reviewer.ID+")") {
				t.Fatalf("a start past a forged verdict: %v", herr)
			}
			if got := readHeads(t, cpPath); len(got) != len(anchored) || got[len(got)-1] != anchored[len(anchored)-1] {
				t.Fatalf("the checkpoint moved from %v to %v", anchored, got)
			}
			if h.head() != forged.Seq {
				t.Fatalf("something chained onto the forged event: head %d", h.head())
			}
		})
	}
}

// An event signed with a key the broker was not given is refused like an
// unsigned one; brokers that list each other's keys accept each other's
// events, a broker's own key being trusted whether listed or not.
func TestSignerMustBeTrusted(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			ka, kb := newKey(t), newKey(t)
			a := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, SigningKey: ka})
			b := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, SigningKey: kb, TrustedKeys: []ed25519.PublicKey{pubOf(ka)}})
			a.project("acme", "web")
			tm := a.team("t1")
			if err := a.push(tm.worker, 1); err != nil {
				t.Fatal(err)
			}
			r := a.request(tm.worker)
			if err := b.verdict(tm.reviewer, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
				t.Fatal(err)
			}
			verdictSeq := b.head()

			before := a.head()
			err := a.close(tm.closer)
			a.refused(err, errdefs.KindFailedPrecondition, before, "close on a verdict signed by an untrusted key")
			untrusted := "key " + KeyID(pubOf(kb)) + ", which is not a trusted host's key"
			if reasonOf(err) != errdefs.LogEventUnproven || !strings.Contains(err.Error(), untrusted) {
				t.Fatalf("close on a verdict signed by an untrusted key: %v", err)
			}
			v, err := a.b.VerifyLog(context.Background())
			if err != nil || v.OK || v.FirstBadSeq != verdictSeq || !strings.Contains(v.Reason, untrusted) {
				t.Fatalf("log verify of a verdict signed by an untrusted key: %+v %v", v, err)
			}
			b.verify()

			// A broker that trusts both keys accepts every event.
			c := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, SigningKey: ka, TrustedKeys: []ed25519.PublicKey{pubOf(kb)}})
			c.verify()
			if err := c.close(tm.closer); err != nil {
				t.Fatalf("close through a broker trusting both keys: %v", err)
			}
			if v, _ := a.b.VerifyLog(context.Background()); v.OK {
				t.Fatal("a broker trusting only its key accepted the other's verdict")
			}

		})
	}
}

// A log written before signing (its events unsigned): unproven until a
// start adopts it. The start that made the host's key adopts it once,
// without a checkpoint up to its head, with one up to the checkpoint's
// last head, refusing an event past it; a log that holds a signed event
// is never adopted again, so an unsigned event slipped in later stays
// unproven.
func TestAdoptUnsignedLog(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			cpPath := filepath.Join(t.TempDir(), "heads")
			e := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, CheckpointFile: cpPath})
			e.project("acme", "web")
			tm := e.team("t1")
			if err := e.push(tm.worker, 1); err != nil {
				t.Fatal(err)
			}
			if err := e.verdict(tm.reviewer, e.request(tm.worker).RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
				t.Fatal(err)
			}
			anchor := e.head()
			e.b.Close()
			old := newEnv(t, dsn)
			old.exec(`UPDATE events SET sig = ''`)

			// Not adopted: nothing is proven, the gate stays shut.
			if v, _ := old.b.VerifyLog(context.Background()); v.OK || v.FirstBadSeq != 1 || !strings.Contains(v.Reason, "events not proven ("+strconv.FormatInt(anchor, 10)+")") {
				t.Fatalf("an unsigned log, not adopted: %+v", v)
			}
			if err := old.close(tm.closer); reasonOf(err) != errdefs.LogEventUnproven {
				t.Fatalf("close on an unsigned log, not adopted: %v", err)
			}

			// Adopted without a checkpoint: up to the head.
			kn := newKey(t)
			n := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, SigningKey: kn, AdoptUnsigned: true})
			if n.b.Adopted() != anchor {
				t.Fatalf("adopted through %d, want %d", n.b.Adopted(), anchor)
			}
			n.verify()
			n.b.Close()

			// Unsigned again, with an event slipped in past the
			// checkpoint's last head: adoption stops at that head and the
			// start refuses the event, naming it.
			old.exec(`UPDATE events SET sig = ''`)
			slipped := old.forge(Event{Business: "acme", Project: "web", Task: "t1", Type: "agent.note", Actor: tm.worker.ID, Data: "{}"})
			kc := newKey(t)
			c := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, SigningKey: kc, AdoptUnsigned: true, CheckpointFile: cpPath})
			if c.b.Adopted() != anchor {
				t.Fatalf("adopted through %d, want the checkpoint's last head %d", c.b.Adopted(), anchor)
			}
			if herr := c.b.Halted(); reasonOf(herr) != errdefs.LogHeadUnproven || !strings.Contains(herr.Error(), "event "+strconv.FormatInt(slipped.Seq, 10)+" (agent.note by "+tm.worker.ID+") carries no signature") {
				t.Fatalf("a start past an unsigned event: %v", herr)
			}
			c.b.Close()

			// A later start, even one that made its key, adopts nothing:
			// the log holds signed events.
			kl := newKey(t)
			l := newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, SigningKey: kl, TrustedKeys: []ed25519.PublicKey{pubOf(kc)}, AdoptUnsigned: true})
			if l.b.Adopted() != 0 {
				t.Fatalf("adopted again, through %d", l.b.Adopted())
			}
			if v, _ := l.b.VerifyLog(context.Background()); v.OK || v.FirstBadSeq != slipped.Seq {
				t.Fatalf("the slipped event after a second adoption: %+v", v)
			}
			if _, err := os.Stat(cpPath); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// log verify checks each verdict's authority from the log alone, even
// for an event a host signed: a verdict by the grant that pushed, or by a
// grant without review.verdict, is named.
func TestVerifyChecksVerdictAuthority(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")
		cases := []struct {
			task  string
			by    func(tm team, both actor) actor
			wants string
		}{
			{"self", func(_ team, both actor) actor { return both }, "which pushed the commit it judges"},
			{"nocap", func(tm team, _ actor) actor { return tm.closer }, "which does not hold review.verdict"},
		}
		for _, c := range cases {
			tm := e.team(c.task)
			both := e.grant("acme", "web", c.task, "both", authz.CapPushWorking, authz.CapReviewVerdict)
			if err := e.push(both, 1); err != nil {
				t.Fatal(err)
			}
			r := e.request(both)
			by := c.by(tm, both)
			// Signed, as a host whose rules were bypassed would sign it.
			var seq int64
			err := e.b.write(context.Background(), func(ctx context.Context, q *writeTx) error {
				ev := Event{Business: "acme", Project: "web", Task: c.task, Type: TypeReviewVerdict, Actor: by.ID,
					Data: mustData(map[string]any{"request_id": r.RequestId, "verdict": Approve, "commit": commit(1), "push_seq": e.head() - 1, "comment": ""})}
				if err := appendEvent(ctx, q, &ev); err != nil {
					return err
				}
				seq = ev.Seq
				return q.setVerdict(ctx, r.RequestId, Approve, ev.Seq, by.ID)
			})
			if err != nil {
				t.Fatal(err)
			}
			v, err := e.b.VerifyLog(context.Background())
			if err != nil || v.OK || v.FirstBadSeq != seq || !strings.Contains(v.Reason, "grant "+by.ID+", "+c.wants) {
				t.Fatalf("%s: %+v %v", c.task, v, err)
			}
			e.exec(`DELETE FROM events WHERE seq = $1`, seq)
			e.exec(`UPDATE review_requests SET verdict = '', verdict_seq = 0, reviewer = '' WHERE id = $1`, r.RequestId)
		}
	})
}

// The host signs a verdict after checking the grants and review_requests
// tables, which a database writer can edit; so the gate checks the
// approve's authority from the log too. A grant row minted in the table
// (its token the writer's), and a request whose pusher was blanked so its
// pusher may judge it, both get a verdict through the API, signed; the
// gate refuses both, and log verify names them.
func TestGateChecksVerdictAuthority(t *testing.T) {
	eachStore(t, func(t *testing.T, e *env) {
		e.project("acme", "web")

		// A grant that only the table knows.
		tm := e.team("minted")
		if err := e.push(tm.worker, 1); err != nil {
			t.Fatal(err)
		}
		r := e.request(tm.worker)
		e.exec(`INSERT INTO grants (id, token_hash, business, project, task, role, caps, expires_at, revoked_seq, launch, launched_by, launch_depth)
			VALUES ('g-minted', $1, 'acme', 'web', 'minted', 'reviewer', 'review.verdict', $2, 0, '', '', 0)`, tokenHash("bht_minted"), time.Now().Add(time.Hour).UnixNano())
		minted := actor{ID: "g-minted", Token: "bht_minted", G: authz.Grant{ID: "g-minted", Business: "acme", Project: "web", Task: "minted", Role: "reviewer", Caps: []string{authz.CapReviewVerdict}}}
		// The host gives it no verdict: its token is none a grant.created
		// records (tokenbind_test.go)...
		before := e.head()
		err := e.verdict(minted, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE)
		e.refused(err, errdefs.KindUnauthenticated, before, "the minted grant's verdict")
		if reasonOf(err) != errdefs.GrantTokenMismatch {
			t.Fatalf("the minted grant's verdict: %v", err)
		}
		// ... and one signed with the host's key, as a thief of it would,
		// the gate refuses from the log.
		ev := e.forgeVerdict(minted, r.RequestId)
		e.exec(`UPDATE events SET sig = $1 WHERE seq = $2`, NewSigner(testKey).sign(ev.Hash), ev.Seq)
		mintedSeq := ev.Seq
		before = e.head()
		err = e.close(tm.closer)
		e.refused(err, errdefs.KindFailedPrecondition, before, "close on a minted grant's approve")
		if reasonOf(err) != errdefs.GateVerdictInvalid || !strings.Contains(err.Error(), `is by "g-minted", which no grant.created in the log names`) {
			t.Fatalf("close on a minted grant's approve: %v", err)
		}
		_, err = e.b.LandApproved(context.Background(), authz.Grant{ID: authz.HostID, Host: true}, "acme", "web", "minted", false)
		if reasonOf(err) != errdefs.GateVerdictInvalid {
			t.Fatalf("land on a minted grant's approve: %v", err)
		}

		// A pusher that judges its own push, the request row edited.
		e.task("acme", "web", "self")
		both := e.grant("acme", "web", "self", "both", authz.CapPushWorking, authz.CapReviewVerdict)
		closer := e.grant("acme", "web", "self", "closer", authz.CapTaskClose)
		if err := e.push(both, 1); err != nil {
			t.Fatal(err)
		}
		r = e.request(both)
		e.exec(`UPDATE review_requests SET push_actor = '' WHERE id = $1`, r.RequestId)
		if err := e.verdict(both, r.RequestId, brokerv1.Verdict_VERDICT_APPROVE); err != nil {
			t.Fatalf("the pusher's verdict on an edited request: %v", err)
		}
		before = e.head()
		err = e.close(closer)
		e.refused(err, errdefs.KindFailedPrecondition, before, "close on the pusher's own approve")
		if reasonOf(err) != errdefs.GateVerdictInvalid || !strings.Contains(err.Error(), "which pushed the commit it judges") {
			t.Fatalf("close on the pusher's own approve: %v", err)
		}

		v, err := e.b.VerifyLog(context.Background())
		if err != nil || v.OK || v.FirstBadSeq != mintedSeq || !strings.Contains(v.Reason, `no grant.created in the log names`) {
			t.Fatalf("log verify: %+v %v", v, err)
		}
	})
}
