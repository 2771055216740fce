package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bushost/bushost/internal/treesnap"
)

// hostileText holds what a terminal must never get raw: an OSC that
// retitles the window, a CSI that clears the screen, a C1 CSI, and a
// right-to-left override.
const hostileText = "x\x1b]0;pwned\x07\x1b[2J\u009b31m\u202ey"

// rawControl reports the first control character of s a terminal would
// act on (as internal/textsafe has them; newline and tab only break
// lines), or 0.
func rawControl(s string) rune {
	for _, r := range s {
		switch {
		case r == '\n' || r == '\t':
		case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f,
			r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return r
		}
	}
	return 0
}

// noRawControl fails the test when a call's result, its text or any
// string of its structured content, carries a raw control character.
func noRawControl(t *testing.T, what string, res *sdk.CallToolResult) {
	t.Helper()
	if r := rawControl(resultText(res)); r != 0 {
		t.Errorf("%s: the text holds the raw control %U: %q", what, r, resultText(res))
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			if r := rawControl(v); r != 0 {
				t.Errorf("%s: the structured content holds the raw control %U: %q", what, r, v)
			}
		case map[string]any:
			for k, x := range v {
				walk(k)
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	walk(v)
}

// TestMCPEscapesHostileText: a reviewer's comment full of terminal
// controls, kept in the log, reaches the worker through task_show and
// events; and a refusal's message that quotes a hostile argument. No
// control reaches the client raw, in the text or in the structured
// content, as the CLI prints none.
func TestMCPEscapesHostileText(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	m := newMCPTask(t, h, "t1")
	req := m.request(t)
	callOK(t, m.reviewer, "fetch_review", map[string]any{"repo": "r"})
	v, err := m.reviewer.CallTool(context.Background(), &sdk.CallToolParams{Name: "review_verdict",
		Arguments: map[string]any{"request": req["request_id"], "approve": false, "comment": hostileText, "repo": "r"}})
	if err != nil || v.IsError {
		t.Fatalf("review_verdict: %v %s", err, resultText(v))
	}
	for _, c := range []struct {
		cs   *sdk.ClientSession
		name string
		args map[string]any
	}{
		{m.worker, "task_show", nil},
		{m.worker, "events", map[string]any{"since": 0}},
		{m.reviewer, "review_verdict", map[string]any{"request": hostileText, "approve": true, "repo": "r"}},
		{m.worker, "fetch_main", map[string]any{"repo": hostileText}},
	} {
		res, err := c.cs.CallTool(context.Background(), &sdk.CallToolParams{Name: c.name, Arguments: c.args})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%s: %q", c.name, resultText(res))
		noRawControl(t, c.name, res)
	}
	// The comment is still there to read, escaped as the CLI prints it.
	res, _ := m.worker.CallTool(context.Background(), &sdk.CallToolParams{Name: "task_show"})
	if !strings.Contains(resultText(res), `\u001b]0;pwned`) {
		t.Errorf("task_show lost the comment: %s", resultText(res))
	}
}

// rawMCP is `bushost mcp` in dir spoken to line by line, as a hostile
// client would: no SDK between the test and the server's stdin.
type rawMCP struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	errb *syncBuf
}

func startRawMCP(t *testing.T, h *Host, token, dir string) *rawMCP {
	t.Helper()
	cmd := exec.Command(h.client, "mcp")
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "BUSHOST_HOME="+h.Home, "BUS_TOKEN_FILE="+token, "TMPDIR="+mcpTemp(t, dir))
	r := &rawMCP{cmd: cmd, errb: &syncBuf{}}
	cmd.Stderr = r.errb
	var err error
	if r.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.out = bufio.NewReaderSize(out, 1<<20)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	r.send(t, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`+"\n")
	if m := r.reply(t); m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	r.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
	return r
}

func (r *rawMCP) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(r.in, line); err != nil {
		t.Fatalf("write to bushost mcp: %v\nstderr: %s", err, r.errb.String())
	}
}

// reply reads the next message with an id (a response), skipping
// notifications.
func (r *rawMCP) reply(t *testing.T) map[string]any {
	t.Helper()
	for {
		line, err := r.out.ReadBytes('\n')
		if err != nil {
			t.Fatalf("read from bushost mcp: %v (read %q)\nstderr: %s", err, line, r.errb.String())
		}
		m := map[string]any{}
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("bushost mcp wrote a line that is not JSON: %q", line)
		}
		if _, ok := m["id"]; ok {
			return m
		}
	}
}

// call sends one tools/call with the raw arguments JSON and returns the
// response.
func (r *rawMCP) call(t *testing.T, id int, name, args string) map[string]any {
	t.Helper()
	r.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`+"\n", id, name, args))
	m := r.reply(t)
	if m["id"] != float64(id) {
		t.Fatalf("call %d: the reply is to %v: %v", id, m["id"], m)
	}
	return m
}

