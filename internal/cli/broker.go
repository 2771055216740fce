package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/names"
)

// The broker commands: the host's tasks and grants, a session's reviews,
// close and free-form events, and anyone's view of the log. The broker
// decides every rule; these commands only ask and print the answer.

func init() {
	register(&command{
		words: "task add",
		short: "register a task of a project",
		usage: "task add --business B --project P --task T",
		help:  "Host: register task T of a project added with 'project add'. Idempotent.",
		setup: runTaskAdd,
	})
	register(&command{
		words: "grant",
		short: "issue a token for one task, role and capabilities",
		usage: "grant --business B --project P --task T --role R --cap C[,C...] [--launch ROLE=C[,C...]]... [--launch-net MODES] [--launch-max-LIMIT V]... [--launch-tasks PATTERN] [--launch-allow-domain D]... [--launch-allow-host H:P]... [--ttl D] [--out FILE]",
		help:  "Host: issue a token for one task, role and capabilities; prints the token, or writes it to FILE (mode 0600, never overwritten) and prints the grant id. With --cap session.launch, each --launch ROLE=C,... names a role the grant may launch sessions of (bushost session launch) and the capabilities they may hold; --launch-net, --launch-max-LIMIT, --launch-tasks and --launch-allow-* bound the rest of what its launches may ask for (default: network none, sandbox serve's defaults as ceilings, the grant's own task).",
		setup: runGrant,
	})
	register(&command{
		words: "revoke",
		short: "make a grant's token useless",
		usage: "revoke GRANT_ID",
		help:  "Host: make a grant's token useless from now on.",
		args:  cobra.ArbitraryArgs,
		setup: runRevoke,
	})
	register(&command{
		words: "review request",
		short: "ask for a review of the task's latest push",
		usage: "review request",
		help:  "Ask for a review of the task's latest push; prints the request id (the same one when asked again for the same push). Once that push is rejected, asking again is refused (VERDICT_GIVEN): push a new commit first; 'task show' has the reviewer's comment.",
		setup: runReviewRequest,
	})
	register(&command{
		words: "review verdict",
		short: "approve or reject the push under review",
		usage: "review verdict --request ID (--approve | --reject) [--commit SHA] [--repo DIR] [--comment TEXT]",
		help:  "Give the one verdict of a review request of the task's latest push, on the commit the reviewer saw: --commit, else DIR's refs/review/<task> (DIR default .).",
		setup: runReviewVerdict,
	})
	register(&command{
		words: "task close",
		short: "close the task (its latest push approved)",
		usage: "task close",
		help:  "Close the task; with a push, only once its latest push is approved.",
		setup: runTaskClose,
	})
	register(&command{
		words: "event record",
		short: "record a free-form event in the log",
		usage: "event record --type TYPE [--data JSON | --batch FILE] [--key KEY]",
		help:  "Record a free-form event (type like agent.step_done, data a JSON object); prints its sequence number. With --key, retrying with the same body returns the first event. With --batch FILE (- for stdin), each line of FILE is one event's data, all recorded in one call, all or none (at most 256 events, 512 KiB); prints one sequence number a line.",
		setup: runEventRecord,
	})
	register(&command{
		words: "events",
		short: "list the log's events",
		usage: "events [--task T] [--follow] [--json]",
		help:  "List the log's events in order (a grant sees its own task's only); --follow keeps streaming new ones. --json prints one JSON object per line.",
		setup: runEvents,
	})
	register(&command{
		words: "log verify",
		short: "check the log's hash chain and derived tables",
		usage: "log verify [--head SEQ:HASH] [--checkpoint-file PATH]",
		help:  "Host: recompute the log's hash chain, prove each event was signed by a trusted host (bushostd serve --log-trusted-keys), check each verdict's actor could give it, check each recorded head (--head, every line of a checkpoint file) is still in the log, and compare the derived tables with the log; exits 1 naming the first bad event, the unproven ones and every differing row.",
		setup: runLogVerify,
	})
}

// printOut prints text, or obj as one line of JSON with --json.
func printOut(e *Env, text string, obj any) error {
	if e.JSON {
		return json.NewEncoder(e.Stdout).Encode(obj)
	}
	_, err := fmt.Fprintln(e.Stdout, text)
	return err
}

// scopeFlags adds --business, --project and --task to fs.
func scopeFlags(fs *pflag.FlagSet) (b, p, t *string) {
	return fs.String("business", "", "business name"), fs.String("project", "", "project name"), fs.String("task", "", "task name")
}

func required(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return usagef("--%s is required", pairs[i])
		}
	}
	return nil
}

