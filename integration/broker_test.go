package integration

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // to edit broker.db as an attacker with the file would
)

// event is one line of 'bushost events --json'.
type brokerEvent struct {
	Seq   int64           `json:"seq"`
	Task  string          `json:"task"`
	Type  string          `json:"type"`
	Actor string          `json:"actor"`
	Data  json.RawMessage `json:"data"`
	Peer  string          `json:"peer"`
	Hash  string          `json:"hash"`
}

func brokerEvents(t *testing.T, h *Host, args ...string) []brokerEvent {
	t.Helper()
	out := h.Must(t, append([]string{"events", "--json"}, args...)...)
	var evs []brokerEvent
	for _, line := range strings.Split(out, "\n") {
		if line == "" {
			continue
		}
		var e brokerEvent
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --json line %q: %v", line, err)
		}
		evs = append(evs, e)
	}
	return evs
}

// runAs runs bushost with a grant's token file and checks the exit code.
func runAs(t *testing.T, h *Host, tokenFile string, wantCode int, args ...string) (string, string) {
	t.Helper()
	out, errs, code := h.Run(t, nil, append([]string{"--token-file", tokenFile}, args...)...)
	if code != wantCode {
		t.Fatalf("bushost %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, wantCode, out, errs)
	}
	return strings.TrimSpace(out), strings.TrimSpace(errs)
}

// A whole task: project, task, grants; the worker pushes, the reviewer
// fetches and approves, the task closes only after that, and the log shows
// it all and verifies.
func TestBrokerWholeTask(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	lead := h.Grant(t, "acme", "web", "t1", "lead", "task.close")
	base := filepath.Dir(h.Home)

	work := filepath.Join(base, "work")
	runAs(t, h, worker, 0, "fetch-main", "--repo", work)
	if err := os.WriteFile(filepath.Join(work, "feature.txt"), []byte("the work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, work, "add", "feature.txt")
	testGit(t, work, "commit", "-q", "-m", "the work")
	head := testGit(t, work, "rev-parse", "HEAD")
	pushed, _ := runAs(t, h, worker, 0, "push-working", "--repo", work)
	if pushed != head {
		t.Fatalf("push-working printed %q, want %s", pushed, head)
	}

	review := filepath.Join(base, "review")
	got, _ := runAs(t, h, reviewer, 0, "fetch-review", "--repo", review)
	if got != head || testGit(t, review, "rev-parse", "refs/review/t1") != head {
		t.Fatalf("fetch-review: %q, want %s", got, head)
	}

	_, errs := runAs(t, h, lead, 1, "task", "close")
	if !strings.Contains(errs, "FailedPrecondition") || !strings.Contains(errs, "no review") {
		t.Fatalf("close before review: %s", errs)
	}
	id, _ := runAs(t, h, worker, 0, "review", "request")
	if again, _ := runAs(t, h, worker, 0, "review", "request"); again != id {
		t.Fatalf("asking again gave %q, want %q", again, id)
	}
	_, errs = runAs(t, h, lead, 1, "task", "close")
	if !strings.Contains(errs, "no verdict yet") {
		t.Fatalf("close with a pending review: %s", errs)
	}
	// The worker may not approve its own push (it lacks review.verdict).
	_, errs = runAs(t, h, worker, 4, "review", "verdict", "--request", id, "--approve", "--commit", head)
	if !strings.Contains(errs, "PermissionDenied") {
		t.Fatalf("worker's verdict: %s", errs)
	}
	runAs(t, h, reviewer, 0, "review", "verdict", "--request", id, "--approve", "--comment", "looks right", "--repo", review)
	_, errs = runAs(t, h, reviewer, 1, "review", "verdict", "--request", id, "--approve", "--repo", review)
	if !strings.Contains(errs, "one verdict per request") {
		t.Fatalf("second verdict: %s", errs)
	}
	runAs(t, h, lead, 0, "task", "close")

	// Closed: the next push is refused and leaves nothing in the log.
	n := len(brokerEvents(t, h))
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "late")
	_, errs = runAs(t, h, worker, 1, "push-working", "--repo", work)
	if !strings.Contains(errs, "FailedPrecondition") || !strings.Contains(errs, "closed") {
		t.Fatalf("push after close: %s", errs)
	}
	if m := len(brokerEvents(t, h)); m != n {
		t.Fatalf("a refused push appended: %d -> %d events", n, m)
	}

	var types []string
	for _, e := range brokerEvents(t, h, "--task", "t1") {
		types = append(types, e.Type)
		if e.Type == "action.allowed" {
			var d map[string]string
			json.Unmarshal(e.Data, &d)
			if d["commit"] != head || d["capability"] != "git.push.working" || d["ref"] != "refs/work/t1" {
				t.Fatalf("push event data: %s", e.Data)
			}
			if !strings.HasPrefix(e.Peer, "pid=") {
				t.Fatalf("push event without the pusher's peer credentials: %+v", e)
			}
		}
	}
	want := "task.added grant.created grant.created grant.created action.allowed review.request review.verdict task.closed"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("events:\n got %s\nwant %s", got, want)
	}
	// A grant sees its own task's events, under the listing's header.
	out, _ := runAs(t, h, worker, 0, "events")
	if lines := strings.Split(out, "\n"); len(lines) != len(types)+1 || !strings.HasPrefix(lines[0], "SEQ\tTIME\t") {
		t.Fatalf("worker's events:\n%s", out)
	}
	if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify: %s", out)
	}
}

