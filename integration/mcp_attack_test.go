package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
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
	callOK(t, m.worker, "fetch_main", map[string]any{"repo": "w"})
	m.commit(t, "w", "a.txt", "a\n")
	callOK(t, m.worker, "push_working", map[string]any{"repo": "w"})
	req := callOK(t, m.worker, "review_request", nil)
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