// brokerCall is a command whose work is one broker call (unary).
func brokerCall(call func(ctx context.Context, e *Env, c brokerv1.BrokerServiceClient) error) runFunc {
	return func(ctx context.Context, e *Env, args []string) error {
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			return call(ctx, e, c)
		})
	}
}

// unary runs one call with the broker client under callTimeout.
func unary(ctx context.Context, e *Env, call func(ctx context.Context, c brokerv1.BrokerServiceClient) error) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	c, ctx, done, err := e.brokerClient(ctx)
	if err != nil {
		return err
	}
	defer done()
	return call(ctx, c)
}

func runTaskAdd(fs *pflag.FlagSet) runFunc {
	b, p, t := scopeFlags(fs)
	return func(ctx context.Context, e *Env, args []string) error {
		if err := required("business", *b, "project", *p, "task", *t); err != nil {
			return err
		}
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			r, err := c.AddTask(ctx, &brokerv1.AddTaskRequest{Business: *b, Project: *p, Task: *t})
			if err != nil {
				return err
			}
			text := fmt.Sprintf("task %s/%s/%s added", *b, *p, *t)
			if !r.Created {
				text = fmt.Sprintf("task %s/%s/%s already exists", *b, *p, *t)
			}
			return printOut(e, text, map[string]any{"business": *b, "project": *p, "task": *t, "created": r.Created})
		})
	}
}

// capsFlag gathers --cap values, each a comma-separated list.
type capsFlag []string

func (c *capsFlag) String() string { return strings.Join(*c, ",") }
func (c *capsFlag) Type() string   { return "C[,C...]" }
func (c *capsFlag) Set(v string) error {
	for _, x := range strings.Split(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			*c = append(*c, x)
		}
	}
	return nil
}

// launchBoundsFlag is grant's --launch-net, --launch-max-LIMIT (one per
// limit of bounds.Limits), --launch-tasks and --launch-allow-*.
type launchBoundsFlag struct {
	nets           modesFlag
	max            map[string]*string
	tasks          string
	domains, hosts []string
}

// modesFlag is a comma-separated list of network modes.
type modesFlag struct{ capsFlag }

func (modesFlag) Type() string { return "MODE[,MODE...]" }

func launchBoundsFlags(fs *pflag.FlagSet) *launchBoundsFlag {
	l := &launchBoundsFlag{max: map[string]*string{}}
	fs.Var(&l.nets, "launch-net", "with --cap session.launch: the network modes its launches may ask for, comma-separated: none, proxy, host (default none)")
	for _, lim := range bounds.Limits {
		l.max[lim.Name] = fs.String("launch-max-"+lim.Name, "", fmt.Sprintf("with --cap session.launch: the most --%s its launches may ask for: %s (default sandbox serve's --default-%s)", lim.Name, lim.Help, lim.Name))
	}
	fs.StringVar(&l.tasks, "launch-tasks", "", "with --cap session.launch: a pattern ('*' for any run of name characters) of the tasks of its project it may launch for (default its own task only)")
	fs.StringArrayVar(&l.domains, "launch-allow-domain", nil, "with --cap session.launch: a domain (or *.NAME), with :PORT or else 443 and 80, a --net=proxy launch may be allowed (repeatable)")
	fs.StringArrayVar(&l.hosts, "launch-allow-host", nil, "with --cap session.launch: a HOST:PORT a --net=proxy launch may be allowed (repeatable)")
	return l
}

// proto is the flags as CreateGrant takes them; nil if none was given.
func (l *launchBoundsFlag) proto() *brokerv1.LaunchBounds {
	p := &brokerv1.LaunchBounds{Net: l.nets.capsFlag, Tasks: l.tasks, AllowDomains: l.domains, AllowHosts: l.hosts}
	for name, v := range l.max {
		if *v != "" {
			if p.Max == nil {
				p.Max = map[string]string{}
			}
			p.Max[name] = *v
		}
	}
	if len(p.Net) == 0 && len(p.Max) == 0 && p.Tasks == "" && len(p.AllowDomains) == 0 && len(p.AllowHosts) == 0 {
		return nil
	}
	return p
}

