package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/home"
)

// The session commands talk to sandbox serve's launch.sock in the home:
// a grant with session.launch starts sessions and sees those it started;
// the host sees them all.

func init() {
	register(&command{
		words: "session launch",
		short: "launch a confined session (sandbox serve)",
		usage: "session launch --task T --role R --caps C,... [--memory SIZE] [--pids N] [--cpu F] [--nofile N] [--fsize SIZE] [--timeout D] [--disk SIZE] [--net=MODE] [--allow-domain D]... [--allow-host H:P]... [--workspace DIR] -- COMMAND...",
		help:  "Launch a session for task T of the launcher grant's project (sandbox serve on launch.sock), with a role and capabilities from the grant's --launch set; prints the session id. Its network and limits are at most what the grant's launch set allows and, from inside a session, what that session has; a limit not given gets sandbox serve's default, bounded the same way.",
		args:  cobra.ArbitraryArgs,
		setup: runSessionLaunch,
	})
	register(&command{
		words: "session list",
		short: "list launched sessions",
		usage: "session list [--json]",
		help:  "List the sessions the caller launched (the host: every session): id, task, role, uid, state, started, exit.",
		setup: runSessionList,
	})
	register(&command{
		words: "session wait",
		short: "wait for a session and exit with its status",
		usage: "session wait ID",
		help:  "Wait for session ID to end and exit with its status (124 for a timeout, 128+n for a signal; 1 with a message for a lost session).",
		args:  cobra.ArbitraryArgs,
		setup: runSessionWait,
	})
	register(&command{
		words: "session stop",
		short: "stop a session",
		usage: "session stop ID",
		help:  "Stop session ID: SIGTERM, then SIGKILL after sandbox serve's --stop-grace; returns once it has ended.",
		args:  cobra.ArbitraryArgs,
		setup: runSessionStop,
	})
	register(&command{
		words: "session rm",
		short: "remove an ended session and its workspace",
		usage: "session rm ID",
		help:  "Remove session ID, which has ended: the workspace the launcher made for it (with --disk, its whole disk), its output and its record; it is listed no more. A workspace of the caller's own (--workspace) is left alone. Without it, the launcher removes that workspace sandbox serve's --keep-workspaces after the session ended.",
		args:  cobra.ArbitraryArgs,
		setup: runSessionRm,
	})
	register(&command{
		words: "session logs",
		short: "print a session's output",
		usage: "session logs ID [--follow]",
		help:  "Print session ID's stdout and then its stderr (to stderr), as kept by the launcher: the last 1 MiB of each. --follow keeps printing what it writes until it ends.",
		args:  cobra.ArbitraryArgs,
		setup: runSessionLogs,
	})
}

// statusExit makes the command exit with this status and print nothing
// more (session wait exits with the session's own status).
type statusExit int

func (s statusExit) Error() string { return fmt.Sprintf("exit %d", int(s)) }

// launchCall runs one call with the launch client. Without a deadline
// of its own (wait, stop), only --timeout bounds it.
func launchCall(ctx context.Context, e *Env, bounded bool, call func(ctx context.Context, c launchv1.LaunchServiceClient) error) error {
	limit := e.Timeout
	if bounded {
		limit = callTimeout
	}
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	conn, ctx, err := e.dial(ctx, home.LaunchSockName)
	if err != nil {
		return err
	}
	defer conn.Close()
	return call(ctx, launchv1.NewLaunchServiceClient(conn))
}

