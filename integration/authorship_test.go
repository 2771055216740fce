package integration

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/broker"
	"github.com/bushost/bushost/internal/pgtest"
)

// Who wrote an event (issue 31): each host signs what it appends, with a
// key that never enters the database.

// storeDB opens the broker's store as an attacker holding the database
// would: the host's broker.db, or the PostgreSQL schema dsn names.
func storeDB(t *testing.T, h *Host, dsn string) *sql.DB {
	t.Helper()
	if dsn == "" {
		return openBrokerDB(t, h)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// grantID is the id of the grant whose token is in file.
func grantID(t *testing.T, h *Host, file string) string {
	t.Helper()
	out, _ := runAs(t, h, file, 0, "--json", "grant", "list")
	var l struct {
		Grants []struct {
			ID   string `json:"id"`
			Role string `json:"role"`
		} `json:"grants"`
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatal(err)
	}
	role := strings.Split(filepath.Base(file), "-")[4]
	for _, g := range l.Grants {
		if g.Role == role {
			return g.ID
		}
	}
	t.Fatalf("no grant of role %s in %s", role, out)
	return ""
}

// review is a task whose push awaits its verdict: the grants' token files,
// the request, and the reviewer's grant id.
type review struct {
	worker, reviewer, lead string
	request, reviewerID    string
}

// awaitingReview adds acme/web on h, and a task t1 whose worker pushed
// a commit and asked for its review; the lead may close and land.
func awaitingReview(t *testing.T, h *Host) review {
	t.Helper()
	h.AddProject(t, "acme", "web")
	r := review{
		worker:   h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request"),
		reviewer: h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict"),
		lead:     h.Grant(t, "acme", "web", "t1", "lead", "task.close", "task.land"),
	}
	work := filepath.Join(filepath.Dir(h.Home), "work")
	runAs(t, h, r.worker, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "unreviewed")
	runAs(t, h, r.worker, 0, "push-working", "--repo", work)
	r.request, _ = runAs(t, h, r.worker, 0, "review", "request")
	r.reviewerID = grantID(t, h, r.reviewer)
	return r
}

// forgeVerdict appends an approve of request id by reviewer straight
// into the store: chained to the head, its hash from broker.HashEvent,
// and the review_requests row made to agree. It returns the event's seq.
func forgeVerdict(t *testing.T, db *sql.DB, reviewer, id string) int64 {
	t.Helper()
	var e broker.Event
	if err := db.QueryRow(`SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1`).Scan(&e.Seq, &e.PrevHash); err != nil {
		t.Fatal(err)
	}
	var commit string
	var pushSeq int64
	if err := db.QueryRow(`SELECT business, project, task, commit_id, push_seq FROM review_requests WHERE id = $1`, id).Scan(&e.Business, &e.Project, &e.Task, &commit, &pushSeq); err != nil {
		t.Fatal(err)
	}
	e.Seq++
	e.Type, e.Actor, e.Peer = "review.verdict", reviewer, "pid=1,uid=1000,gid=1000"
	e.Time = time.Now().UTC().Format(time.RFC3339Nano)
	e.Data = fmt.Sprintf(`{"comment":"","commit":%q,"push_seq":%d,"request_id":%q,"verdict":"approve"}`, commit, pushSeq, id)
	e.Hash = broker.HashEvent(e)
	mustExec(t, db, `INSERT INTO events (seq, business, project, task, type, actor, data, time, peer, prev_hash, hash) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
		e.Seq, e.Business, e.Project, e.Task, e.Type, e.Actor, e.Data, e.Time, e.Peer, e.PrevHash, e.Hash)
	mustExec(t, db, `UPDATE review_requests SET verdict = 'approve', verdict_seq = $1, reviewer = $2 WHERE id = $3`, e.Seq, reviewer, id)
	return e.Seq
}

// A verdict appended straight into the store (SQLite, and PostgreSQL
// where every host and whoever holds the DSN could): log verify names
// it, task close and task land are refused with nothing appended, and a
// host started with --checkpoint-file refuses to anchor it, naming it,
// its checkpoint unchanged.
func TestForgedVerdictRefused(t *testing.T) {
	for _, store := range []string{"sqlite", "postgres"} {
		t.Run(store, func(t *testing.T) {
			var dsn string
			var args []string
			if store == "postgres" {
				dsn = pgtest.SchemaDSN(t, "forged", "a verdict forged in PostgreSQL")
				args = []string{"--broker-dsn", dsn}
			}
			base := baseDir(t)
			cp := filepath.Join(base, "heads")
			h := startHostWith(t, hostOpts{Home: filepath.Join(base, "home"), Args: append(append([]string{}, args...), "--checkpoint-file", cp)})
			r := awaitingReview(t, h)
			worker, lead, id, rid := r.worker, r.lead, r.request, r.reviewerID
			h.Stop(t)
			anchored := readText(t, cp)

			seq := forgeVerdict(t, storeDB(t, h, dsn), rid, id)
			named := fmt.Sprintf("event %d (review.verdict by %s)", seq, rid)

			// Without the checkpoint: the gate reads the verdict and stays
			// shut; log verify names it.
			h.Args = args
			h.start(t)
			_, errs, code := h.Run(t, nil, "log", "verify")
			if code != 1 || !strings.Contains(errs, named+" carries no signature") {
				t.Fatalf("log verify on a forged verdict: exit %d\n%s", code, errs)
			}
			n := len(brokerEvents(t, h))
			for _, cmd := range [][]string{{"task", "close"}, {"task", "land"}, {"task", "land", "--merge"}} {
				_, errs := runAs(t, h, lead, 1, append([]string{"--json"}, cmd...)...)
				if !strings.Contains(errs, `"reason":"LOG_EVENT_UNPROVEN"`) || !strings.Contains(errs, named) {
					t.Fatalf("%v on a forged verdict: %s", cmd, errs)
				}
			}
			if m := len(brokerEvents(t, h)); m != n {
				t.Fatalf("the refused close and land appended: %d -> %d events", n, m)
			}
			main := testGit(t, filepath.Join(filepath.Dir(h.Home), "root-acme-web"), "rev-parse", "HEAD")
			fresh := filepath.Join(base, "fresh")
			runAs(t, h, worker, 0, "fetch-main", "--repo", fresh)
			if got := testGit(t, fresh, "rev-parse", "HEAD"); got != main {
				t.Fatalf("main moved to %s on a forged verdict (root is at %s)", got, main)
			}
			h.Stop(t)

			// With it: the start refuses to anchor the forged head.
			h.Args = append(append([]string{}, args...), "--checkpoint-file", cp)
			h.start(t)
			_, errs = runAs(t, h, worker, 3, "--json", "event", "record", "--type", "agent.note")
			if !strings.Contains(errs, `"reason":"LOG_HEAD_UNPROVEN"`) || !strings.Contains(errs, named) {
				t.Fatalf("a host started past a forged verdict: %s", errs)
			}
			if got := readText(t, cp); got != anchored {
				t.Fatalf("the checkpoint changed from\n%s\nto\n%s", anchored, got)
			}
			_, errs = runAs(t, h, lead, 3, "--json", "task", "land")
			if !strings.Contains(errs, `"reason":"LOG_HEAD_UNPROVEN"`) {
				t.Fatalf("land on a halted host: %s", errs)
			}
		})
	}
}

// Three hosts on one PostgreSQL: A and B list each other's keys and each
// verifies the other's events; C signs with a key they were not given, so
// a verdict given through C is refused by A's gate and named by A's log
// verify.
func TestHostsProveEachOthersEvents(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "keys", "hosts proving each other's events")
	hosts := startSharing(t, 2, "--broker-dsn", dsn)
	a, b := hosts[0], hosts[1]
	c := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	a.AddProject(t, "acme", "web")
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request", "event.record")
	lead := b.Grant(t, "acme", "web", "t1", "lead", "task.close")
	work := filepath.Join(filepath.Dir(a.Home), "work")
	runAs(t, a, worker, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "work")
	head := testGit(t, work, "rev-parse", "HEAD")
	runAs(t, a, worker, 0, "push-working", "--repo", work)
	runAs(t, b, worker, 0, "event", "record", "--type", "agent.note")
	for _, h := range []*Host{a, b} {
		if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
			t.Fatalf("log verify on %s: %s", h.Home, out)
		}
	}

	// Made through C: a host gives a verdict only with a grant whose
	// grant.created (which records its token) it proves.
	reviewer := c.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	id, _ := runAs(t, c, worker, 0, "review", "request")
	runAs(t, c, reviewer, 0, "review", "verdict", "--request", id, "--approve", "--commit", head)
	cKey := strings.TrimSpace(readText(t, filepath.Join(c.Home, "log.pub")))
	cID := strings.Fields(strings.SplitN(cKey, "\n", 2)[0])
	untrusted := "key " + cID[len(cID)-1] + ", which is not a trusted host's key"
	n := len(brokerEvents(t, a))
	_, errs := runAs(t, b, lead, 1, "--json", "task", "close")
	if !strings.Contains(errs, `"reason":"LOG_EVENT_UNPROVEN"`) || !strings.Contains(errs, untrusted) {
		t.Fatalf("close on a verdict signed by an untrusted host: %s", errs)
	}
	if m := len(brokerEvents(t, a)); m != n {
		t.Fatalf("the refused close appended: %d -> %d", n, m)
	}
	_, errs, code := a.Run(t, nil, "log", "verify")
	if code != 1 || !strings.Contains(errs, "(review.request by ") || !strings.Contains(errs, untrusted) {
		t.Fatalf("log verify on A after C's events: exit %d\n%s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(c.Home, "log.key")); err != nil {
		t.Fatalf("C made no key in its home: %v", err)
	}
}

// A home made before signing: its events carry no signature. The first
// start of this bushostd makes the host's key and signs them (the log
// holds no signed event yet, and the chain verifies); an unsigned event
// written into broker.db after that stays unproven, and the gate shut.
func TestUnsignedHomeIsAdoptedOnce(t *testing.T) {
	h := startHost(t)
	r := awaitingReview(t, h)
	lead, id, rid := r.lead, r.request, r.reviewerID

	// As the home was before this version: no key, no signature.
	h.Stop(t)
	db := openBrokerDB(t, h)
	mustExec(t, db, `UPDATE events SET sig = ''`)
	if err := os.Remove(filepath.Join(h.Home, "log.key")); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify after the upgrade: %s", out)
	}
	if b, _ := os.ReadFile(h.Log); !strings.Contains(string(b), "signed the log's events written before signing") {
		t.Fatalf("the daemon did not say it adopted the log")
	}

	// Written in after the upgrade: never adopted.
	h.Stop(t)
	seq := forgeVerdict(t, db, rid, id)
	h.start(t)
	_, errs, code := h.Run(t, nil, "log", "verify")
	if code != 1 || !strings.Contains(errs, fmt.Sprintf("event %d (review.verdict by %s) carries no signature", seq, rid)) {
		t.Fatalf("log verify after a forged verdict and a new key: exit %d\n%s", code, errs)
	}
	runAs(t, h, lead, 1, "task", "close")
}

// A host joining a shared store makes its key at its first start. A
// database writer that slipped an approve in and stripped every
// signature first must not get the newcomer to sign the log it finds:
// the newcomer's key is then listed on every host, and its signature
// would open their gates too.
func TestJoiningHostAdoptsNothing(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "join", "a host joining a stripped store")
	a := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	r := awaitingReview(t, a)
	db := storeDB(t, a, dsn)
	seq := forgeVerdict(t, db, r.reviewerID, r.request)
	mustExec(t, db, `UPDATE events SET sig = ''`)

	c := startHostWith(t, hostOpts{Args: []string{"--broker-dsn", dsn}})
	if b, _ := os.ReadFile(c.Log); strings.Contains(string(b), "signed the log's events written before signing") {
		t.Fatalf("a new home signed the log it found")
	}
	_, errs, code := c.Run(t, nil, "log", "verify")
	if code != 1 || !strings.Contains(errs, fmt.Sprintf("event %d (review.verdict by %s) carries no signature", seq, r.reviewerID)) {
		t.Fatalf("log verify on the new host: exit %d\n%s", code, errs)
	}
	_, errs = runAs(t, c, r.lead, 1, "--json", "task", "close")
	if !strings.Contains(errs, `"reason":"LOG_EVENT_UNPROVEN"`) {
		t.Fatalf("close on the new host: %s", errs)
	}
}