func runGrant(fs *pflag.FlagSet) runFunc {
	b, p, t := scopeFlags(fs)
	role := fs.String("role", "", "the role name (e.g. worker, reviewer)")
	var caps capsFlag
	fs.Var(&caps, "cap", "capabilities, comma-separated or repeated: git.push.working, review.request, review.verdict, task.close, event.record, task.land, session.launch")
	launch := fs.StringArray("launch", nil, "with --cap session.launch: ROLE=C[,C...], a role the grant may launch and its capabilities (repeatable)")
	lb := launchBoundsFlags(fs)
	ttl := fs.Duration("ttl", 0, "lifetime (e.g. 8h); default the server's (24h)")
	out := fs.String("out", "", "write the token to this new file (0600) instead of printing it; the file is removed again if no grant is issued")
	return func(ctx context.Context, e *Env, args []string) error {
		if err := required("business", *b, "project", *p, "task", *t, "role", *role); err != nil {
			return err
		}
		if len(caps) == 0 {
			return usagef("--cap is required")
		}
		if *ttl < 0 || *ttl%time.Second != 0 {
			return usagef("--ttl must be a positive whole number of seconds, like 90s or 8h")
		}
		var roles []*brokerv1.LaunchRole
		for _, l := range *launch {
			role, list, ok := strings.Cut(l, "=")
			if !ok || role == "" || list == "" {
				return usagef("--launch %q: want ROLE=CAP[,CAP...]", l)
			}
			var rc capsFlag
			_ = rc.Set(list)
			roles = append(roles, &brokerv1.LaunchRole{Role: role, Capabilities: rc})
		}
		// Made before the call, so that a token is never issued with nowhere
		// to go; O_EXCL never follows or replaces someone else's file. Until
		// a grant is issued into it, any failure (no bus host, a refusal)
		// removes it again: a retry with the same --out must not find it.
		var f *os.File
		issued := false
		if *out != "" {
			var err error
			f, err = os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if errors.Is(err, os.ErrExist) {
				return usagef("--out %s exists: a token file is never overwritten; give a new path, or remove that file first", *out)
			}
			if err != nil {
				return usagef("--out: %v", err)
			}
			// What it removes is the file it made: a file someone else put
			// at --out since (after removing this one) is left as it is.
			made, err := f.Stat()
			if err != nil {
				f.Close()
				os.Remove(*out)
				return fmt.Errorf("--out: %w", err)
			}
			defer func() {
				f.Close()
				if now, err := os.Lstat(*out); !issued && err == nil && os.SameFile(made, now) {
					os.Remove(*out)
				}
			}()
		}
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			r, err := c.CreateGrant(ctx, &brokerv1.CreateGrantRequest{Business: *b, Project: *p, Task: *t, Role: *role,
				Capabilities: caps, TtlSeconds: int64(*ttl / time.Second), Launch: roles, LaunchBounds: lb.proto()})
			if err != nil {
				return err
			}
			issued = true
			obj := map[string]any{"grant_id": r.GrantId, "expires_at": r.ExpiresAt}
			if f == nil {
				obj["token"] = r.Token
				fmt.Fprintf(e.Stderr, "grant %s for %s/%s/%s expires at %s\n", r.GrantId, *b, *p, *t, r.ExpiresAt)
				return printOut(e, r.Token, obj)
			}
			if _, err := io.WriteString(f, r.Token+"\n"); err != nil {
				return fmt.Errorf("write token file: %w", err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("write token file: %w", err)
			}
			obj["token_file"] = *out
			return printOut(e, r.GrantId, obj)
		})
	}
}

func runRevoke(fs *pflag.FlagSet) runFunc {
	return func(ctx context.Context, e *Env, args []string) error {
		if len(args) != 1 {
			return usagef("give exactly one GRANT_ID")
		}
		id := args[0]
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			if _, err := c.RevokeGrant(ctx, &brokerv1.RevokeGrantRequest{GrantId: id}); err != nil {
				return err
			}
			return printOut(e, "revoked "+id, map[string]any{"grant_id": id, "revoked": true})
		})
	}
}

func runReviewRequest(fs *pflag.FlagSet) runFunc {
	return brokerCall(func(ctx context.Context, e *Env, c brokerv1.BrokerServiceClient) error {
		r, err := c.RequestReview(ctx, &brokerv1.RequestReviewRequest{})
		if err != nil {
			return err
		}
		return printOut(e, r.RequestId, map[string]any{"request_id": r.RequestId, "commit": r.Commit, "created": r.Created})
	})
}

