package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// The inspection commands beside task list (lists.go): project list, grant
// list and task show. Each prints a table with a header, or with --json
// one object of a stable shape (docs/broker.md, "Inspecting"). None ever
// prints a token or its hash: the server never sends one.

func init() {
	register(&command{
		words: "project list",
		short: "list projects: placement, size, latest push",
		usage: "project list [--business B]",
		help: "List projects: the bus host each is placed on (\"(moving)\" while an export awaits its import), the size of its repositories on this host, task count and latest push, as a table " +
			"(--json: {\"projects\":[...]}, docs/broker.md). The host sees every project; a grant its own task's project only.",
		setup: runProjectList,
	})
	register(&command{
		words: "grant list",
		short: "list grants (never a token)",
		usage: "grant list [--business B] [--project P] [--task T]",
		help: "List grants: id, task, role, capabilities, expiry and revocation, never a token, as a table " +
			"(--json: {\"grants\":[...]}, docs/broker.md). The host sees every grant; a grant those of its own task only.",
		setup: runGrantList,
	})
	register(&command{
		words: "task show",
		short: "show a task: pushes, reviews, verdicts, landing",
		usage: "task show [--business B --project P --task T]",
		help: "Show one task from its log: state, latest push, every review request with its verdict, the commit judged, the reviewer's grant and comment, " +
			"its landing, and whether it needs the host's repair (--json: one object, docs/broker.md). A session's grant shows its own task with no flags.",
		setup: runTaskShow,
	})
}

// projectJSON is the stable --json shape of one project (docs/broker.md).
type projectJSON struct {
	Business     string `json:"business"`
	Project      string `json:"project"`
	Host         string `json:"host"`
	Moving       bool   `json:"moving"`
	Here         bool   `json:"here"`
	SizeBytes    int64  `json:"size_bytes"`
	Tasks        int64  `json:"tasks"`
	LastPush     string `json:"last_push"`
	LastPushSeq  int64  `json:"last_push_seq"`
	LastPushTask string `json:"last_push_task"`
	LastPushTime string `json:"last_push_time"`
}

func runProjectList(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "only this business")
	return brokerCall(func(ctx context.Context, e *Env, c brokerv1.BrokerServiceClient) error {
		r, err := c.ListProjects(ctx, &brokerv1.ListProjectsRequest{Business: *business})
		if err != nil {
			return err
		}
		ps := []projectJSON{}
		for _, p := range r.GetProjects() {
			ps = append(ps, projectJSON{Business: p.GetBusiness(), Project: p.GetProject(), Host: p.GetHost(), Moving: p.GetMoving(), Here: p.GetHere(), SizeBytes: p.GetSizeBytes(),
				Tasks: p.GetTasks(), LastPush: p.GetLastPushCommit(), LastPushSeq: p.GetLastPushSeq(), LastPushTask: p.GetLastPushTask(), LastPushTime: p.GetLastPushTime()})
		}
		return printList(e, "projects", ps, "BUSINESS\tPROJECT\tHOST\tSIZE\tTASKS\tLAST PUSH\tPUSH TASK\tPUSHED AT", func(w io.Writer, p projectJSON) {
			size := fmt.Sprint(p.SizeBytes)
			if !p.Here {
				size = "-"
			}
			host := cmp.Or(p.Host, "-")
			if p.Moving {
				host += " (moving)"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", p.Business, p.Project, host, size, p.Tasks,
				cmp.Or(p.LastPush, "-"), cmp.Or(p.LastPushTask, "-"), cmp.Or(p.LastPushTime, "-"))
		})
	})
}

// grantJSON is the stable --json shape of one grant (docs/broker.md).
type grantJSON struct {
	ID           string   `json:"id"`
	Business     string   `json:"business"`
	Project      string   `json:"project"`
	Task         string   `json:"task"`
	Role         string   `json:"role"`
	Capabilities []string `json:"capabilities"`
	ExpiresAt    string   `json:"expires_at"`
	Expired      bool     `json:"expired"`
	Revoked      bool     `json:"revoked"`
	RevokedSeq   int64    `json:"revoked_seq"`
	// Launch is what a grant with session.launch may launch: role to
	// capabilities ({} for any other grant).
	Launch      map[string][]string `json:"launch"`
	LaunchedBy  string              `json:"launched_by"`
	LaunchDepth int64               `json:"launch_depth"`
	// LaunchBounds is the rest of its launch set: network modes, limit
	// ceilings, tasks, egress ({} for none).
	LaunchBounds bounds.Launch `json:"launch_bounds"`
}

