// Package mcp serves a session's bushost commands as tools over the Model
// Context Protocol (docs/mcp.md): `bushost mcp` speaks newline-delimited
// JSON-RPC on stdin and stdout (the protocol's stdio transport, built on
// github.com/modelcontextprotocol/go-sdk), so that any agent harness calls
// fetch_main, push_working, review_verdict ... as tools instead of running
// bushost in a shell and parsing its text.
//
// Each tool runs the CLI command of the same name in process (the Runner,
// which internal/cli provides), so a tool does and refuses exactly what the
// command does. The tools listed are those the token's grant may use: a
// worker never sees a verdict tool, a reviewer never a push tool. A refusal
// is a tool result with isError set, the CLI's message as its text, and
// {code, reason, message, metadata} as its structured content.
package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/textsafe"
)

// Grant is what the server learns of its token once, at start: which
// tools to list.
type Grant struct {
	Caps []string
}

// Flag is one of a command's flags, set as `--Name=Value` would set it.
type Flag struct{ Name, Value string }

// Runner runs the CLI's commands in process, with the home, token and
// timeouts the server was started with.
type Runner interface {
	// Whoami asks the broker for the token's grant.
	Whoami(ctx context.Context) (Grant, error)
	// Run runs the command named by words (as `bushost --json WORDS`
	// would, with flags and the positional args) writing its JSON output
	// to out and its warnings to warn. Its error is the one the CLI
	// prints.
	Run(ctx context.Context, words string, flags []Flag, args []string, out, warn io.Writer) error
}

// maxArguments bounds one call's arguments, in bytes of JSON.
const maxArguments = 256 << 10

// maxOutput bounds what one call returns, in bytes of JSON: events stops
// there and says there are more.
const maxOutput = 4 << 20

// maxCalls bounds the tool calls that run at once, each a command in this
// process. A call past it waits for one to end (saying so in its progress
// notifications), until the client cancels it. With maxUnanswered and
// maxLine (transport.go) this bounds what the calls hold together: at most
// maxCalls commands, each with at most maxOutput bytes of output and as
// many of warnings, and at most maxUnanswered requests of at most maxLine
// bytes each.
const maxCalls = 4

// Serve runs the server on in and out until the client closes in or ctx
// ends. It asks the broker for the grant once, first: a token the broker
// refuses, or the host's admin token (which holds no grant:
// HOST_NOT_A_GRANT), fails here with the CLI's message.
func Serve(ctx context.Context, r Runner, in io.ReadCloser, out io.WriteCloser, version string) error {
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	g, err := r.Whoami(ctx)
	if err != nil {
		return err
	}
	s := NewServer(r, g, root, version)
	err = s.Run(ctx, &stdio{in: in, out: out})
	if err == nil || errors.Is(err, io.EOF) || ctx.Err() != nil {
		return nil
	}
	return err
}

// server is what every tool's handler shares.
type server struct {
	r     Runner
	root  string        // the working directory repo arguments are relative to
	slots chan struct{} // one token a call running, at most maxCalls
}

// NewServer returns the MCP server for grant g: the tools g may use,
// their repo arguments confined to root.
func NewServer(r Runner, g Grant, root, version string) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: "bushost", Title: "bushost: the gated git workflow of a bus host", Version: version}, &sdk.ServerOptions{
		Instructions: "The tools of a bushost session (docs/mcp.md): fetch_main, commit in the repo, push_working, review_request; " +
			"a reviewer fetch_review then review_verdict; task_close or task_land once the latest push is approved. " +
			"A refusal's structured content has a reason (NON_FAST_FORWARD, GATE_NO_APPROVAL, ...) and its text says what to do.",
	})
	sv := &server{r: r, root: root, slots: make(chan struct{}, maxCalls)}
	for _, t := range tools() {
		if len(t.caps) == 0 || slices.ContainsFunc(t.caps, func(c string) bool { return slices.Contains(g.Caps, c) }) {
			t.add(s, sv)
		}
	}
	return s
}

// tool is one tool: who may see it, and how it is added.
type tool struct {
	// caps: a grant holding any of them sees the tool; none: every grant
	// does.
	caps []string
	add  func(*sdk.Server, *server)
}

// kind is what a tool's annotations say it does.
type kind int

const (
	readOnly    kind = iota // changes nothing anywhere
	local                   // writes only the repo it is given
	additive                // records something; nothing is undone
	destructive             // ends or replaces something
)

