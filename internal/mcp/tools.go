package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/errdefs"
)

// tools are the tools, in the order tools/list gives them. Each runs the
// CLI command of its name; docs/mcp.md has the table. They are made on
// first use, not at package init: their JSON schemas cost every bushost
// command about 4 ms of CPU and 540 KB of allocations at start, which
// only bushost mcp needs.
var tools = sync.OnceValue(func() []tool {
	return []tool{
		fetchTool("fetch_main", "fetch-main", capsFetchMain,
			"Fetch the bus host's main into repo (made if absent): set refs/remotes/bushost/main and fast-forward main; returns main's commit. Do this before you start work."),
		fetchTool("fetch_work", "fetch-work", capsPush,
			"Fetch the task's latest push into repo's refs/work/<task> (to get your work back in a new clone); returns its commit."),
		define("push_working", "Push the commit at repo's HEAD (bundled against the main fetch_main fetched) to the task's work ref; returns the commit pushed. Commit first; NON_FAST_FORWARD means fetch_work and rebase.",
			additive, true, capsPush, func(ctx context.Context, sv *server, c *call, in repoArg) (pushOut, error) {
				var out pushOut
				dir, err := sv.repo(in.Repo)
				if err != nil {
					return out, err
				}
				warn, err := sv.run(ctx, "push-working", []Flag{{"repo", dir}}, nil, &out)
				out.Warning = warn
				return out, err
			}),
		commandTool[requestOut]("review_request", "review request", additive, true, capsRequest,
			"Ask for a review of the task's latest push; returns the request id (the same one when asked again for the same push)."),
		fetchTool("fetch_review", "fetch-review", capsVerdict,
			"Fetch the task's latest push into repo's refs/review/<task>, checked as the bus host checks pushes, to review it; returns its commit."),
		define("review_verdict", "Approve (approve: true) or reject the push of a review request, on the commit fetch_review left in repo; the one verdict of that request.",
			additive, false, capsVerdict, func(ctx context.Context, sv *server, c *call, in verdictArgs) (verdictOut, error) {
				var out verdictOut
				if in.Request == "" {
					return out, errdefs.InvalidArgument(errdefs.Usage, "review_verdict: give request, the id review_request returned")
				}
				dir, err := sv.repo(in.Repo)
				if err != nil {
					return out, err
				}
				word := "reject"
				if in.Approve {
					word = "approve"
				}
				flags := []Flag{{"request", in.Request}, {word, "true"}, {"repo", dir}}
				if in.Comment != "" {
					flags = append(flags, Flag{"comment", in.Comment})
				}
				_, err = sv.run(ctx, "review verdict", flags, nil, &out)
				return out, err
			}),
		commandTool[map[string]any]("task_show", "task show", readOnly, true, nil,
			"Show the task from its log: state, latest push, each review request with its verdict and comment, its landing."),
		commandTool[closeOut]("task_close", "task close", destructive, true, capsClose,
			"Close the task; with a push, only once its latest push is approved (else GATE_NO_APPROVAL)."),
		define("task_land", "Put the task's approved latest push on main and close the task; if main moved, merge: true has the bus host merge (MERGE_CONFLICT lists the paths).",
			destructive, false, capsLand, func(ctx context.Context, sv *server, c *call, in landArgs) (landOut, error) {
				var out landOut
				var flags []Flag
				if in.Merge {
					flags = append(flags, Flag{"merge", "true"})
				}
				_, err := sv.run(ctx, "task land", flags, nil, &out)
				return out, err
			}),
		define("events", "List the task's events from the log in order, those after sequence number since; more: true means call again with since set to the last one's seq.",
			readOnly, true, nil, func(ctx context.Context, sv *server, c *call, in eventsArgs) (eventsOut, error) {
				return sv.events(ctx, in.Since)
			}),
		define("session_launch", "Launch a confined session for a task of your project with a role and capabilities from your grant's launch set, running command; returns the session.",
			additive, false, capsLaunch, func(ctx context.Context, sv *server, c *call, in launchArgs) (map[string]any, error) {
				out := map[string]any{}
				flags, err := sv.launchFlags(in)
				if err != nil {
					return out, err
				}
				_, err = sv.run(ctx, "session launch", flags, in.Command, &out)
				return out, err
			}),
		define("session_list", "List the sessions you launched: id, task, role, state, exit.",
			readOnly, true, capsLaunch, func(ctx context.Context, sv *server, c *call, in noArgs) (sessionsOut, error) {
				return sv.sessions(ctx)
			}),
		sessionTool[map[string]any]("session_wait", "session wait", readOnly,
			"Wait for session id to end; returns the session with its exit status (124 for a timeout, 128+n for a signal)."),
		sessionTool[logsOut]("session_logs", "session logs", readOnly,
			"Return session id's output as the launcher kept it: the last 1 MiB of its stdout and of its stderr."),
		sessionTool[map[string]any]("session_stop", "session stop", destructive,
			"Stop session id (SIGTERM, then SIGKILL after the launcher's grace); returns once it has ended."),
	}
})

