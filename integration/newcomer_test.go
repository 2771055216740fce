package integration

import (
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
	"github.com/bushost/bushost/internal/treesnap"
)

// What a newcomer trips on first (issue 35), each checked as the user
// meets it: the words of a refusal, its exit status, and that it left
// nothing behind.

// A reviewer's reject is not hidden: task show prints its comment, and
// the worker asking again for a review of the rejected push is refused,
// told that a new push is needed, and appends nothing; after a new push
// a review request is a new one.
func TestRejectShowsCommentAndNeedsNewPush(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	f.commit(t, "a.txt", "one\n")
	f.push(t)
	id, _ := runAs(t, h, f.worker, 0, "review", "request")
	runAs(t, h, f.reviewer, 0, "fetch-review", "--repo", f.review)
	runAs(t, h, f.reviewer, 0, "review", "verdict", "--request", id, "--reject", "--repo", f.review,
		"--comment", "needs tests\nREQUEST  forged row")

	show, _ := runAs(t, h, f.worker, 0, "task", "show")
	if !strings.Contains(show, "comment on "+id+" (reject, event ") || !strings.Contains(show, "\n    needs tests\n    REQUEST  forged row") {
		t.Fatalf("task show lacks the reviewer's comment, indented under the table:\n%s", show)
	}

	n := len(brokerEvents(t, h))
	_, errs := runAs(t, h, f.worker, 1, "review", "request")
	for _, want := range []string{"VERDICT_GIVEN", "was rejected", id, "push a new commit"} {
		if !strings.Contains(errs, want) {
			t.Fatalf("review request of a rejected push: %q lacks %q", errs, want)
		}
	}
	if m := len(brokerEvents(t, h)); m != n {
		t.Fatalf("a refused review request appended: %d -> %d events", n, m)
	}

	f.commit(t, "a_test.txt", "tested\n")
	f.push(t)
	if again, _ := runAs(t, h, f.worker, 0, "review", "request"); again == id || again == "" {
		t.Fatalf("review request after a new push: %q (the rejected one was %q)", again, id)
	}
}

// The hints a host gets: a missing launcher is named as such (not
// bushostd); a home where no daemon ever ran says so rather than
// TOKEN_MISSING; grant --out onto an existing file is a usage error that
// issues nothing; log verify without a head says none was checked; the
// events listing has a header.
func TestHostHints(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	h.Must(t, "task", "add", "--business", "acme", "--project", "web", "--task", "t1")

	_, errs, code := h.Run(t, nil, "session", "list")
	if code != 3 || !strings.Contains(errs, "no launcher (sandbox serve) serves on home "+h.Home) ||
		!strings.Contains(errs, "'sandbox serve --home "+h.Home+"'") || strings.Contains(errs, "bushostd serve") {
		t.Fatalf("session list without a launcher: exit %d\n%s", code, errs)
	}

	empty := filepath.Join(filepath.Dir(h.Home), "not-a-home")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	_, errs, code = runBin(t, h.client, nil, "--home", empty, "task", "list")
	if code != 3 || !strings.Contains(errs, "UNREACHABLE") || !strings.Contains(errs, "no admin.token and no socket") ||
		!strings.Contains(errs, "'bushostd serve --home "+empty+"'") || strings.Contains(errs, "TOKEN_MISSING") {
		t.Fatalf("--home at a directory with no daemon: exit %d\n%s", code, errs)
	}

	tokens := filepath.Join(filepath.Dir(h.Home), "tokens")
	if err := os.Mkdir(tokens, 0o700); err != nil {
		t.Fatal(err)
	}
	existing := filepath.Join(tokens, "worker.token")
	if err := os.WriteFile(existing, []byte("kept\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before := treesnap.Take(t, tokens)
	n := len(brokerEvents(t, h))
	_, errs, code = h.Run(t, nil, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "worker",
		"--cap", "git.push.working", "--out", existing)
	if code != 2 || !strings.Contains(errs, "--out "+existing+" exists") {
		t.Fatalf("grant --out onto an existing file: exit %d\n%s", code, errs)
	}
	if m := len(brokerEvents(t, h)); m != n {
		t.Fatalf("a refused grant --out issued a grant: %d -> %d events", n, m)
	}
	if b, _ := os.ReadFile(existing); string(b) != "kept\n" {
		t.Fatalf("grant --out changed the existing file: %q", b)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, tokens)); d != "" {
		t.Fatalf("a refused grant --out left something behind:\n%s", d)
	}

	if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") || !strings.Contains(out, "no recorded head was given") || strings.Contains(out, "0 recorded heads") {
		t.Fatalf("log verify without a head: %s", out)
	}
	head := strings.Fields(h.Must(t, "log", "head"))
	if out := h.Must(t, "log", "verify", "--head", head[0]+":"+head[1]); !strings.Contains(out, "1 recorded heads match") {
		t.Fatalf("log verify with a head: %s", out)
	}

	lines := strings.Split(h.Must(t, "events"), "\n")
	if len(lines) != 1+len(brokerEvents(t, h)) || lines[0] != "SEQ\tTIME\tBUSINESS/PROJECT/TASK\tTYPE\tACTOR\tDATA" {
		t.Fatalf("events without a header, or a line per event:\n%s", strings.Join(lines, "\n"))
	}
	if out := h.Must(t, "events", "--after", "100000"); out != "SEQ\tTIME\tBUSINESS/PROJECT/TASK\tTYPE\tACTOR\tDATA" {
		t.Fatalf("an empty listing: %q", out)
	}
}

