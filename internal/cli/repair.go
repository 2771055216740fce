package cli

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
)

func init() {
	register(&command{
		words: "task repair",
		short: "resolve a task marked TASK_NEEDS_REPAIR",
		usage: "task repair --business B --project P --task T",
		help:  "Host: resolve a task marked TASK_NEEDS_REPAIR by the log: restore its ref from the pack kept, or record that its push is lost.",
		setup: runTaskRepair,
	})
}

// hostTask is a host command naming one task: --business, --project and
// --task, all required.
func hostTask(fs *pflag.FlagSet, run func(ctx context.Context, e *Env, business, project, task string) error) runFunc {
	business, project, task := scopeFlags(fs)
	return func(ctx context.Context, e *Env, args []string) error {
		if *business == "" || *project == "" || *task == "" {
			return usagef("--business, --project and --task are required")
		}
		return run(ctx, e, *business, *project, *task)
	}
}

// hostTaskGit is a hostTask whose work is one call on the git socket.
func hostTaskGit(fs *pflag.FlagSet, call func(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project, task string) error) runFunc {
	return hostTask(fs, func(ctx context.Context, e *Env, business, project, task string) error {
		return e.gitCall(ctx, callTimeout, func(ctx context.Context, c gitv1.GitServiceClient) error {
			return call(ctx, e, c, business, project, task)
		})
	})
}

// hostProjectGit is a host command naming one project (--business and
// --project, both required) whose work is one call on the git socket,
// under timeout. The command's own flags are defined on fs before it.
func hostProjectGit(fs *pflag.FlagSet, timeout time.Duration, call func(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project string) error) runFunc {
	business := fs.String("business", "", "business name")
	project := fs.String("project", "", "project name")
	return func(ctx context.Context, e *Env, args []string) error {
		if *business == "" || *project == "" {
			return usagef("--business and --project are required")
		}
		return e.gitCall(ctx, timeout, func(ctx context.Context, c gitv1.GitServiceClient) error {
			return call(ctx, e, c, *business, *project)
		})
	}
}

// gitCall runs call on a connection to the git socket, under timeout.
func (e *Env) gitCall(ctx context.Context, timeout time.Duration, call func(context.Context, gitv1.GitServiceClient) error) error {
	c, ctx, closeConn, err := e.gitClient(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return call(ctx, c)
}

func runTaskRepair(fs *pflag.FlagSet) runFunc {
	return hostTaskGit(fs, func(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project, task string) error {
		res, err := c.RepairTask(ctx, &gitv1.RepairTaskRequest{Business: business, Project: project, Task: task})
		if err != nil {
			return err
		}
		text := fmt.Sprintf("restored: refs/work/%s is %s again (event %d)", task, res.GetCommit(), res.GetSeq())
		if res.GetOutcome() != "restored" {
			at := cmp.Or(res.GetRefCommit(), "nothing (no push)")
			text = fmt.Sprintf("push %s is lost: its objects are gone; the task's latest push is now %s (event %d)", res.GetCommit(), at, res.GetSeq())
		}
		return printOut(e, text, map[string]any{"outcome": res.GetOutcome(), "commit": res.GetCommit(), "ref_commit": res.GetRefCommit(), "seq": res.GetSeq()})
	})
}