// TestMCPHostileClient speaks raw JSON-RPC to a worker's server: hidden
// tools by name, arguments of the wrong type, flag-like values, NUL,
// huge strings and deep nesting are each refused (a protocol error for an
// unknown tool, a tool error with USAGE or ARGUMENT_INVALID for bad
// arguments), the server serves on, a flood of calls is answered call by
// call, and nothing is made in its working directory; a last request with no newline before EOF is answered and the
// server exits 0, leaving no temporary file; a line that is not JSON-RPC
// is answered with a JSON-RPC error and the session goes on.
func TestMCPHostileClient(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	dir := filepath.Join(baseDir(t), "worker")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "afile"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	token := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	r := startRawMCP(t, h, token, dir)

	// Hidden tools: a protocol error (no such tool), never a result.
	for i, name := range []string{"review_verdict", "session_launch", "task_land", "task_close", "fetch_review", "Fetch_Main", "fetch_main ", ""} {
		m := r.call(t, 100+i, name, `{"repo":"w","request":"r","approve":true,"task":"t1","role":"worker","caps":[],"command":["true"]}`)
		if m["error"] == nil {
			t.Errorf("hidden tool %q answered %v, want a protocol error", name, m)
		}
	}
	deep := strings.Repeat(`{"a":`, 900) + "1" + strings.Repeat("}", 900)
	for i, c := range []struct{ name, args, reason string }{
		{"fetch_main", `{"repo":123}`, "USAGE"},
		{"fetch_main", `{"repo":["w"]}`, "USAGE"},
		{"fetch_main", `{"repo":{"$ref":"#"}}`, "USAGE"},
		{"fetch_main", `{"repo":null}`, "USAGE"},
		{"fetch_main", `{}`, "USAGE"},
		{"fetch_main", `{"repo":"w","repo":"../x"}`, "ARGUMENT_INVALID"},
		{"fetch_main", `{"repo":"a\u0000b"}`, "ARGUMENT_INVALID"},
		{"fetch_main", `{"repo":"afile"}`, "PATH_UNSAFE"},
		{"fetch_main", `{"repo":"afile/w"}`, "PATH_UNSAFE"},
		{"fetch_main", `{"repo":"/etc"}`, "ARGUMENT_INVALID"},
		{"fetch_main", `{"repo":"` + strings.Repeat("w", 200<<10) + `"}`, "ARGUMENT_INVALID"},
		{"fetch_main", `{"repo":"` + strings.Repeat("w", 300<<10) + `"}`, "USAGE"},
		{"fetch_main", `{"repo":"w","x":` + deep + `}`, "USAGE"},
		{"push_working", `{"repo":"w","--home":"/"}`, "USAGE"},
		{"events", `{"since":-1}`, "USAGE"},
		{"events", `{"since":1.5}`, "USAGE"},
		{"events", `{"since":"1"}`, "USAGE"},
		{"events", `{"since":1e300}`, "USAGE"},
		{"task_show", `{"task":"t2"}`, "USAGE"},
		{"task_show", `[1,2]`, "USAGE"},
	} {
		m := r.call(t, 200+i, c.name, c.args)
		res, _ := m["result"].(map[string]any)
		if res == nil || res["isError"] != true {
			t.Errorf("%s %.80s: %v, want a tool error", c.name, c.args, m)
			continue
		}
		if sc, _ := res["structuredContent"].(map[string]any); sc == nil || sc["reason"] != c.reason {
			t.Errorf("%s %.80s: %v, want %s", c.name, c.args, res["structuredContent"], c.reason)
		}
	}
	// An unknown method is a protocol error, and the server serves on.
	r.send(t, `{"jsonrpc":"2.0","id":300,"method":"no/such/method"}`+"\n")
	for {
		m := r.reply(t)
		if m["id"] == float64(300) {
			if m["error"] == nil {
				t.Errorf("an unknown method: %v, want a protocol error", m)
			}
			break
		}
	}
	// A flood of calls sent at once, without waiting for answers: the
	// server runs a few at a time, reads on as it answers, and answers
	// each.
	const flood = 3 * 32
	sent := make(chan error, 1)
	go func() {
		var b strings.Builder
		for i := range flood {
			fmt.Fprintf(&b, `{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"task_show","arguments":{}}}`+"\n", 1000+i)
		}
		_, err := io.WriteString(r.in, b.String())
		sent <- err
	}()
	answered := map[float64]bool{}
	for range flood {
		m := r.reply(t)
		if res, _ := m["result"].(map[string]any); res == nil || res["isError"] == true {
			t.Fatalf("a call of the flood: %v", m)
		}
		answered[m["id"].(float64)] = true
	}
	if err := <-sent; err != nil || len(answered) != flood {
		t.Fatalf("the flood: %v, %d answered, want %d", err, len(answered), flood)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Errorf("refused calls left %v in the working directory", left)
	}
	// The last request with no newline, then EOF: closing stdin is the
	// stdio transport's shutdown, so the call in flight may go unanswered,
	// but the server exits 0 and leaves nothing behind.
	r.send(t, `{"jsonrpc":"2.0","id":301,"method":"tools/call","params":{"name":"events","arguments":{}}}`)
	r.in.Close()
	rest, _ := io.ReadAll(r.out)
	t.Logf("after EOF the server wrote %q", rest)
	if err := r.cmd.Wait(); err != nil {
		t.Errorf("bushost mcp after EOF: %v\nstderr: %s", err, r.errb.String())
	}
	if left, _ := os.ReadDir(mcpTemp(t, dir)); len(left) != 0 {
		t.Errorf("the server left %d temporary files", len(left))
	}
	if strings.Contains(r.errb.String(), raceReport) {
		t.Errorf("data race:\n%s", r.errb.String())
	}

	// A line that is not JSON-RPC (not JSON, nested deeper than the SDK
	// decodes, an id that is an object) is answered with the JSON-RPC
	// error the spec gives, id null, and the session goes on; at EOF the
	// server exits 0.
	r = startRawMCP(t, h, token, dir)
	for i, bad := range []struct {
		line string
		code float64
	}{
		{"{not json\n", -32700},
		{strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + "\n", -32600},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}` + "\n", -32600},
	} {
		r.send(t, bad.line)
		m := r.reply(t)
		e, _ := m["error"].(map[string]any)
		if m["id"] != nil || e == nil || e["code"] != bad.code {
			t.Errorf("after %.20q: %v, want the error %v with id null", bad.line, m, bad.code)
		}
		if m := r.call(t, 400+i, "events", `{}`); m["result"] == nil {
			t.Errorf("events after %.20q: %v", bad.line, m)
		}
	}
	r.in.Close()
	if err := r.cmd.Wait(); err != nil {
		t.Errorf("bushost mcp after EOF: %v\nstderr: %s", err, r.errb.String())
	}
	if left, _ := os.ReadDir(mcpTemp(t, dir)); len(left) != 0 {
		t.Errorf("the server left %d temporary files", len(left))
	}
}

// TestMCPGitDirOutside: repositories inside the server's working directory
// whose git directory is elsewhere (a .git file naming another repository,
// as a worktree has; a .git link to it; a commondir naming it; a refs
// directory linked into it) are refused
// GIT_DIR_OUTSIDE_REPO by every tool that takes a repo, and the other
// repository is left exactly as it was, as is the bus host's store.
func TestMCPGitDirOutside(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	m := newMCPTask(t, h, "t1")
	// The task has a push, so fetch_work and fetch_review have one to write.
	req := m.request(t)

	other := filepath.Join(filepath.Dir(m.workerDir), "other")
	testGit(t, filepath.Dir(other), "init", "-q", other)
	if err := os.WriteFile(filepath.Join(other, "o.txt"), []byte("o\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, other, "add", "o.txt")
	testGit(t, other, "commit", "-q", "-m", "other")
	for _, dir := range []string{m.workerDir, m.reviewerDir} {
		for _, r := range []string{"pointer", "linked", "common"} {
			if err := os.MkdirAll(filepath.Join(dir, r), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		mustWrite(t, filepath.Join(dir, "pointer", ".git"), "gitdir: "+filepath.Join(other, ".git")+"\n", 0o644)
		if err := os.Symlink(filepath.Join(other, ".git"), filepath.Join(dir, "linked", ".git")); err != nil {
			t.Fatal(err)
		}
		testGit(t, dir, "init", "-q", "common")
		mustWrite(t, filepath.Join(dir, "common", ".git", "commondir"), filepath.Join(other, ".git")+"\n", 0o644)
		// fetch_main would write refs/remotes/bushost/main into other.
		testGit(t, dir, "init", "-q", "refs")
		if err := os.Symlink(filepath.Join(other, ".git", "refs", "heads"), filepath.Join(dir, "refs", ".git", "refs", "remotes")); err != nil {
			t.Fatal(err)
		}
	}
	before := treesnap.Take(t, other)
	store := storeSnapshot(t, h)
	for _, r := range []string{"pointer", "linked", "common", "refs"} {
		for _, c := range []struct {
			cs   *sdk.ClientSession
			tool string
			args map[string]any
		}{
			{m.worker, "fetch_main", map[string]any{"repo": r}},
			{m.worker, "fetch_work", map[string]any{"repo": r}},
			{m.worker, "push_working", map[string]any{"repo": r}},
			{m.reviewer, "fetch_main", map[string]any{"repo": r}},
			{m.reviewer, "fetch_review", map[string]any{"repo": r}},
			{m.reviewer, "review_verdict", map[string]any{"request": req["request_id"], "approve": true, "repo": r}},
		} {
			if got := callRefused(t, c.cs, c.tool, c.args); got["reason"] != "GIT_DIR_OUTSIDE_REPO" {
				t.Errorf("%s repo %s: %v, want GIT_DIR_OUTSIDE_REPO", c.tool, r, got)
			}
		}
	}
	if d := treesnap.Diff(before, treesnap.Take(t, other)); d != "" {
		t.Errorf("the refused calls changed the other repository:\n%s", d)
	}
	if d := treesnap.Diff(store, storeSnapshot(t, h)); d != "" {
		t.Errorf("the refused calls changed the bus host's store:\n%s", d)
	}
	if s := callOK(t, m.worker, "task_show", nil); s["state"] == "closed" {
		t.Errorf("task_show: %v", s)
	}
	for _, dir := range []string{m.workerDir, m.reviewerDir} {
		if left, _ := os.ReadDir(mcpTemp(t, dir)); len(left) != 0 {
			t.Errorf("the refused calls left %d temporary files", len(left))
		}
	}
}