func runSessionLaunch(fs *pflag.FlagSet) runFunc {
	var business, project string
	task := fs.String("task", "", "the task (of the launcher grant's business and project)")
	role := fs.String("role", "", "the session's role: one of the launcher grant's --launch roles")
	var caps capsFlag
	fs.Var(&caps, "caps", "the session's capabilities, comma-separated: each in the role's --launch set")
	limits := map[string]*string{}
	for _, l := range bounds.Limits {
		limits[l.Name] = fs.String(l.Name, "", l.Help+" (default sandbox serve's --default-"+l.Name+", within the grant's and the calling session's)")
	}
	net := fs.String("net", "none", "the session's network: none, proxy or host (one the grant's --launch-net names)")
	domains := fs.StringArray("allow-domain", nil, "with --net=proxy: a domain (or *.NAME), with :PORT or else 443 and 80, the session may reach, within the grant's --launch-allow-domain (repeatable; default the grant's)")
	hosts := fs.StringArray("allow-host", nil, "with --net=proxy: a HOST:PORT the session may reach, within the grant's --launch-allow-host (repeatable; default the grant's)")
	ws := fs.String("workspace", "", "the session's workspace: an existing directory of yours (default: an empty one the launcher makes)")
	fs.StringVar(&business, "business", "", "the task's business (default the launcher grant's)")
	fs.StringVar(&project, "project", "", "the task's project (default the launcher grant's)")
	return func(ctx context.Context, e *Env, args []string) error {
		if err := required("task", *task, "role", *role); err != nil {
			return err
		}
		if len(caps) == 0 {
			return usagef("--caps is required")
		}
		if len(args) == 0 {
			return usagef("give the command after --")
		}
		asked := map[string]string{}
		for name, v := range limits {
			if *v != "" {
				asked[name] = *v
			}
		}
		if _, err := bounds.ParseValues(asked); err != nil {
			return usagef("%v", err)
		}
		dir := *ws
		if dir != "" {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return err
			}
			dir = abs
		}
		return launchCall(ctx, e, true, func(ctx context.Context, c launchv1.LaunchServiceClient) error {
			r, err := c.Launch(ctx, &launchv1.LaunchRequest{Business: business, Project: project, Task: *task, Role: *role, Capabilities: caps,
				Command: args, Workspace: dir, Net: *net, Limits: asked, AllowDomains: *domains, AllowHosts: *hosts})
			if err != nil {
				return err
			}
			return printOut(e, r.Session.Id, sessionJSON(r.Session))
		})
	}
}

func sessionJSON(s *launchv1.Session) map[string]any {
	return map[string]any{"id": s.Id, "business": s.Business, "project": s.Project, "task": s.Task, "role": s.Role,
		"capabilities": s.Capabilities, "grant_id": s.GrantId, "launcher_grant_id": s.LauncherGrantId, "uid": s.Uid,
		"state": s.State, "started": s.Started, "ended": s.Ended, "exit": s.Exit, "command": s.Command,
		"net": s.Net, "limits": s.Limits}
}

func runSessionList(fs *pflag.FlagSet) runFunc {
	return func(ctx context.Context, e *Env, args []string) error {
		return launchCall(ctx, e, true, func(ctx context.Context, c launchv1.LaunchServiceClient) error {
			r, err := c.List(ctx, &launchv1.ListRequest{})
			if err != nil {
				return err
			}
			if e.JSON {
				for _, s := range r.Sessions {
					if err := printOut(e, "", sessionJSON(s)); err != nil {
						return err
					}
				}
				return nil
			}
			fmt.Fprintf(e.Stdout, "%-15s %-20s %-10s %-6s %-8s %-20s %s\n", "ID", "TASK", "ROLE", "UID", "STATE", "STARTED", "EXIT")
			for _, s := range r.Sessions {
				exit := "-"
				if s.State == "exited" {
					exit = fmt.Sprint(s.Exit)
				}
				fmt.Fprintf(e.Stdout, "%-15s %-20s %-10s %-6d %-8s %-20s %s\n", s.Id, s.Task, s.Role, s.Uid, s.State, s.Started, exit)
			}
			return nil
		})
	}
}

// sessionCall is a command naming one session (its one argument) whose
// work is one launcher call (launchCall, bounded if bounded() says so).
func sessionCall(bounded func() bool, call func(ctx context.Context, e *Env, c launchv1.LaunchServiceClient, id string) error) runFunc {
	return func(ctx context.Context, e *Env, args []string) error {
		if len(args) != 1 || strings.TrimSpace(args[0]) == "" {
			return usagef("give exactly one session ID")
		}
		return launchCall(ctx, e, bounded(), func(ctx context.Context, c launchv1.LaunchServiceClient) error {
			return call(ctx, e, c, args[0])
		})
	}
}