func annotations(k kind, idempotent bool) *sdk.ToolAnnotations {
	a := &sdk.ToolAnnotations{OpenWorldHint: new(false), IdempotentHint: idempotent}
	if k == readOnly {
		a.ReadOnlyHint = true
	} else {
		a.DestructiveHint = new(k == destructive)
	}
	return a
}

// define makes a tool whose handler decodes In strictly, runs fn, and
// returns Out as its structured content; a refusal becomes an isError
// result (refusal). Its output schema admits Out or a refusal's fields.
func define[In, Out any](name, desc string, k kind, idempotent bool, caps []string,
	fn func(ctx context.Context, sv *server, call *call, in In) (Out, error)) tool {
	in := must[*jsonschema.Schema](name, "input")(jsonschema.For[In](nil))
	// Every argument must be known: a misspelt one is refused, not ignored.
	in.AdditionalProperties = &jsonschema.Schema{Not: &jsonschema.Schema{}}
	check := must[*jsonschema.Resolved](name, "input")(in.Resolve(nil))
	out := must[*jsonschema.Schema](name, "output")(jsonschema.For[Out](nil))
	refused := must[*jsonschema.Schema](name, "output")(jsonschema.For[refusalJSON](nil))
	def := &sdk.Tool{Name: name, Description: desc, InputSchema: in,
		OutputSchema: &jsonschema.Schema{Type: "object", AnyOf: []*jsonschema.Schema{out, refused}},
		Annotations:  annotations(k, idempotent)}
	return tool{caps: caps, add: func(s *sdk.Server, sv *server) {
		s.AddTool(def, func(ctx context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			var v In
			if err := decodeArgs(name, check, req.Params.Arguments, &v); err != nil {
				return refusal(err), nil
			}
			c := &call{req: req}
			end, err := sv.begin(ctx, c, name)
			if err != nil {
				return refusal(err), nil
			}
			o, err := fn(ctx, sv, c, v)
			end()
			if err != nil {
				return refusal(err), nil
			}
			b, err := safeJSON(o)
			if err != nil {
				return nil, fmt.Errorf("%s: encode the result: %w", name, err)
			}
			return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}, nil
		})
	}}
}

// must returns a tool's schema, or panics naming the tool: the schemas
// are made from this package's types, so an error is a bug here.
func must[T any](tool, which string) func(T, error) T {
	return func(v T, err error) T {
		if err != nil {
			panic(fmt.Sprintf("mcp: tool %s: %s schema: %v", tool, which, err))
		}
		return v
	}
}

// decodeArgs decodes a call's arguments into v: at most maxArguments
// bytes, one JSON object valid against the tool's input schema (each
// required argument there, each of its type, none the tool does not have).
func decodeArgs(tool string, schema *jsonschema.Resolved, raw json.RawMessage, v any) error {
	if len(raw) > maxArguments {
		return errdefs.InvalidArgument(errdefs.Usage, "%s: the arguments are %d bytes, over the limit of %d", tool, len(raw), maxArguments).With("limit", fmt.Sprint(maxArguments))
	}
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = []byte("{}")
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return errdefs.InvalidArgument(errdefs.Usage, "%s: arguments: want one JSON object: %v", tool, err)
	}
	if err := schema.Validate(obj); err != nil {
		return errdefs.InvalidArgument(errdefs.Usage, "%s: arguments: %v (tools/list gives each tool's input schema)", tool, err)
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return errdefs.InvalidArgument(errdefs.Usage, "%s: arguments: %v (tools/list gives each tool's input schema)", tool, err)
	}
	if d.More() {
		return errdefs.InvalidArgument(errdefs.Usage, "%s: arguments: one JSON object, nothing after it", tool)
	}
	return nil
}

// refusalJSON is a refusal's structured content.
type refusalJSON struct {
	Code     string            `json:"code" jsonschema:"the error's kind: FailedPrecondition, PermissionDenied, ... (docs/errors.md)"`
	Reason   string            `json:"reason" jsonschema:"what was refused, in UPPER_SNAKE (docs/errors.md): NON_FAST_FORWARD, GATE_NO_APPROVAL, ..."`
	Message  string            `json:"message" jsonschema:"what happened and what to do, as the CLI prints it"`
	Metadata map[string]string `json:"metadata" jsonschema:"the refusal's details, e.g. the commits involved"`
}

