package integration

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bushost/bushost/internal/testenv"
)

// mcpSession starts `bushost mcp` in dir with the token file (and the home
// from $BUSHOST_HOME, as a harness's environment gives them: no flag) and
// connects the Go SDK's client to it over CommandTransport.
func mcpSession(t *testing.T, h *Host, token, dir string, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	cmd := exec.Command(h.client, "mcp")
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "BUSHOST_HOME="+h.Home, "BUS_TOKEN_FILE="+token, "TMPDIR="+mcpTemp(t, dir))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	c := sdk.NewClient(&sdk.Implementation{Name: "bushost-test", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to bushost mcp: %v\nstderr: %s", err, stderr.String())
	}
	t.Cleanup(func() {
		cs.Close()
		if strings.Contains(stderr.String(), raceReport) {
			t.Errorf("bushost mcp (built with -race) reported a data race:\n%s", stderr.String())
		}
	})
	return cs
}

// mcpTemp is the server's $TMPDIR: beside dir, so that a test sees what a
// call left there.
func mcpTemp(t *testing.T, dir string) string {
	tmp := filepath.Join(filepath.Dir(dir), "tmp-"+filepath.Base(dir))
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	return tmp
}

func toolNames(t *testing.T, cs *sdk.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil || tl.OutputSchema == nil || tl.Annotations == nil {
			t.Errorf("tool %s lacks a description, a schema or annotations", tl.Name)
		}
	}
	return names
}

// callOK calls a tool and fails the test on a protocol error or a refusal;
// it returns the structured content.
func callOK(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s refused: %s", name, resultText(res))
	}
	return structured(t, res)
}

// callRefused calls a tool and returns its refusal's structured content
// ({code, reason, message, metadata}); it fails the test unless the call
// was refused as a tool error.
func callRefused(t *testing.T, cs *sdk.ClientSession, name string, args map[string]any) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: a protocol error, not a tool's refusal: %v", name, err)
	}
	if !res.IsError {
		t.Fatalf("%s was not refused: %s", name, resultText(res))
	}
	return structured(t, res)
}

func structured(t *testing.T, res *sdk.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return out
}

