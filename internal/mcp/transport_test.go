package mcp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/bushost/bushost/internal/authz"
)

// rawClient speaks to a server over the stdio transport line by line, as
// a hostile client would: no SDK between the test and the server's input.
type rawClient struct {
	t    *testing.T
	in   *io.PipeWriter
	out  *bufio.Reader
	done chan error
}

// serveRaw runs the server of grant g on pipes, and initializes it.
func serveRaw(t *testing.T, r Runner, g Grant) *rawClient {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &rawClient{t: t, in: inW, out: bufio.NewReaderSize(outR, 1<<20), done: make(chan error, 1)}
	go func() {
		err := NewServer(r, g, t.TempDir(), "test").Run(context.Background(), &stdio{in: inR, out: outW})
		outW.CloseWithError(io.EOF)
		c.done <- err
	}()
	t.Cleanup(func() {
		inW.Close()
		outR.Close()
	})
	c.send(`{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if m := c.reply("init"); m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	c.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return c
}

func (c *rawClient) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		c.t.Fatalf("write to the server: %v", err)
	}
}

// next reads the server's next message.
func (c *rawClient) next() map[string]any {
	c.t.Helper()
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		c.t.Fatalf("read from the server: %v (read %q)", err, line)
	}
	m := map[string]any{}
	if err := json.Unmarshal(line, &m); err != nil {
		c.t.Fatalf("the server wrote a line that is not JSON: %q", line)
	}
	return m
}

// response reads up to the next response, skipping notifications.
func (c *rawClient) response() map[string]any {
	c.t.Helper()
	for {
		if m := c.next(); m["id"] != nil || m["error"] != nil || m["result"] != nil {
			return m
		}
	}
}

// reply reads the next response, which must be to id (nil: id null).
func (c *rawClient) reply(id any) map[string]any {
	c.t.Helper()
	m := c.response()
	if m["id"] != id {
		c.t.Fatalf("a response to %v, want one to %v: %v", m["id"], id, m)
	}
	return m
}

// end closes the server's input and waits for it to end.
func (c *rawClient) end() {
	c.t.Helper()
	c.in.Close()
	if err := <-c.done; err != nil && !errors.Is(err, io.EOF) {
		c.t.Errorf("the server ended with %v", err)
	}
}

func errorCode(m map[string]any) float64 {
	e, _ := m["error"].(map[string]any)
	code, _ := e["code"].(float64)
	return code
}

// TestMalformedLinesAnswered sends lines that are not JSON-RPC messages:
// each is answered with the JSON-RPC error the spec gives (-32700 for a
// line that is not JSON, -32600 for one that is not a message), with id
// null unless the line had a usable one; the session goes on, runs no
// command for them, and ends cleanly when the input does.
func TestMalformedLinesAnswered(t *testing.T) {
	r := &recorder{reply: "{}"}
	c := serveRaw(t, r, Grant{})
	for _, bad := range []struct {
		line string
		code float64
		id   any
	}{
		{"{not json", jsonrpc.CodeParseError, nil},
		{"\x00\xff\x1b[2J", jsonrpc.CodeParseError, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"`, jsonrpc.CodeParseError, nil},
		{strings.Repeat("[", 2000) + strings.Repeat("]", 2000), jsonrpc.CodeInvalidRequest, nil},
		{`[{"jsonrpc":"2.0","id":8,"method":"ping"}]`, jsonrpc.CodeInvalidRequest, nil},
		{`[]`, jsonrpc.CodeInvalidRequest, nil},
		{`{"jsonrpc":"2.0","id":5,"method":"ping","params":` + strings.Repeat(`{"a":`, 1100) + "1" + strings.Repeat("}", 1100) + "}", jsonrpc.CodeInvalidRequest, 5.0},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}`, jsonrpc.CodeInvalidRequest, nil},
		{`{"jsonrpc":"2.0","id":[1],"method":"tools/list"}`, jsonrpc.CodeInvalidRequest, nil},
		{`{"jsonrpc":"1.0","id":7,"method":"tools/list"}`, jsonrpc.CodeInvalidRequest, 7.0},
		{`{"id":"s","method":"tools/list"}`, jsonrpc.CodeInvalidRequest, "s"},
		{`{"jsonrpc":"2.0"}`, jsonrpc.CodeInvalidRequest, nil},
		{`"a string"`, jsonrpc.CodeInvalidRequest, nil},
		{`null`, jsonrpc.CodeInvalidRequest, nil},
		{`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"task_show","arguments":{"x":"` + strings.Repeat("x", maxLine) + `"}}}`, jsonrpc.CodeInvalidRequest, nil},
	} {
		c.send(bad.line)
		m := c.reply(bad.id)
		if errorCode(m) != bad.code {
			t.Errorf("%.40q: %v, want the error %v", bad.line, m, bad.code)
		}
		if e, _ := m["error"].(map[string]any); e == nil || !strings.Contains(fmt.Sprint(e["message"]), "JSON") && !strings.Contains(fmt.Sprint(e["message"]), "line") {
			t.Errorf("%.40q: the error does not say what to send: %v", bad.line, m)
		}
	}
	// A blank line is no message and gets no answer; a response to no
	// request is dropped. The session serves on.
	c.send("")
	c.send(`{"jsonrpc":"2.0","id":99,"result":{}}`)
	c.send(`{"jsonrpc":"2.0","id":10,"method":"tools/list"}`)
	if m := c.reply(10.0); m["result"] == nil {
		t.Fatalf("tools/list after the bad lines: %v", m)
	}
	c.send(`{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"task_show","arguments":{}}}`)
	if m := c.reply(11.0); m["result"] == nil {
		t.Fatalf("task_show after the bad lines: %v", m)
	}
	c.end()
	if len(r.ran) != 1 {
		t.Fatalf("ran %q, want task_show alone", r.ran)
	}
}

// gate is a Runner whose commands run until released (or cancelled); it
// counts them.
type gate struct {
	ran     atomic.Int32
	entered chan string
	release chan struct{}
}

func (g *gate) Whoami(context.Context) (Grant, error) { return Grant{}, nil }

func (g *gate) Run(ctx context.Context, words string, _ []Flag, _ []string, out, _ io.Writer) error {
	g.ran.Add(1)
	g.entered <- words
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	_, err := io.WriteString(out, "{}")
	return err
}

// TestCallsBounded sends more tool calls at once than the server runs:
// maxCalls run, the next waits and says so in its progress, a cancel ends
// it without it ever running (CANCELED), an id still in use is refused,
// and the calls that ran all finish once released; then the slots are
// free again.
func TestCallsBounded(t *testing.T) {
	g := &gate{entered: make(chan string, 2*maxCalls), release: make(chan struct{})}
	c := serveRaw(t, g, Grant{Caps: []string{authz.CapPushWorking}})
	call := func(id int, meta string) {
		c.send(fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"task_show","arguments":{}%s}}`, id, meta))
	}
	for id := 1; id <= maxCalls; id++ {
		call(id, "")
	}
	for range maxCalls {
		select {
		case <-g.entered:
		case <-time.After(time.Minute):
			t.Fatalf("%d calls did not all start", maxCalls)
		}
	}
	waiting := maxCalls + 1
	call(waiting, `,"_meta":{"progressToken":"w"}`)
	for {
		m := c.next()
		if _, ok := m["id"]; ok {
			t.Fatalf("a response while the calls run: %v", m)
		}
		p, _ := m["params"].(map[string]any)
		if m["method"] == "notifications/progress" && p["progressToken"] == "w" {
			if !strings.Contains(fmt.Sprint(p["message"]), "waiting") {
				t.Fatalf("the call past the bound: progress %v, want it waiting", p)
			}
			break
		}
	}
	if n := g.ran.Load(); n != maxCalls {
		t.Fatalf("%d commands run, want %d", n, maxCalls)
	}
	// An id in use is refused by the transport, not run.
	call(1, "")
	if m := c.reply(1.0); errorCode(m) != jsonrpc.CodeInvalidRequest {
		t.Fatalf("a second request with id 1: %v, want -32600", m)
	}
	c.send(fmt.Sprintf(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":%d}}`, waiting))
	m := c.reply(float64(waiting))
	res, _ := m["result"].(map[string]any)
	sc, _ := res["structuredContent"].(map[string]any)
	if res["isError"] != true || sc["reason"] != "CANCELED" {
		t.Fatalf("the cancelled waiting call: %v, want isError CANCELED", m)
	}
	close(g.release)
	done := map[any]bool{}
	for range maxCalls {
		m := c.response()
		if res, _ := m["result"].(map[string]any); res == nil || res["isError"] == true {
			t.Fatalf("a released call: %v", m)
		}
		done[m["id"]] = true
	}
	if len(done) != maxCalls {
		t.Fatalf("the released calls answered %v", done)
	}
	if n := g.ran.Load(); n != maxCalls {
		t.Fatalf("%d commands run, want %d: the cancelled call ran", n, maxCalls)
	}
	// The slots are free: maxCalls calls run at once again.
	for id := 10; id < 10+maxCalls; id++ {
		call(id, "")
	}
	for range maxCalls {
		if m := c.response(); m["result"] == nil {
			t.Fatalf("a call after the others ended: %v", m)
		}
	}
	c.end()
}

type discard struct{ io.Writer }

func (discard) Close() error { return nil }

// TestUnansweredBounded: past maxUnanswered requests read and not answered
// the transport takes no more (a request waits for an answer; with its
// context ended it is not taken), and an answer makes room again.
func TestUnansweredBounded(t *testing.T) {
	c := &lineConn{in: io.NopCloser(strings.NewReader("")), out: discard{io.Discard}, lines: make(chan line), closed: make(chan struct{}),
		freed: make(chan struct{}, 1), unanswered: map[jsonrpc.ID]bool{}}
	defer c.Close()
	id := func(n int) jsonrpc.ID {
		v, err := jsonrpc.MakeID(float64(n))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	ctx := context.Background()
	for n := range maxUnanswered {
		if err := c.admit(ctx, id(n)); err != nil {
			t.Fatalf("request %d: %v", n, err)
		}
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.admit(ended, id(maxUnanswered)); !errors.Is(err, context.Canceled) {
		t.Fatalf("request %d past the bound was taken: %v", maxUnanswered, err)
	}
	if err := c.admit(ctx, id(3)); !errors.Is(err, errIDInUse) {
		t.Fatalf("an id in use: %v", err)
	}
	if err := c.Write(ctx, &jsonrpc.Response{ID: id(3), Result: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := c.admit(ended, id(maxUnanswered)); err != nil {
		t.Fatalf("after an answer: %v", err)
	}
	if len(c.unanswered) != maxUnanswered {
		t.Fatalf("%d unanswered, want %d", len(c.unanswered), maxUnanswered)
	}
}