// fetchTool is a tool that runs fetch command words into repo and
// returns the commit fetched: it writes repo only.
func fetchTool(name, words string, caps []string, desc string) tool {
	return define(name, desc, local, true, caps, func(ctx context.Context, sv *server, c *call, in repoArg) (fetchOut, error) {
		var out fetchOut
		dir, err := sv.repo(in.Repo)
		if err != nil {
			return out, err
		}
		_, err = sv.run(ctx, words, []Flag{{"repo", dir}}, nil, &out)
		return out, err
	})
}

// commandTool is a tool without arguments that runs command words and
// returns the JSON object it prints.
func commandTool[Out any](name, words string, k kind, idempotent bool, caps []string, desc string) tool {
	return define(name, desc, k, idempotent, caps, func(ctx context.Context, sv *server, c *call, in noArgs) (Out, error) {
		var out Out
		_, err := sv.run(ctx, words, nil, nil, &out)
		return out, err
	})
}

// sessionTool is a session.launch tool that runs command words on the
// session id and returns the JSON object it prints.
func sessionTool[Out any](name, words string, k kind, desc string) tool {
	return define(name, desc, k, true, capsLaunch, func(ctx context.Context, sv *server, c *call, in idArg) (Out, error) {
		var out Out
		if strings.TrimSpace(in.ID) == "" {
			return out, errdefs.InvalidArgument(errdefs.Usage, "%s: give id, a session's id (session_list lists them)", name)
		}
		_, err := sv.run(ctx, words, nil, []string{in.ID}, &out)
		return out, err
	})
}

type noArgs struct{}

type repoArg struct {
	Repo string `json:"repo" jsonschema:"the repository, a directory relative to the server's working directory and inside it"`
}

type fetchOut struct {
	Commit string `json:"commit" jsonschema:"the commit fetched"`
	Ref    string `json:"ref,omitempty" jsonschema:"the ref of repo it was written to"`
	Task   string `json:"task,omitempty" jsonschema:"the task whose push it is"`
}

type pushOut struct {
	Commit   string `json:"commit" jsonschema:"the commit pushed"`
	Previous string `json:"previous,omitempty" jsonschema:"the task's push before it"`
	Ref      string `json:"ref" jsonschema:"the task's work ref on the bus host"`
	Warning  string `json:"warning,omitempty" jsonschema:"what the push left out, e.g. uncommitted changes"`
}

type requestOut struct {
	RequestID string `json:"request_id" jsonschema:"the review request's id: review_verdict's request"`
	Commit    string `json:"commit" jsonschema:"the push under review"`
	Created   bool   `json:"created" jsonschema:"false when this push was already under review"`
}

type verdictArgs struct {
	Request string `json:"request" jsonschema:"the review request's id"`
	Approve bool   `json:"approve" jsonschema:"true to approve, false to reject"`
	Comment string `json:"comment,omitempty" jsonschema:"a comment kept with the verdict: why, or what to change"`
	Repo    string `json:"repo" jsonschema:"the repository fetch_review fetched into, relative to the server's working directory"`
}

type verdictOut struct {
	RequestID string `json:"request_id"`
	Verdict   string `json:"verdict" jsonschema:"approve or reject"`
	Seq       int64  `json:"seq" jsonschema:"the verdict's event in the log"`
	Commit    string `json:"commit" jsonschema:"the commit judged"`
}

type closeOut struct {
	Closed bool  `json:"closed"`
	Seq    int64 `json:"seq" jsonschema:"the task.closed event"`
}

type landArgs struct {
	Merge bool `json:"merge,omitempty" jsonschema:"if main moved since the approved commit, have the bus host merge it instead of refusing MAIN_MOVED"`
}

type landOut struct {
	Commit  string `json:"commit" jsonschema:"the approved commit landed"`
	MainOld string `json:"main_old"`
	MainNew string `json:"main_new"`
	Merge   string `json:"merge,omitempty" jsonschema:"the merge commit, when main had moved"`
	Seq     int64  `json:"seq"`
}

type eventsArgs struct {
	Since int64 `json:"since,omitempty" jsonschema:"only events with a sequence number above this"`
}

type eventsOut struct {
	Events []map[string]any `json:"events"`
	More   bool             `json:"more" jsonschema:"true when the answer stopped at its size limit"`
}