func resultText(res *sdk.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mcpTask is a task with a worker's and a reviewer's tool sessions, each
// in a directory of its own.
type mcpTask struct {
	worker, reviewer       *sdk.ClientSession
	workerDir, reviewerDir string
}

func newMCPTask(t *testing.T, h *Host, task string) *mcpTask {
	t.Helper()
	base := baseDir(t)
	m := &mcpTask{workerDir: filepath.Join(base, "worker"), reviewerDir: filepath.Join(base, "reviewer")}
	for _, d := range []string{m.workerDir, m.reviewerDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	wt := h.Grant(t, "acme", "web", task, "worker", "git.push.working", "review.request", "task.close", "task.land")
	rt := h.Grant(t, "acme", "web", task, "reviewer", "review.verdict")
	m.worker = mcpSession(t, h, wt, m.workerDir, nil)
	m.reviewer = mcpSession(t, h, rt, m.reviewerDir, nil)
	return m
}

// commit writes file in the worker's repo and commits it.
func (m *mcpTask) commit(t *testing.T, repo, file, text string) string {
	t.Helper()
	dir := filepath.Join(m.workerDir, repo)
	if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, dir, "add", file)
	testGit(t, dir, "commit", "-q", "-m", "change "+file)
	return testGit(t, dir, "rev-parse", "HEAD")
}

// request pushes a first commit (fetch_main, a commit of a.txt,
// push_working) and asks for its review; it returns review_request's
// result.
func (m *mcpTask) request(t *testing.T) map[string]any {
	t.Helper()
	callOK(t, m.worker, "fetch_main", map[string]any{"repo": "w"})
	m.commit(t, "w", "a.txt", "a\n")
	callOK(t, m.worker, "push_working", map[string]any{"repo": "w"})
	return callOK(t, m.worker, "review_request", nil)
}

// approve runs the loop up to an approve verdict through tools only:
// fetch_main, commit, push_working, review_request, fetch_review,
// review_verdict. It returns the commit approved.
func (m *mcpTask) approve(t *testing.T) string {
	t.Helper()
	main := callOK(t, m.worker, "fetch_main", map[string]any{"repo": "w"})["commit"]
	head := m.commit(t, "w", "feature.txt", "work of "+filepath.Base(filepath.Dir(m.workerDir))+"\n")
	pushed := callOK(t, m.worker, "push_working", map[string]any{"repo": "w"})
	if pushed["commit"] != head || main == head {
		t.Fatalf("push_working returned %v, want the commit %s", pushed, head)
	}
	req := callOK(t, m.worker, "review_request", nil)
	if req["commit"] != head || req["request_id"] == "" {
		t.Fatalf("review_request returned %v", req)
	}
	if got := callOK(t, m.reviewer, "fetch_review", map[string]any{"repo": "r"})["commit"]; got != head {
		t.Fatalf("fetch_review returned %v, want %s", got, head)
	}
	v := callOK(t, m.reviewer, "review_verdict", map[string]any{"request": req["request_id"], "approve": true, "comment": "fine", "repo": "r"})
	if v["verdict"] != "approve" || v["commit"] != head {
		t.Fatalf("review_verdict returned %v", v)
	}
	return head
}

// TestMCPLoop drives the whole gated loop through the tools only, over the
// Go SDK's client: one task ends with task_close, another with task_land,
// whose commit is then main's.
func TestMCPLoop(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")

	closed := newMCPTask(t, h, "t1")
	// The gate, refused as a tool's error: nothing pushed is approved yet.
	callOK(t, closed.worker, "fetch_main", map[string]any{"repo": "w"})
	closed.commit(t, "w", "early.txt", "early\n")
	callOK(t, closed.worker, "push_working", map[string]any{"repo": "w"})
	if r := callRefused(t, closed.worker, "task_close", nil); r["reason"] != "GATE_NO_APPROVAL" {
		t.Fatalf("task_close before a verdict: %v, want GATE_NO_APPROVAL", r)
	}
	closed.approve(t)
	if c := callOK(t, closed.worker, "task_close", nil); c["closed"] != true {
		t.Fatalf("task_close returned %v", c)
	}
	if s := callOK(t, closed.worker, "task_show", nil); s["state"] != "closed" {
		t.Fatalf("task_show after task_close: %v", s)
	}

	landed := newMCPTask(t, h, "t2")
	head := landed.approve(t)
	l := callOK(t, landed.worker, "task_land", nil)
	if l["commit"] != head || l["main_new"] != head {
		t.Fatalf("task_land returned %v, want main at %s", l, head)
	}
	if got := testGit(t, h.PoolRepo("acme", "web"), "rev-parse", "refs/heads/main"); got != head {
		t.Fatalf("main is %s after task_land, want %s", got, head)
	}
	ev := callOK(t, landed.worker, "events", map[string]any{"since": 0})
	if evs, _ := ev["events"].([]any); len(evs) == 0 || ev["more"] != false {
		t.Fatalf("events returned %v", ev)
	}
	h.FsckProject(t, "acme", "web")
}

// TestMCPToolsByGrant checks the tools each grant sees: a worker no
// verdict tool, a reviewer no push tool, a lead the session tools.
func TestMCPToolsByGrant(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	dir := baseDir(t)
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request", "task.close")
	reviewer := h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	lead := filepath.Join(dir, "lead.token")
	h.Must(t, "grant", "--business", "acme", "--project", "web", "--task", "t1", "--role", "lead",
		"--cap", "session.launch,event.record", "--launch", "worker=git.push.working,review.request", "--out", lead)
	for _, c := range []struct {
		token string
		want  []string
	}{
		{worker, []string{"fetch_main", "fetch_work", "push_working", "review_request", "task_show", "task_close", "events"}},
		{reviewer, []string{"fetch_main", "fetch_review", "review_verdict", "task_show", "events"}},
		{lead, []string{"task_show", "events", "session_launch", "session_list", "session_wait", "session_logs", "session_stop"}},
	} {
		cs := mcpSession(t, h, c.token, dir, nil)
		if v := cs.InitializeResult().ProtocolVersion; v < "2025-06-18" {
			t.Errorf("negotiated protocol version %s, want 2025-06-18 or newer", v)
		}
		slices.Sort(c.want)
		if got := toolNames(t, cs); !slices.Equal(got, c.want) {
			t.Errorf("%s sees tools %v, want %v", filepath.Base(c.token), got, c.want)
		}
		// A tool the grant does not see is not there to call.
		if res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "review_verdict", Arguments: map[string]any{}}); !slices.Contains(c.want, "review_verdict") && err == nil && !res.IsError {
			t.Errorf("%s called review_verdict, which it does not see", filepath.Base(c.token))
		}
	}
	// The host's admin token holds no grant: the server does not start.
	_, stderr, code := h.RunIn(t, dir, []string{"BUS_TOKEN_FILE=" + filepath.Join(h.Home, "admin.token")}, "mcp")
	if code != 4 || !strings.Contains(stderr, "HOST_NOT_A_GRANT") {
		t.Fatalf("bushost mcp with the admin token: exit %d, %s; want 4 and HOST_NOT_A_GRANT", code, stderr)
	}
}