// Every refusal on the command line exits non-zero with the reason and
// appends nothing.
func TestBrokerRefusals(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	agent := h.Grant(t, "acme", "web", "t1", "agent", "event.record", "git.push.working", "review.request", "review.verdict", "task.close")
	h.Must(t, "task", "add", "--business", "acme", "--project", "web", "--task", "t2")

	out, _ := runAs(t, h, agent, 0, "event", "record", "--type", "agent.step_done", "--data", `{"step":1}`)
	if out == "" {
		t.Fatal("event record printed no sequence number")
	}
	before := len(brokerEvents(t, h))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"event", "record", "--type", "review.verdict", "--data", `{"verdict":"approve"}`}, 4, "EVENT_TYPE_RESERVED"},
		{[]string{"event", "record", "--type", "action.allowed"}, 4, "reserved"},
		{[]string{"event", "record", "--type", "Agent.Step"}, 6, "InvalidArgument"},
		{[]string{"event", "record", "--type", "note", "--data", "[1]"}, 6, "JSON object"},
		{[]string{"event", "record"}, 2, "--type is required"},
		{[]string{"events", "--task", "t2"}, 4, "PermissionDenied"},
		{[]string{"review", "verdict", "--request", "r-0011223344556677", "--approve", "--commit", strings.Repeat("0", 40)}, 6, "NotFound"},
		{[]string{"review", "verdict", "--request", "x", "--approve", "--reject"}, 2, "exactly one"},
		{[]string{"review", "request"}, 1, "no push"},
		{[]string{"grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "x", "--cap", "task.close"}, 4, "PermissionDenied"},
		{[]string{"log", "verify"}, 4, "PermissionDenied"},
	} {
		out, errs, code := h.Run(t, nil, append([]string{"--token-file", agent}, c.args...)...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Fatalf("%v: exit %d, stderr %q; want exit %d and %q (stdout %q)", c.args, code, errs, c.code, c.want, out)
		}
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "x", "--cap", "git.push.everything"}, 6, "unknown capability"},
		{[]string{"grant", "--business", "acme", "--project", "web", "--task", "nope", "--role", "x", "--cap", "task.close"}, 6, "NotFound"},
		{[]string{"grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "x"}, 2, "--cap is required"},
		{[]string{"task", "add", "--business", "acme", "--project", "nope", "--task", "t1"}, 6, "unknown project"},
		{[]string{"task", "add", "--business", "acme", "--project", "web", "--task", "../t1"}, 6, "InvalidArgument"},
		{[]string{"revoke", "g-0000000000000000"}, 6, "NotFound"},
		{[]string{"revoke"}, 2, "GRANT_ID"},
	} {
		out, errs, code := h.Run(t, nil, c.args...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Fatalf("%v: exit %d, stderr %q; want exit %d and %q (stdout %q)", c.args, code, errs, c.code, c.want, out)
		}
	}
	if after := len(brokerEvents(t, h)); after != before {
		t.Fatalf("refusals appended: %d -> %d events", before, after)
	}

	// --out never overwrites, and writes 0600.
	tokFile := filepath.Join(filepath.Dir(h.Home), "tok")
	if err := os.WriteFile(tokFile, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code := h.Run(t, nil, "grant", "--business", "acme", "--project", "web", "--task", "t2", "--role", "w", "--cap", "event.record", "--out", tokFile)
	if b, _ := os.ReadFile(tokFile); code != 2 || string(b) != "keep me" || !strings.Contains(errs, "exists") {
		t.Fatalf("grant --out over an existing file: exit %d, %q, file %q", code, errs, b)
	}
	if after := len(brokerEvents(t, h)); after != before {
		t.Fatalf("a grant refused by the client was issued: %d -> %d events", before, after)
	}
	fresh := h.Grant(t, "acme", "web", "t2", "w", "event.record")
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", fi, err)
	}

	// Printed to stdout without --out; --json gives id, token and expiry.
	out = h.Must(t, "--json", "grant", "--business", "acme", "--project", "web", "--task", "t2", "--role", "w", "--cap", "event.record", "--ttl", "1h")
	var g struct{ GrantID, Token, ExpiresAt string }
	if err := json.Unmarshal([]byte(out), &struct {
		GrantID   *string `json:"grant_id"`
		Token     *string `json:"token"`
		ExpiresAt *string `json:"expires_at"`
	}{&g.GrantID, &g.Token, &g.ExpiresAt}); err != nil || g.Token == "" || g.GrantID == "" || g.ExpiresAt == "" {
		t.Fatalf("grant --json: %q %v", out, err)
	}
	env := []string{"BUS_TOKEN=" + g.Token}
	if _, errs, code := h.Run(t, env, "event", "record", "--type", "note"); code != 0 {
		t.Fatalf("BUS_TOKEN: %s", errs)
	}
	h.Must(t, "revoke", g.GrantID)
	if _, errs, code := h.Run(t, env, "event", "record", "--type", "note"); code != 4 || !strings.Contains(errs, "Unauthenticated") || !strings.Contains(errs, "revoked") {
		t.Fatalf("revoked token: exit %d %s", code, errs)
	}
}

