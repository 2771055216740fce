package integration

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/broker"
)

// openBrokerDB opens the host's broker.db as an attacker with the file
// would (the daemon stopped or not).
func openBrokerDB(t *testing.T, h *Host) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(h.Home, "broker.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func mustExec(t *testing.T, db *sql.DB, stmt string, args ...any) {
	t.Helper()
	if _, err := db.Exec(stmt, args...); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// A derived row edited to say "approved": the gate still decides from the
// log (no verdict: closed stays refused), and log verify names the row.
func TestGateDecidesFromTheLog(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	lead := h.Grant(t, "acme", "web", "t1", "lead", "task.close")
	work := filepath.Join(filepath.Dir(h.Home), "work")
	runAs(t, h, worker, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "x")
	runAs(t, h, worker, 0, "push-working", "--repo", work)
	id, _ := runAs(t, h, worker, 0, "review", "request")

	db := openBrokerDB(t, h)
	mustExec(t, db, `UPDATE review_requests SET verdict = 'approve', verdict_seq = 1, reviewer = 'g-forged' WHERE id = ?`, id)
	n := len(brokerEvents(t, h))
	if _, errs := runAs(t, h, lead, 1, "task", "close"); !strings.Contains(errs, "no verdict yet") {
		t.Fatalf("close on a forged approve row: %s", errs)
	}
	if m := len(brokerEvents(t, h)); m != n {
		t.Fatalf("the refused close appended: %d -> %d", n, m)
	}
	_, errs, code := h.Run(t, nil, "log", "verify")
	if code != 1 || !strings.Contains(errs, "review_requests "+id+": verdict is \"approve\" in the table") {
		t.Fatalf("log verify after the row edit: exit %d\n%s", code, errs)
	}
}

// The log anchored: log head, log verify --head and --checkpoint-file, and
// bushostd serve --checkpoint-file. A chain rewritten and rehashed, and a
// log whose last events were deleted, are each named at their first bad
// event, and the broker refuses to serve (the git service still serves
// fetches) until the operator acts (docs/broker.md).
func TestLogAnchors(t *testing.T) {
	base := baseDir(t)
	cp := filepath.Join(base, "heads")
	h := startHostWith(t, hostOpts{Home: filepath.Join(base, "home"), Args: []string{"--checkpoint-file", cp}})
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "event.record")
	work := filepath.Join(base, "work")
	runAs(t, h, worker, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "x")
	runAs(t, h, worker, 0, "push-working", "--repo", work)

	// log head, in both forms, is the last event and the checkpoint's
	// last line.
	head := h.Must(t, "log", "head")
	var hj struct {
		Seq  int64  `json:"seq"`
		Hash string `json:"hash"`
	}
	if err := json.Unmarshal([]byte(h.Must(t, "--json", "log", "head")), &hj); err != nil || fmt.Sprintf("%d %s", hj.Seq, hj.Hash) != head {
		t.Fatalf("log head %q, --json %+v %v", head, hj, err)
	}
	if lines := strings.Split(strings.TrimSpace(readText(t, cp)), "\n"); lines[len(lines)-1] != head {
		t.Fatalf("checkpoint ends with %q, log head is %q", lines[len(lines)-1], head)
	}
	recorded := strings.Replace(head, " ", ":", 1)
	bad := hj.Seq
	for i := 0; i < 3; i++ {
		runAs(t, h, worker, 0, "event", "record", "--type", "agent.note")
	}
	if out := h.Must(t, "log", "verify", "--head", recorded, "--checkpoint-file", cp); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify on an untouched log: %s", out)
	}

	// Rewrite event `bad` and rehash everything after it: the hashes
	// fit, but neither the signatures nor the anchors do.
	h.Stop(t)
	backup := snapshotStore(t, h)
	db := openBrokerDB(t, h)
	rewriteFrom(t, db, bad)
	db.Close()
	h.start(t)
	for _, args := range [][]string{nil, {"--head", recorded}, {"--checkpoint-file", cp}} {
		_, errs, code := h.Run(t, nil, append([]string{"log", "verify"}, args...)...)
		if code != 1 || !strings.Contains(errs, fmt.Sprintf("at event %d:", bad)) {
			t.Fatalf("log verify %v after the rewrite: exit %d\n%s", args, code, errs)
		}
	}
	refusesToServe(t, h, worker, work, bad)

	// The operator acts: a new checkpoint file would not help (the
	// rewritten events are signed by no host: the start refuses them),
	// so it restores the store from its backup (docs/broker.md).
	h.Stop(t)
	if err := os.Rename(cp, cp+".mismatch"); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	_, errs, code := h.Run(t, nil, "--json", "log", "head")
	if code != 0 {
		t.Fatalf("log head on a halted host: exit %d %s", code, errs)
	}
	if _, errs := runAs(t, h, worker, 3, "--json", "event", "record", "--type", "agent.note"); !strings.Contains(errs, `"reason":"LOG_HEAD_UNPROVEN"`) || !strings.Contains(errs, fmt.Sprintf("event %d (", bad)) {
		t.Fatalf("a fresh checkpoint file on a rewritten log: %s", errs)
	}
	h.Stop(t)
	if err := os.Rename(cp+".mismatch", cp); err != nil {
		t.Fatal(err)
	}
	restoreStore(t, h, backup)
	h.start(t)
	runAs(t, h, worker, 0, "event", "record", "--type", "agent.note")

	// Delete the last events: the first missing one is named.
	last := strings.Fields(h.Must(t, "log", "head"))
	h.Stop(t)
	db = openBrokerDB(t, h)
	var n int64
	fmt.Sscan(last[0], &n)
	mustExec(t, db, `DELETE FROM events WHERE seq > ?`, n-2)
	db.Close()
	h.start(t)
	_, errs, code = h.Run(t, nil, "log", "verify", "--head", last[0]+":"+last[1])
	if code != 1 || !strings.Contains(errs, fmt.Sprintf("at event %d:", n-1)) || !strings.Contains(errs, "deleted") {
		t.Fatalf("log verify --head after the truncation: exit %d\n%s", code, errs)
	}
	refusesToServe(t, h, worker, work, n-1)
}