func runGrantList(fs *pflag.FlagSet) runFunc {
	business, project, task := scopeFlags(fs)
	return brokerCall(func(ctx context.Context, e *Env, c brokerv1.BrokerServiceClient) error {
		r, err := c.ListGrants(ctx, &brokerv1.ListGrantsRequest{Business: *business, Project: *project, Task: *task})
		if err != nil {
			return err
		}
		gs := []grantJSON{}
		for _, g := range r.GetGrants() {
			caps := append([]string{}, g.GetCapabilities()...)
			launch := map[string][]string{}
			for _, l := range g.GetLaunch() {
				launch[l.GetRole()] = append([]string{}, l.GetCapabilities()...)
			}
			gs = append(gs, grantJSON{ID: g.GetId(), Business: g.GetBusiness(), Project: g.GetProject(), Task: g.GetTask(), Role: g.GetRole(),
				Capabilities: caps, ExpiresAt: g.GetExpiresAt(), Expired: g.GetExpired(), Revoked: g.GetRevokedSeq() != 0, RevokedSeq: g.GetRevokedSeq(),
				Launch: launch, LaunchedBy: g.GetLaunchedBy(), LaunchDepth: g.GetLaunchDepth(),
				LaunchBounds: bounds.Launch{Nets: g.GetLaunchBounds().GetNet(), Max: g.GetLaunchBounds().GetMax(), Tasks: g.GetLaunchBounds().GetTasks(),
					AllowDomains: g.GetLaunchBounds().GetAllowDomains(), AllowHosts: g.GetLaunchBounds().GetAllowHosts()}})
		}
		return printList(e, "grants", gs, "ID\tBUSINESS\tPROJECT\tTASK\tROLE\tCAPABILITIES\tLAUNCH\tEXPIRES\tSTATE", func(w io.Writer, g grantJSON) {
			state := "valid"
			switch {
			case g.Revoked:
				state = fmt.Sprintf("revoked (event %d)", g.RevokedSeq)
			case g.Expired:
				state = "expired"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.ID, g.Business, g.Project, g.Task, g.Role, strings.Join(g.Capabilities, ","), launchText(g.Launch, g.LaunchBounds), g.ExpiresAt, state)
		})
	})
}

// reviewJSON is one review request of a task and its verdict, if any.
type reviewJSON struct {
	RequestID     string `json:"request_id"`
	Commit        string `json:"commit"`
	PushSeq       int64  `json:"push_seq"`
	RequestSeq    int64  `json:"request_seq"`
	RequestedBy   string `json:"requested_by"`
	Verdict       string `json:"verdict"`
	VerdictSeq    int64  `json:"verdict_seq"`
	VerdictCommit string `json:"verdict_commit"`
	Reviewer      string `json:"reviewer_grant"`
	Comment       string `json:"comment"`
	// Withdrawn: given before the task's latest reopening, so the gate no
	// longer counts it (broker/gate.go).
	Withdrawn bool `json:"withdrawn"`
}

// landingJSON is a task's landing on main.
type landingJSON struct {
	Seq     int64  `json:"seq"`
	Commit  string `json:"commit"`
	MainOld string `json:"main_old"`
	MainNew string `json:"main_new"`
	Merge   string `json:"merge"`
}

// taskShowJSON is the stable --json shape of task show (docs/broker.md).
type taskShowJSON struct {
	Business      string       `json:"business"`
	Project       string       `json:"project"`
	Task          string       `json:"task"`
	State         string       `json:"state"`
	LastPush      string       `json:"last_push"`
	LastPushSeq   int64        `json:"last_push_seq"`
	LastPushGrant string       `json:"last_push_grant"`
	LastPushTime  string       `json:"last_push_time"`
	ClosedSeq     int64        `json:"closed_seq"`
	ReopenedSeq   int64        `json:"reopened_seq"`
	NeedsRepair   string       `json:"needs_repair"`
	Reviews       []reviewJSON `json:"reviews"`
	Landing       *landingJSON `json:"landing"`
}