// TestMCPNonFastForward: a push that does not descend from the task's
// latest is a tool error with NON_FAST_FORWARD, and the task's ref stays.
func TestMCPNonFastForward(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	m := newMCPTask(t, h, "t1")
	callOK(t, m.worker, "fetch_main", map[string]any{"repo": "w"})
	first := m.commit(t, "w", "a.txt", "a\n")
	callOK(t, m.worker, "push_working", map[string]any{"repo": "w"})
	callOK(t, m.worker, "fetch_main", map[string]any{"repo": "other"})
	m.commit(t, "other", "b.txt", "b\n")
	r := callRefused(t, m.worker, "push_working", map[string]any{"repo": "other"})
	if r["reason"] != "NON_FAST_FORWARD" || r["code"] == "" || r["message"] == "" {
		t.Fatalf("a diverged push: %v, want NON_FAST_FORWARD with a code and a message", r)
	}
	if md, _ := r["metadata"].(map[string]any); md == nil {
		t.Fatalf("the refusal has no metadata: %v", r)
	}
	if got := testGit(t, h.TaskRepo("acme", "web", "t1"), "rev-parse", "refs/work/t1"); got != first {
		t.Fatalf("refs/work/t1 is %s after the refused push, want %s", got, first)
	}
}

// TestMCPRepoConfined sends repo arguments that leave the server's working
// directory: each is refused, and nothing is made where they point.
func TestMCPRepoConfined(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	m := newMCPTask(t, h, "t1")
	outside := filepath.Join(filepath.Dir(m.workerDir), "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(m.workerDir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(m.workerDir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(m.workerDir, "sub", "deeper")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ repo, reason string }{
		{"../outside/r", "ARGUMENT_INVALID"},
		{"sub/../../outside/r", "ARGUMENT_INVALID"},
		{outside + "/r", "ARGUMENT_INVALID"},
		{"", "ARGUMENT_INVALID"},
		{"link", "PATH_UNSAFE"},
		{"link/r", "PATH_UNSAFE"},
		{"sub/deeper/r", "PATH_UNSAFE"},
		{strings.Repeat("a/", 600), "ARGUMENT_INVALID"},
	} {
		for _, tool := range []string{"fetch_main", "fetch_work", "push_working"} {
			r := callRefused(t, m.worker, tool, map[string]any{"repo": c.repo})
			if r["reason"] != c.reason {
				t.Errorf("%s repo %q: %v, want %s", tool, c.repo, r, c.reason)
			}
		}
	}
	if r := callRefused(t, m.reviewer, "review_verdict", map[string]any{"request": "x", "approve": true, "repo": "../x"}); r["reason"] != "ARGUMENT_INVALID" {
		t.Errorf("review_verdict repo ../x: %v", r)
	}
	// An argument the tool does not have is refused, not ignored.
	if r := callRefused(t, m.worker, "fetch_main", map[string]any{"repo": "w", "home": "/"}); r["reason"] != "USAGE" {
		t.Errorf("fetch_main with an unknown argument: %v, want USAGE", r)
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Fatalf("a refused call left %d entries in %s", len(left), outside)
	}
	if left, _ := os.ReadDir(m.workerDir); len(left) != 2 {
		t.Fatalf("refused calls left %v in the working directory", left)
	}
	// A repo inside, a directory level down, works.
	callOK(t, m.worker, "fetch_main", map[string]any{"repo": "sub/w"})
}