func runReviewVerdict(fs *pflag.FlagSet) runFunc {
	id := fs.String("request", "", "the review request id (from 'review request')")
	approve := fs.Bool("approve", false, "approve the push")
	reject := fs.Bool("reject", false, "reject the push")
	comment := fs.String("comment", "", "a comment kept with the verdict")
	commitFlag := fs.String("commit", "", "the commit the reviewer saw (full id); default DIR's refs/review/<task>")
	repo := fs.String("repo", ".", "the reviewer's repository, where fetch-review left refs/review/<task>")
	return func(ctx context.Context, e *Env, args []string) error {
		if err := required("request", *id); err != nil {
			return err
		}
		if *approve == *reject {
			return usagef("give exactly one of --approve and --reject")
		}
		v, word := brokerv1.Verdict_VERDICT_APPROVE, "approve"
		if *reject {
			v, word = brokerv1.Verdict_VERDICT_REJECT, "reject"
		}
		seen, err := verdictCommit(ctx, *commitFlag, *repo)
		if err != nil {
			return err
		}
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			r, err := c.SubmitVerdict(ctx, &brokerv1.SubmitVerdictRequest{RequestId: *id, Verdict: v, Comment: *comment, Commit: seen})
			if err != nil {
				return err
			}
			return printOut(e, fmt.Sprintf("%s recorded (event %d)", word, r.Seq), map[string]any{"request_id": *id, "verdict": word, "seq": r.Seq, "commit": seen})
		})
	}
}

func runTaskClose(fs *pflag.FlagSet) runFunc {
	return brokerCall(func(ctx context.Context, e *Env, c brokerv1.BrokerServiceClient) error {
		r, err := c.CloseTask(ctx, &brokerv1.CloseTaskRequest{})
		if err != nil {
			return err
		}
		return printOut(e, fmt.Sprintf("closed (event %d)", r.Seq), map[string]any{"closed": true, "seq": r.Seq})
	})
}

func runEventRecord(fs *pflag.FlagSet) runFunc {
	typ := fs.String("type", "", "the event type, e.g. agent.step_done (action.*, review.*, task.*, grant.* are the broker's own)")
	data := fs.String("data", "", "a JSON object, at most 64 KiB (default {})")
	key := fs.String("key", "", "an idempotency key: a retry with the same key and body returns the first event")
	batch := fs.String("batch", "", "a file (- for stdin) of one JSON object a line: one event of --type each, recorded in one call")
	return func(ctx context.Context, e *Env, args []string) error {
		if err := required("type", *typ); err != nil {
			return err
		}
		if *batch != "" {
			if *data != "" || *key != "" {
				return usagef("--batch takes each event's data from its file: no --data or --key")
			}
			return recordBatch(ctx, e, *typ, *batch)
		}
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			r, err := c.RecordEvent(ctx, &brokerv1.RecordEventRequest{Type: *typ, Data: *data, IdempotencyKey: *key})
			if err != nil {
				return err
			}
			return printOut(e, fmt.Sprint(r.Event.GetSeq()), eventJSON(r.Event))
		})
	}
}

// recordBatch records each non-empty line of path as one event of typ, in
// one RecordEvents call. The broker bounds the batch; reading is bounded
// a little above that so a wrong file is refused without being read whole.
func recordBatch(ctx context.Context, e *Env, typ, path string) error {
	in := e.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return usagef("--batch: %v", err)
		}
		defer f.Close()
		in = f
	}
	const most = 2 << 20
	raw, err := io.ReadAll(io.LimitReader(in, most+1))
	if err != nil {
		return fmt.Errorf("--batch %s: %w", path, err)
	}
	if len(raw) > most {
		return usagef("--batch %s: over %d bytes; a batch holds at most 512 KiB of events", path, most)
	}
	var req brokerv1.RecordEventsRequest
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		req.Events = append(req.Events, &brokerv1.RecordEventRequest{Type: typ, Data: line})
	}
	if len(req.Events) == 0 {
		return usagef("--batch %s: no events (one JSON object a line)", path)
	}
	return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
		r, err := c.RecordEvents(ctx, &req)
		if err != nil {
			return err
		}
		for _, ev := range r.GetEvents() {
			if err := printOut(e, fmt.Sprint(ev.GetSeq()), eventJSON(ev)); err != nil {
				return err
			}
		}
		return nil
	})
}

// eventJSON is an event as --json prints it; data is embedded as the JSON
// object it is.
func eventJSON(ev *brokerv1.Event) map[string]any {
	return map[string]any{
		"seq": ev.GetSeq(), "business": ev.GetBusiness(), "project": ev.GetProject(), "task": ev.GetTask(),
		"type": ev.GetType(), "actor": ev.GetActor(), "data": json.RawMessage(ev.GetData()), "time": ev.GetTime(),
		"peer": ev.GetPeer(), "prev_hash": ev.GetPrevHash(), "hash": ev.GetHash(),
	}
}