// sessionStatus is how a command ends for an ended session: its own exit
// status, or 1 with a message for a lost one.
func sessionStatus(e *Env, s *launchv1.Session) error {
	if e.JSON {
		if err := printOut(e, "", sessionJSON(s)); err != nil {
			return err
		}
	}
	if s.State == "lost" {
		fmt.Fprintf(e.Stderr, "bushost: session %s ended while no launcher ran and left no exit status (lost)\n", s.Id)
		return statusExit(1)
	}
	return statusExit(s.Exit)
}

func runSessionWait(fs *pflag.FlagSet) runFunc {
	return sessionCall(func() bool { return false }, func(ctx context.Context, e *Env, c launchv1.LaunchServiceClient, id string) error {
		r, err := c.Wait(ctx, &launchv1.WaitRequest{Id: id})
		if err != nil {
			return err
		}
		return sessionStatus(e, r.Session)
	})
}

func runSessionStop(fs *pflag.FlagSet) runFunc {
	return sessionCall(func() bool { return false }, func(ctx context.Context, e *Env, c launchv1.LaunchServiceClient, id string) error {
		r, err := c.Stop(ctx, &launchv1.StopRequest{Id: id})
		if err != nil {
			return err
		}
		return printOut(e, fmt.Sprintf("session %s %s (exit %d)", r.Session.Id, r.Session.State, r.Session.Exit), sessionJSON(r.Session))
	})
}

func runSessionRm(fs *pflag.FlagSet) runFunc {
	return sessionCall(func() bool { return true }, func(ctx context.Context, e *Env, c launchv1.LaunchServiceClient, id string) error {
		r, err := c.Remove(ctx, &launchv1.RemoveRequest{Id: id})
		if err != nil {
			return err
		}
		return printOut(e, "removed session "+r.Session.Id, sessionJSON(r.Session))
	})
}

func runSessionLogs(fs *pflag.FlagSet) runFunc {
	follow := fs.Bool("follow", false, "keep printing what the session writes until it has ended")
	return sessionCall(func() bool { return !*follow }, func(ctx context.Context, e *Env, c launchv1.LaunchServiceClient, id string) error {
		if !*follow {
			return sessionTail(ctx, e, c, id)
		}
		req := &launchv1.LogsRequest{Id: id}
		for {
			r, err := c.Logs(ctx, req)
			if err != nil {
				return err
			}
			if err := printLogs(e, r.Stdout, r.Stderr, r.Truncated); err != nil {
				return err
			}
			if r.Ended {
				return nil
			}
			req = &launchv1.LogsRequest{Id: id, FromOffsets: true, StdoutOffset: r.StdoutNext, StderrOffset: r.StderrNext}
			if r.Truncated || len(r.Stdout)+len(r.Stderr) > 0 {
				continue
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
}

// sessionTail prints the tail of a session's output: an answer carries a
// chunk of each stream, and the next ones follow its offsets until one
// says nothing more is there (a session writes at most 16 MiB of each).
func sessionTail(ctx context.Context, e *Env, c launchv1.LaunchServiceClient, id string) error {
	var out, errb []byte
	req := &launchv1.LogsRequest{Id: id}
	truncated := false
	for first := true; ; first = false {
		r, err := c.Logs(ctx, req)
		if err != nil {
			return err
		}
		if first {
			// Whatever lies before the first chunk was left out.
			truncated = r.StdoutNext > int64(len(r.Stdout)) || r.StderrNext > int64(len(r.Stderr))
		}
		out, errb = append(out, r.Stdout...), append(errb, r.Stderr...)
		if !r.Truncated || len(r.Stdout)+len(r.Stderr) == 0 {
			break
		}
		req = &launchv1.LogsRequest{Id: id, FromOffsets: true, StdoutOffset: r.StdoutNext, StderrOffset: r.StderrNext}
	}
	return printLogs(e, out, errb, truncated)
}

// printLogs prints a session's output: stdout and stderr to the client's
// own, or with --json one object holding both.
func printLogs(e *Env, stdout, stderr []byte, truncated bool) error {
	if e.JSON {
		return printOut(e, "", map[string]any{"stdout": string(stdout), "stderr": string(stderr), "truncated": truncated})
	}
	if _, err := e.Stdout.Write(stdout); err != nil {
		return err
	}
	_, err := e.Stderr.Write(stderr)
	return err
}