// TestMCPCancelPush cancels a push of a large commit once the server
// reports progress: the call ends, the task's ref does not move, the
// client's temporary files are gone, and the next push goes through.
func TestMCPCancelPush(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	base := baseDir(t)
	dir := filepath.Join(base, "worker")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	token := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	progress := make(chan struct{}, 1)
	cs := mcpSession(t, h, token, dir, &sdk.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) {
			select {
			case progress <- struct{}{}:
			default:
			}
		},
	})
	callOK(t, cs, "fetch_main", map[string]any{"repo": "w"})
	w := filepath.Join(dir, "w")
	big := make([]byte, 96<<20) // random: nothing to compress or delta
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(w, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, w, "add", "big.bin")
	testGit(t, w, "commit", "-q", "-m", "big")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		res *sdk.CallToolResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		p := &sdk.CallToolParams{Name: "push_working", Arguments: map[string]any{"repo": "w"}}
		p.SetProgressToken("push-1")
		res, err := cs.CallTool(ctx, p)
		done <- result{res, err}
	}()
	select {
	case <-progress:
	case r := <-done:
		t.Fatalf("push_working ended before any progress: %v %v", r.err, r.res)
	}
	cancel()
	r := <-done
	if r.err == nil {
		t.Fatalf("the cancelled push_working returned %s, not an error", resultText(r.res))
	}
	// The server has ended the call: its temporary git home is gone.
	testenv.WaitFor(t, time.Minute, "the cancelled push's temporary files to go", func() bool {
		left, _ := os.ReadDir(mcpTemp(t, dir))
		return len(left) == 0
	})
	if _, err := os.Stat(h.TaskRepo("acme", "web", "t1")); err == nil {
		if out, _ := exec.Command("git", "-C", h.TaskRepo("acme", "web", "t1"), "rev-parse", "--verify", "--quiet", "refs/work/t1").Output(); len(out) != 0 {
			t.Fatalf("refs/work/t1 is %s after a cancelled push", out)
		}
	}
	// The server serves on: a small push goes through.
	testGit(t, w, "reset", "-q", "--hard", "HEAD~1")
	if err := os.WriteFile(filepath.Join(w, "small.txt"), []byte("small\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, w, "add", "small.txt")
	testGit(t, w, "commit", "-q", "-m", "small")
	head := testGit(t, w, "rev-parse", "HEAD")
	if got := callOK(t, cs, "push_working", map[string]any{"repo": "w"})["commit"]; got != head {
		t.Fatalf("push_working after the cancel returned %v, want %s", got, head)
	}
}

// TestMCPInSandbox runs `bushost mcp` as a session of `sandbox run`, with
// no flag: the session's environment gives the home and the token, and
// the tools work on the session's workspace.
func TestMCPInSandbox(t *testing.T) {
	testenv.NeedRoot(t, "sandbox run starts the session as nobody, with a group that opens the bus host's sockets")
	s := newSessionHost(t, "git.push.working", "review.request")
	cmd := exec.Command(bin(t, "sandbox"), append(append([]string{"run"}, s.flags...), "--", "bushost", "mcp")...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	c := sdk.NewClient(&sdk.Implementation{Name: "bushost-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, &sdk.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to bushost mcp in the session: %v\nstderr: %s", err, stderr.String())
	}
	names := toolNames(t, cs)
	if !slices.Contains(names, "push_working") || slices.Contains(names, "review_verdict") {
		t.Errorf("the session's tools: %v", names)
	}
	main := callOK(t, cs, "fetch_main", map[string]any{"repo": "repo"})["commit"]
	if shown := callOK(t, cs, "task_show", nil); shown["task"] != "t1" {
		t.Errorf("task_show in the session: %v", shown)
	}
	if err := cs.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	if got := testGit(t, filepath.Join(s.ws, "repo"), "-c", "safe.directory=*", "rev-parse", "refs/remotes/bushost/main"); got != main {
		t.Fatalf("the workspace's refs/remotes/bushost/main is %s, want main %v", got, main)
	}
	if strings.Contains(stderr.String(), raceReport) {
		t.Errorf("a data race in the session:\n%s", stderr.String())
	}
}
