package mcp

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// recorder is a Runner that records the commands it is asked to run and
// answers each with reply (or fails with err).
type recorder struct {
	ran   []string
	reply string
	err   error
}

func (r *recorder) Whoami(context.Context) (Grant, error) { return Grant{}, nil }

func (r *recorder) Run(_ context.Context, words string, flags []Flag, args []string, out, warn io.Writer) error {
	line := words
	for _, f := range flags {
		line += " --" + f.Name + "=" + f.Value
	}
	r.ran = append(r.ran, strings.Join(append([]string{line}, args...), " "))
	if r.err != nil {
		return r.err
	}
	_, err := io.WriteString(out, r.reply)
	return err
}

func connect(t *testing.T, r Runner, g Grant) *sdk.ClientSession {
	t.Helper()
	ct, st := sdk.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := NewServer(r, g, t.TempDir(), "test").Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func refusedWith(t *testing.T, cs *sdk.ClientSession, name string, args any) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: a protocol error: %v", name, err)
	}
	if !res.IsError {
		t.Fatalf("%s %v was not refused", name, args)
	}
	b, _ := json.Marshal(res.StructuredContent)
	out := map[string]any{}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestArgumentsRefused sends review_verdict and session_launch the
// arguments a careless or hostile client would: each is refused USAGE and
// no command runs.
func TestArgumentsRefused(t *testing.T) {
	r := &recorder{reply: "{}"}
	cs := connect(t, r, Grant{Caps: []string{authz.CapReviewVerdict, authz.CapSessionLaunch}})
	for _, c := range []struct {
		tool string
		args any
	}{
		{"review_verdict", map[string]any{"request": "r1", "repo": "r"}},                                 // no approve: never a reject by default
		{"review_verdict", map[string]any{"request": "r1", "approve": "yes", "repo": "r"}},               // a string for a bool
		{"review_verdict", map[string]any{"request": "r1", "approve": true, "repo": "r", "commit": "x"}}, // not an argument
		{"review_verdict", map[string]any{"request": strings.Repeat("x", maxArguments), "approve": true, "repo": "r"}},
		{"session_launch", map[string]any{"task": "t", "role": "w", "caps": []string{"git.push.working"}, "command": []string{"true"}, "limits": map[string]string{"workspace": "/"}}},
		{"session_launch", map[string]any{"task": "t", "role": "w", "caps": []string{"git.push.working"}, "command": []string{}}},
		{"session_wait", map[string]any{"id": " "}},
	} {
		if got := refusedWith(t, cs, c.tool, c.args); got["reason"] != string(errdefs.Usage) {
			t.Errorf("%s %v: %v, want USAGE", c.tool, c.args, got)
		}
	}
	if len(r.ran) != 0 {
		t.Fatalf("refused calls ran %q", r.ran)
	}
	// A limit is passed as its own flag, nothing else.
	if _, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "session_launch", Arguments: map[string]any{
		"task": "t", "role": "w", "caps": []string{"a", "b"}, "command": []string{"sh", "-c", "--x"}, "limits": map[string]string{"memory": "1G"}}}); err != nil {
		t.Fatal(err)
	}
	if want := "session launch --task=t --role=w --caps=a,b --memory=1G sh -c --x"; len(r.ran) != 1 || r.ran[0] != want {
		t.Fatalf("ran %q, want %q", r.ran, want)
	}
}

// TestRefusalShape: a command's refusal is isError with the message as
// text and code, reason, message and metadata as structured content.
func TestRefusalShape(t *testing.T) {
	r := &recorder{err: errdefs.FailedPrecondition(errdefs.NonFastForward, "not a fast-forward of %s: run fetch-work", "abc").With("previous", "abc")}
	cs := connect(t, r, Grant{Caps: []string{authz.CapPushWorking}})
	got := refusedWith(t, cs, "push_working", map[string]any{"repo": "w"})
	md, _ := got["metadata"].(map[string]any)
	if got["reason"] != "NON_FAST_FORWARD" || got["code"] != "FailedPrecondition" || !strings.Contains(got["message"].(string), "fetch-work") || md["previous"] != "abc" {
		t.Fatalf("refusal: %v", got)
	}
}