type launchArgs struct {
	Task        string            `json:"task" jsonschema:"the task, of your grant's project"`
	Role        string            `json:"role" jsonschema:"one of your grant's launch roles"`
	Caps        []string          `json:"caps" jsonschema:"the session's capabilities, each in the role's launch set"`
	Command     []string          `json:"command" jsonschema:"the command the session runs, and its arguments"`
	Net         string            `json:"net,omitempty" jsonschema:"none (default), proxy or host, as your grant allows"`
	Limits      map[string]string `json:"limits,omitempty" jsonschema:"limits by name (memory, pids, cpu, nofile, fsize, timeout, disk), within your grant's"`
	AllowDomain []string          `json:"allow_domain,omitempty" jsonschema:"with net proxy: domains the session may reach"`
	AllowHost   []string          `json:"allow_host,omitempty" jsonschema:"with net proxy: HOST:PORT the session may reach"`
	Workspace   string            `json:"workspace,omitempty" jsonschema:"the session's workspace, a directory relative to the server's working directory (default: an empty one)"`
}

type idArg struct {
	ID string `json:"id" jsonschema:"the session's id"`
}

type sessionsOut struct {
	Sessions []map[string]any `json:"sessions"`
}

type logsOut struct {
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
}

// run runs a command and decodes its one JSON object into out; it
// returns what the command warned of.
func (sv *server) run(ctx context.Context, words string, flags []Flag, args []string, out any) (string, error) {
	var stdout, warn bytes.Buffer
	if err := sv.r.Run(ctx, words, flags, args, &limited{w: &stdout}, &limited{w: &warn}); err != nil {
		return "", err
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return "", fmt.Errorf("%s printed no JSON object: %w", words, err)
	}
	return strings.TrimSpace(warn.String()), nil
}

// events lists the events after since, up to maxOutput bytes of them.
func (sv *server) events(ctx context.Context, since int64) (eventsOut, error) {
	out := eventsOut{Events: []map[string]any{}}
	if since < 0 {
		return out, errdefs.InvalidArgument(errdefs.Usage, "events: since %d: give a sequence number, 0 or more", since)
	}
	var stdout bytes.Buffer
	l := &limited{w: &stdout}
	err := sv.r.Run(ctx, "events", []Flag{{"after", fmt.Sprint(since)}}, nil, l, &limited{w: &bytes.Buffer{}})
	if err != nil && !l.full {
		return out, err
	}
	out.More = l.full
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, maxOutput)
	for sc.Scan() {
		ev := map[string]any{}
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			break // the line the limit cut
		}
		out.Events = append(out.Events, ev)
	}
	return out, nil
}

func (sv *server) sessions(ctx context.Context) (sessionsOut, error) {
	out := sessionsOut{Sessions: []map[string]any{}}
	var stdout bytes.Buffer
	if err := sv.r.Run(ctx, "session list", nil, nil, &limited{w: &stdout}, &limited{w: &bytes.Buffer{}}); err != nil {
		return out, err
	}
	d := json.NewDecoder(&stdout)
	for d.More() {
		s := map[string]any{}
		if err := d.Decode(&s); err != nil {
			return out, fmt.Errorf("session list printed no JSON object: %w", err)
		}
		out.Sessions = append(out.Sessions, s)
	}
	return out, nil
}

func (sv *server) launchFlags(in launchArgs) ([]Flag, error) {
	if len(in.Command) == 0 {
		return nil, errdefs.InvalidArgument(errdefs.Usage, "session_launch: give command, the program the session runs and its arguments")
	}
	flags := []Flag{{"task", in.Task}, {"role", in.Role}, {"caps", strings.Join(in.Caps, ",")}}
	if in.Net != "" {
		flags = append(flags, Flag{"net", in.Net})
	}
	for _, l := range bounds.Limits {
		if v, ok := in.Limits[l.Name]; ok {
			flags = append(flags, Flag{l.Name, v})
		}
	}
	for name := range in.Limits {
		if _, ok := bounds.Lookup(name); !ok {
			return nil, errdefs.InvalidArgument(errdefs.Usage, "session_launch: limits: no limit is named %q (the limits: %s)", name, strings.Join(bounds.Names(), ", "))
		}
	}
	for _, d := range in.AllowDomain {
		flags = append(flags, Flag{"allow-domain", d})
	}
	for _, h := range in.AllowHost {
		flags = append(flags, Flag{"allow-host", h})
	}
	if in.Workspace != "" {
		dir, err := sv.repo(in.Workspace)
		if err != nil {
			return nil, err
		}
		flags = append(flags, Flag{"workspace", dir})
	}
	return flags, nil
}

// limited passes at most maxOutput bytes to w, then fails every write
// and notes that it was full.
type limited struct {
	w    *bytes.Buffer
	full bool
}

var errFull = errors.New("the answer is over its size limit")

func (l *limited) Write(p []byte) (int, error) {
	if l.w.Len()+len(p) > maxOutput {
		l.full = true
		return 0, errFull
	}
	return l.w.Write(p)
}