// refusesToServe checks that the broker refuses (Unavailable, naming the
// first bad event), the push is refused, and fetches still work.
func refusesToServe(t *testing.T, h *Host, worker, work string, bad int64) {
	t.Helper()
	_, errs := runAs(t, h, worker, 3, "event", "record", "--type", "agent.note")
	if !strings.Contains(errs, "Unavailable") || !strings.Contains(errs, fmt.Sprintf("at event %d", bad)) {
		t.Fatalf("a broker whose log does not match its checkpoint: %s", errs)
	}
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "more")
	if _, errs := runAs(t, h, worker, 3, "push-working", "--repo", work); !strings.Contains(errs, "Unavailable") {
		t.Fatalf("push to a halted broker: %s", errs)
	}
	fresh, err := os.MkdirTemp(filepath.Dir(h.Home), "fetch-")
	if err != nil {
		t.Fatal(err)
	}
	runAs(t, h, worker, 0, "fetch-main", "--repo", filepath.Join(fresh, "clone"))
}

// rewriteFrom changes event from's data and recomputes every hash from it
// on, as an attacker who knows the encoding would.
func rewriteFrom(t *testing.T, db *sql.DB, from int64) {
	t.Helper()
	rows, err := db.Query(`SELECT seq, business, project, task, type, actor, data, time, peer, prev_hash FROM events WHERE seq >= ? ORDER BY seq`, from)
	if err != nil {
		t.Fatal(err)
	}
	var evs []broker.Event
	for rows.Next() {
		var e broker.Event
		if err := rows.Scan(&e.Seq, &e.Business, &e.Project, &e.Task, &e.Type, &e.Actor, &e.Data, &e.Time, &e.Peer, &e.PrevHash); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, e)
	}
	rows.Close()
	prev := evs[0].PrevHash
	for i, e := range evs {
		if i == 0 {
			e.Peer = "pid=1,uid=0,gid=0"
		}
		e.PrevHash = prev
		e.Hash = broker.HashEvent(e)
		mustExec(t, db, `UPDATE events SET peer = ?, prev_hash = ?, hash = ? WHERE seq = ?`, e.Peer, e.PrevHash, e.Hash, e.Seq)
		prev = e.Hash
	}
}

// snapshotStore copies a stopped host's broker.db (with its WAL files, if
// any), as an operator's backup would.
func snapshotStore(t *testing.T, h *Host) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(filepath.Join(h.Home, "broker.db"+suffix))
		if err == nil {
			files[suffix] = b
		} else if !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	return files
}

// restoreStore puts a snapshot back in place of a stopped host's store.
func restoreStore(t *testing.T, h *Host, files map[string][]byte) {
	t.Helper()
	for _, suffix := range []string{"", "-wal", "-shm"} {
		path := filepath.Join(h.Home, "broker.db"+suffix)
		os.Remove(path)
		if b, ok := files[suffix]; ok {
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}