func runEvents(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "host: only this business")
	project := fs.String("project", "", "host: only this project")
	task := fs.String("task", "", "only this task: its own name, like t3 (with --business and --project for the host)")
	follow := fs.Bool("follow", false, "keep streaming new events until interrupted")
	after := fs.Int64("after", 0, "only events with a sequence number above this")
	return func(ctx context.Context, e *Env, args []string) error {
		if err := filterNames(*business, *project, *task); err != nil {
			return err
		}
		c, ctx, done, err := e.brokerClient(ctx)
		if err != nil {
			return err
		}
		defer done()
		if !*follow {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, callTimeout)
			defer cancel()
		}
		stream, err := c.ListEvents(ctx, &brokerv1.ListEventsRequest{Business: *business, Project: *project, Task: *task, AfterSeq: *after, Follow: *follow})
		if err != nil {
			return err
		}
		// The text listing is a table with a header, printed with the first
		// event (so that a follow's first line still means it is streaming),
		// or alone at the end of an empty listing.
		header := !e.JSON
		printHeader := func() {
			if header {
				fmt.Fprintln(e.Stdout, "SEQ\tTIME\tBUSINESS/PROJECT/TASK\tTYPE\tACTOR\tDATA")
				header = false
			}
		}
		for {
			r, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				printHeader()
				return nil
			}
			if err != nil {
				if *follow && ctx.Err() != nil {
					return nil // interrupted: how a follow ends
				}
				return err
			}
			printHeader()
			ev := r.GetEvent()
			text := fmt.Sprintf("%d\t%s\t%s/%s/%s\t%s\t%s\t%s", ev.GetSeq(), ev.GetTime(), ev.GetBusiness(), ev.GetProject(), ev.GetTask(), ev.GetType(), ev.GetActor(), ev.GetData())
			if err := printOut(e, text, eventJSON(ev)); err != nil {
				return err
			}
		}
	}
}

// filterNames refuses a filter that no event can match, rather than list
// nothing: "acme/web/t3" is three flags, not a task's name.
func filterNames(business, project, task string) error {
	for _, f := range []struct{ flag, v string }{{"business", business}, {"project", project}, {"task", task}} {
		if f.v == "" || names.Matches(f.v) {
			continue
		}
		if parts := strings.Split(f.v, "/"); f.flag == "task" && len(parts) == 3 {
			return usagef("--task takes a task's own name, like t3 (%s); for %s give --business %s --project %s --task %s",
				names.Pattern, f.v, parts[0], parts[1], parts[2])
		}
		return usagef("--%s %q is not a name: names match %s, like acme, web or t3", f.flag, f.v, names.Pattern)
	}
	return nil
}

func runLogVerify(fs *pflag.FlagSet) runFunc {
	head := fs.String("head", "", "a head recorded earlier (SEQ:HASH, from 'log head'): event SEQ must still have HASH")
	checkpoint := fs.String("checkpoint-file", "", "check every head in this file (bushostd serve --checkpoint-file)")
	return func(ctx context.Context, e *Env, args []string) error {
		heads, err := recordedHeads(*head, *checkpoint)
		if err != nil {
			return err
		}
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			r, err := c.VerifyLog(ctx, &brokerv1.VerifyLogRequest{Heads: heads})
			if err != nil {
				return err
			}
			obj := map[string]any{"ok": r.Ok, "events": r.Events, "first_bad_seq": r.FirstBadSeq, "reason": r.Reason,
				"differences": r.Differences, "head_seq": r.HeadSeq, "head_hash": r.HeadHash}
			if !r.Ok {
				if e.JSON {
					if err := printOut(e, "", obj); err != nil {
						return err
					}
				}
				for _, d := range r.Differences {
					fmt.Fprintf(e.Stderr, "derived table differs from the log: %s\n", d)
				}
				if r.FirstBadSeq != 0 {
					return fmt.Errorf("the log breaks at event %d: %s", r.FirstBadSeq, r.Reason)
				}
				return fmt.Errorf("the derived tables differ from the log in %d rows (above); the gate decides from the log", len(r.Differences))
			}
			if len(heads) == 0 {
				return printOut(e, fmt.Sprintf("ok: %d events, hash chain intact, each signed by a trusted host, derived tables agree; no recorded head was given to check the log against "+
					"(record one with 'bushost log head', or run bushostd with --checkpoint-file; then --head SEQ:HASH or --checkpoint-file PATH)", r.Events), obj)
			}
			return printOut(e, fmt.Sprintf("ok: %d events, hash chain intact, each signed by a trusted host, %d recorded heads match, derived tables agree", r.Events, len(heads)), obj)
		})
	}
}