// A push refused OBJECT_TOO_LARGE names, besides the pack entry, the
// object and its path in the worker's repository, and leaves the bus
// host's repositories as they were.
func TestObjectTooLargeNamesThePath(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--max-object-bytes", "4K"}})
	f := newLandFixture(t, h, "web", "t1")
	big := make([]byte, 64<<10)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(f.work, "assets"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.commit(t, "small.txt", "fits\n")
	f.commit(t, "assets/big.bin", string(big))
	blob := testGit(t, f.work, "rev-parse", "HEAD:assets/big.bin")
	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))

	_, errs := runAs(t, h, f.worker, 7, "push-working", "--repo", f.work)
	for _, want := range []string{"OBJECT_TOO_LARGE", "--max-object-bytes", "it is the blob " + blob + " at assets/big.bin"} {
		if !strings.Contains(errs, want) {
			t.Fatalf("push of a blob over the limit: %q lacks %q", errs, want)
		}
	}
	_, errs = runAs(t, h, f.worker, 7, "--json", "push-working", "--repo", f.work)
	if e := parseJSONError(t, errs); e.Error.Metadata["path"] != "assets/big.bin" || e.Error.Metadata["object"] != blob || e.Error.Metadata["type"] != "blob" {
		t.Fatalf("--json metadata: %+v", e.Error)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("a refused push changed the repositories:\n%s", d)
	}
}

// bushostd, once it serves, prints the commands that come next (after its
// "serving" line, with the home they need); with --log-format json its
// stderr stays one JSON object a line.
func TestServePrintsNextSteps(t *testing.T) {
	h := startHost(t)
	// The sockets answer a moment before the daemon logs that it serves.
	var log string
	testenv.WaitFor(t, 30*time.Second, "the next steps in bushostd's log", func() bool {
		b, _ := os.ReadFile(h.Log)
		log = string(b)
		return strings.Contains(log, "sandbox serve --home")
	})
	serving := strings.Index(log, "msg=serving")
	next := strings.Index(log, "export BUSHOST_HOME="+h.Home+"\n")
	if serving < 0 || next < serving {
		t.Fatalf("no next steps after the serving line:\n%s", log)
	}
	for _, want := range []string{"bushost project add --business", "bushost task add", "bushost grant", "sandbox serve --home " + h.Home} {
		if !strings.Contains(log[next:], want) {
			t.Fatalf("the next steps lack %q:\n%s", want, log[next:])
		}
	}

	j := startHostWith(t, hostOpts{Args: []string{"--log-format", "json"}})
	var b []byte
	testenv.WaitFor(t, 30*time.Second, `the "serving" line of bushostd's JSON log`, func() bool {
		b, _ = os.ReadFile(j.Log)
		return strings.Contains(string(b), `"msg":"serving"`)
	})
	lines := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("--log-format json wrote a line that is not JSON: %q", line)
		}
		lines++
	}
	if lines == 0 || strings.Contains(string(b), "bushost project add") {
		t.Fatalf("--log-format json log:\n%s", b)
	}
}