// runTaskShow reads the task's events and tells its state; the server's
// log is the whole source, the client only summarizes it. With a flag
// missing, the task is the one the flags and the caller's grant select
// (task list): a session's own task, or refused when several match.
func runTaskShow(fs *pflag.FlagSet) runFunc {
	business, project, task := scopeFlags(fs)
	return func(ctx context.Context, e *Env, args []string) error {
		// The broker lists tasks by business and project only: a task
		// name no task can have is refused here, as the broker refuses
		// it, not looked for and reported missing.
		if err := names.CheckFilter("business", *business, "project", *project, "task", *task); err != nil {
			return err
		}
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			b, p, t := *business, *project, *task
			if b == "" || p == "" || t == "" {
				r, err := c.ListTasks(ctx, &brokerv1.ListTasksRequest{Business: b, Project: p})
				if err != nil {
					return err
				}
				var match []*brokerv1.TaskInfo
				for _, ti := range r.GetTasks() {
					if t == "" || ti.GetTask() == t {
						match = append(match, ti)
					}
				}
				switch len(match) {
				case 0:
					return errdefs.NotFound(errdefs.TaskNotFound, "no task matches %s/%s/%s that this token may see", cmp.Or(b, "-"), cmp.Or(p, "-"), cmp.Or(t, "-"))
				case 1:
					b, p, t = match[0].GetBusiness(), match[0].GetProject(), match[0].GetTask()
				default:
					return usagef("%d tasks match: give --business, --project and --task", len(match))
				}
			}
			stream, err := c.ListEvents(ctx, &brokerv1.ListEventsRequest{Business: b, Project: p, Task: t})
			if err != nil {
				return err
			}
			st := taskShowJSON{Business: b, Project: p, Task: t, Reviews: []reviewJSON{}}
			type push struct {
				seq         int64
				grant, time string
			}
			pushes := map[string]push{}
			reviews := map[string]int{}
			seen := false
			for {
				r, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				ev := r.GetEvent()
				var d struct {
					Capability string `json:"capability"`
					Commit     string `json:"commit"`
					RequestID  string `json:"request_id"`
					PushSeq    int64  `json:"push_seq"`
					Verdict    string `json:"verdict"`
					Comment    string `json:"comment"`
					Reason     string `json:"reason"`
					Outcome    string `json:"outcome"`
					RefCommit  string `json:"ref_commit"`
					MainOld    string `json:"main_old"`
					MainNew    string `json:"main_new"`
					Merge      string `json:"merge"`
				}
				json.Unmarshal([]byte(ev.GetData()), &d)
				switch ev.GetType() {
				case "task.added":
					seen = true
					st.State = "open"
				case "task.closed":
					// A landing closes its task: it stays "landed".
					st.ClosedSeq = ev.GetSeq()
					if st.Landing == nil {
						st.State = "closed"
					}
				case "task.reopened":
					st.State, st.ClosedSeq, st.ReopenedSeq = "open", 0, ev.GetSeq()
				case "task.landed":
					st.State = "landed"
					st.Landing = &landingJSON{Seq: ev.GetSeq(), Commit: d.Commit, MainOld: d.MainOld, MainNew: d.MainNew, Merge: d.Merge}
				case "action.allowed":
					if d.Capability != "git.push.working" {
						break
					}
					st.LastPush, st.LastPushSeq, st.LastPushGrant, st.LastPushTime = d.Commit, ev.GetSeq(), ev.GetActor(), ev.GetTime()
					pushes[d.Commit] = push{ev.GetSeq(), ev.GetActor(), ev.GetTime()}
				case "review.request":
					reviews[d.RequestID] = len(st.Reviews)
					st.Reviews = append(st.Reviews, reviewJSON{RequestID: d.RequestID, Commit: d.Commit, PushSeq: d.PushSeq, RequestSeq: ev.GetSeq(), RequestedBy: ev.GetActor()})
				case "review.verdict":
					if i, ok := reviews[d.RequestID]; ok {
						rv := &st.Reviews[i]
						rv.Verdict, rv.VerdictSeq, rv.VerdictCommit, rv.Reviewer, rv.Comment = d.Verdict, ev.GetSeq(), d.Commit, ev.GetActor(), d.Comment
					}
				case "task.needs_repair":
					st.NeedsRepair = fmt.Sprintf("%s (event %d)", d.Reason, ev.GetSeq())
				case "task.repaired":
					st.NeedsRepair = ""
					if d.Outcome == "push_lost" {
						pu := pushes[d.RefCommit]
						st.LastPush, st.LastPushSeq, st.LastPushGrant, st.LastPushTime = d.RefCommit, pu.seq, pu.grant, pu.time
					}
				}
			}
			if !seen {
				return errdefs.NotFound(errdefs.TaskNotFound, "no task %s/%s/%s", b, p, t)
			}
			for i := range st.Reviews {
				if rv := &st.Reviews[i]; rv.VerdictSeq != 0 && rv.VerdictSeq < st.ReopenedSeq {
					rv.Withdrawn = true
				}
			}
			if e.JSON {
				return printOut(e, "", st)
			}
			return printTaskShow(e, st)
		})
	}
}