// log verify names the first event whose row was edited in broker.db.
func TestBrokerLogVerifyCatchesEdit(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	agent := h.Grant(t, "acme", "web", "t1", "agent", "event.record")
	var seqs []string
	for i := 0; i < 3; i++ {
		out, _ := runAs(t, h, agent, 0, "event", "record", "--type", "agent.note", "--data", `{"i":1}`)
		seqs = append(seqs, out)
	}
	if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify: %s", out)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.Join(h.Home, "broker.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE events SET data = '{"i":2}' WHERE seq = ` + seqs[1]); err != nil {
		t.Fatal(err)
	}
	out, errs, code := h.Run(t, nil, "log", "verify")
	if code != 1 || !strings.Contains(errs, "event "+seqs[1]) {
		t.Fatalf("log verify after an edit of event %s: exit %d\nstdout %s\nstderr %s", seqs[1], code, out, errs)
	}
	out, _, _ = h.Run(t, nil, "--json", "log", "verify")
	var v struct {
		OK    bool  `json:"ok"`
		First int64 `json:"first_bad_seq"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.OK || seqs[1] != jsonInt(v.First) {
		t.Fatalf("log verify --json: %q %v", out, err)
	}
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// events --follow streams events as they are appended, until interrupted.
func TestBrokerEventsFollow(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	agent := h.Grant(t, "acme", "web", "t1", "agent", "event.record")
	cmd := exec.Command(h.client, "--home", h.Home, "--token-file", agent, "events", "--follow", "--json")
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan brokerEvent, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e brokerEvent
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				lines <- e
			}
		}
		close(lines)
	}()
	next := func() brokerEvent {
		t.Helper()
		select {
		case e, ok := <-lines:
			if !ok {
				t.Fatal("events --follow ended")
			}
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("events --follow delivered nothing in 10s")
		}
		return brokerEvent{}
	}
	for _, want := range []string{"task.added", "grant.created"} {
		if e := next(); e.Type != want {
			t.Fatalf("followed %+v, want %s", e, want)
		}
	}
	for i := 0; i < 3; i++ {
		seq, _ := runAs(t, h, agent, 0, "event", "record", "--type", "agent.tick")
		if e := next(); e.Type != "agent.tick" || jsonInt(e.Seq) != seq {
			t.Fatalf("followed %+v, want agent.tick at %s", e, seq)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("events --follow after SIGINT: %v", err)
	}
}