// refusal is err as a tool result: isError, the CLI's message as text,
// and the reason a caller branches on as structured content.
func refusal(err error) *sdk.CallToolResult {
	x := decode(err)
	r := refusalJSON{Code: x.Kind.String(), Reason: string(x.Reason), Message: x.Message, Metadata: x.WireMetadata()}
	text := x.Message
	if r.Reason != "" && r.Reason != string(errdefs.LocalFailed) {
		text = fmt.Sprintf("%s (%s): %s", r.Code, r.Reason, x.Message)
	}
	b, _ := safeJSON(r)
	text = textsafe.Text(text)
	return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: json.RawMessage(b)}
}

// safeJSON is v as JSON with every string in it (keys too) escaped as the
// CLI prints text (textsafe.Text): a client that decodes the result, and the
// model it hands the text to, gets no control character raw. JSON alone
// would not do: it leaves C1 controls and bidirectional overrides as they
// are, and a decoded \u001b is ESC again.
func safeJSON(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var x any
	if err := d.Decode(&x); err != nil {
		return nil, err
	}
	return json.Marshal(escapeStrings(x))
}

func escapeStrings(v any) any {
	switch v := v.(type) {
	case string:
		return textsafe.Text(v)
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[textsafe.Text(k)] = escapeStrings(x)
		}
		return m
	case []any:
		for i, x := range v {
			v[i] = escapeStrings(x)
		}
		return v
	}
	return v
}

// decode is the one place this package turns an error into the domain's
// vocabulary: the Runner's errors are the CLI's own, already classified
// (the bus host's decoded by the client's interceptors); anything else is
// this server's own failure, LOCAL_FAILED as the CLI has it.
func decode(err error) *errdefs.Error {
	if x, ok := errdefs.As(err); ok {
		return x
	}
	return errdefs.New(errdefs.KindUnknown, errdefs.LocalFailed, "%s", err.Error()).Wrap(err)
}

// call is one tool call in progress.
type call struct {
	req     *sdk.CallToolRequest
	waiting atomic.Bool // for a slot (begin)
}

// begin takes one of the server's maxCalls slots for call c, waiting while
// all are taken until ctx ends (the client cancelled the call), and starts
// c's heartbeat, which says that it waits; end gives both back.
func (sv *server) begin(ctx context.Context, c *call, name string) (end func(), err error) {
	select {
	case sv.slots <- struct{}{}:
	default:
		c.waiting.Store(true)
	}
	stop := c.heartbeat(ctx, name)
	if c.waiting.Load() {
		select {
		case sv.slots <- struct{}{}:
			c.waiting.Store(false)
		case <-ctx.Done():
		}
		// A call cancelled while it waited never runs, even when a slot
		// came free at the same time.
		if ctx.Err() != nil {
			if !c.waiting.Load() {
				<-sv.slots
			}
			stop()
			return nil, errdefs.New(errdefs.KindCanceled, errdefs.Canceled,
				"%s: cancelled while it waited for one of the %d calls running at once to end", name, maxCalls).With("limit", fmt.Sprint(maxCalls))
		}
	}
	return func() {
		stop()
		<-sv.slots
	}, nil
}

// heartbeat sends notifications/progress every second while a call runs,
// when the client asked for progress (a progress token); the returned
// func stops it.
func (c *call) heartbeat(ctx context.Context, name string) func() {
	token := c.req.Params.GetProgressToken()
	if token == nil || c.req.Session == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		n := 0
		for {
			n++
			msg := fmt.Sprintf("%s running (%s)", name, time.Since(start).Round(time.Second))
			if c.waiting.Load() {
				msg = fmt.Sprintf("%s waiting for one of the %d calls running at once to end (%s)", name, maxCalls, time.Since(start).Round(time.Second))
			}
			if c.req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{ProgressToken: token, Progress: float64(n), Message: msg}) != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// Capabilities a tool needs, in the broker's words.
var (
	capsFetchMain = []string{authz.CapPushWorking, authz.CapReviewVerdict}
	capsPush      = []string{authz.CapPushWorking}
	capsRequest   = []string{authz.CapReviewRequest, authz.CapPushWorking}
	capsVerdict   = []string{authz.CapReviewVerdict}
	capsClose     = []string{authz.CapTaskClose}
	capsLand      = []string{authz.CapTaskLand}
	capsLaunch    = []string{authz.CapSessionLaunch}
)