// printList prints rows: with --json as {key: rows}, else as a table
// under header, one line a row.
func printList[T any](e *Env, key string, rows []T, header string, line func(w io.Writer, row T)) error {
	if e.JSON {
		return printOut(e, "", map[string]any{key: rows})
	}
	w := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	for _, r := range rows {
		line(w, r)
	}
	return w.Flush()
}

func printTaskShow(e *Env, st taskShowJSON) error {
	w := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "BUSINESS\tPROJECT\tTASK\tSTATE\tLAST PUSH\tPUSHED BY\tPUSHED AT")
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", st.Business, st.Project, st.Task, st.State, cmp.Or(st.LastPush, "-"), cmp.Or(st.LastPushGrant, "-"), cmp.Or(st.LastPushTime, "-"))
	if err := w.Flush(); err != nil {
		return err
	}
	if len(st.Reviews) > 0 {
		fmt.Fprintln(e.Stdout)
		fmt.Fprintln(w, "REQUEST\tCOMMIT\tREQUESTED BY\tVERDICT\tVERDICT COMMIT\tREVIEWER\tEVENT")
		for _, rv := range st.Reviews {
			verdict := rv.Verdict
			switch {
			case verdict == "":
				verdict = "pending"
			case rv.Withdrawn:
				verdict += " (withdrawn by reopen)"
			}
			event := "-"
			if rv.VerdictSeq != 0 {
				event = fmt.Sprint(rv.VerdictSeq)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", rv.RequestID, rv.Commit, rv.RequestedBy, verdict, cmp.Or(rv.VerdictCommit, "-"), cmp.Or(rv.Reviewer, "-"), event)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		// The reviewers' comments, whole, under the table: each line of one
		// indented, so that no comment can pass for a row.
		for _, rv := range st.Reviews {
			if rv.Comment == "" {
				continue
			}
			fmt.Fprintf(e.Stdout, "\ncomment on %s (%s, event %d):\n", rv.RequestID, rv.Verdict, rv.VerdictSeq)
			for _, line := range strings.Split(strings.TrimRight(rv.Comment, "\n"), "\n") {
				fmt.Fprintf(e.Stdout, "    %s\n", line)
			}
		}
	}
	if l := st.Landing; l != nil {
		fmt.Fprintln(e.Stdout)
		fmt.Fprintln(w, "LANDED\tCOMMIT\tMAIN OLD\tMAIN NEW\tMERGE")
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", l.Seq, l.Commit, l.MainOld, l.MainNew, cmp.Or(l.Merge, "-"))
		if err := w.Flush(); err != nil {
			return err
		}
	}
	if st.NeedsRepair != "" {
		fmt.Fprintf(e.Stdout, "\nneeds repair: %s\n  the host runs: bushost task repair --business %s --project %s --task %s\n", st.NeedsRepair, st.Business, st.Project, st.Task)
	}
	return nil
}

// launchText is a launch set as grant's flags take it:
// "worker=git.push.working;reviewer=review.verdict;net=none,proxy;max-memory=1G;tasks=t*",
// "-" for none.
func launchText(m map[string][]string, lb bounds.Launch) string {
	if len(m) == 0 && lb.IsZero() {
		return "-"
	}
	var parts []string
	for _, role := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, role+"="+strings.Join(m[role], ","))
	}
	if len(lb.Nets) > 0 {
		parts = append(parts, "net="+strings.Join(lb.Nets, ","))
	}
	for _, name := range slices.Sorted(maps.Keys(lb.Max)) {
		parts = append(parts, "max-"+name+"="+lb.Max[name])
	}
	if lb.Tasks != "" {
		parts = append(parts, "tasks="+lb.Tasks)
	}
	if len(lb.AllowDomains) > 0 {
		parts = append(parts, "allow-domain="+strings.Join(lb.AllowDomains, ","))
	}
	if len(lb.AllowHosts) > 0 {
		parts = append(parts, "allow-host="+strings.Join(lb.AllowHosts, ","))
	}
	return strings.Join(parts, ";")
}
