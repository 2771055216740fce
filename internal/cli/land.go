package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
)

func init() {
	register(&command{
		words: "task land",
		short: "put the approved push on main and close the task",
		usage: "task land [--business B --project P --task T] [--merge] [--force]",
		help: "Put the task's approved latest push on main and close the task, under the same gate as 'task close'. " +
			"The host names the task; a grant with task.land lands its own. main fast-forwards; if main moved, " +
			"--merge has the server commit a merge (MERGE_CONFLICT lists the conflicting paths on stdout, one per line), " +
			"bounded by bushostd --merge-timeout (MERGE_TIMEOUT). A refused merge is recorded: the same push lands only with --force (LAND_REFUSED).",
		setup: runTaskLand,
	})
}

func runTaskLand(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "business name (host)")
	project := fs.String("project", "", "project name (host)")
	task := fs.String("task", "", "task name (host)")
	merge := fs.Bool("merge", false, "if main moved since the approved commit, merge it on the server instead of refusing with MAIN_MOVED")
	force := fs.Bool("force", false, "land a push whose earlier landing was refused (its merge conflicted or ran past bushostd --merge-timeout) instead of refusing with LAND_REFUSED")
	return func(ctx context.Context, e *Env, args []string) error {
		named := *business != "" || *project != "" || *task != ""
		if named && (*business == "" || *project == "" || *task == "") {
			return usagef("the host gives all of --business, --project and --task; a grant gives none")
		}
		return e.gitCall(ctx, callTimeout, func(ctx context.Context, c gitv1.GitServiceClient) error {
			res, err := c.LandTask(ctx, &gitv1.LandTaskRequest{Business: *business, Project: *project, Task: *task, Merge: *merge, Force: *force})
			if err != nil {
				if x, ok := errdefs.As(err); ok && x.Reason == errdefs.MergeConflict {
					printConflicts(e, x.Metadata["paths"])
				}
				return err
			}
			text := fmt.Sprintf("landed %s: main %s -> %s (event %d)", res.GetCommit(), res.GetMainOld(), res.GetMainNew(), res.GetSeq())
			if res.GetMerge() != "" {
				text = fmt.Sprintf("landed %s: main %s -> merge %s (event %d)", res.GetCommit(), res.GetMainOld(), res.GetMerge(), res.GetSeq())
			}
			return printOut(e, text, map[string]any{"commit": res.GetCommit(), "main_old": res.GetMainOld(),
				"main_new": res.GetMainNew(), "merge": res.GetMerge(), "seq": res.GetSeq()})
		})
	}
}

// printConflicts lists a MERGE_CONFLICT's paths on stdout: one per line,
// or with --json {"conflicts":[...]}; the error itself goes to stderr.
func printConflicts(e *Env, paths string) {
	list := strings.FieldsFunc(paths, func(r rune) bool { return r == '\n' })
	if e.JSON {
		json.NewEncoder(e.Stdout).Encode(map[string]any{"conflicts": list})
		return
	}
	for _, p := range list {
		fmt.Fprintln(e.Stdout, p)
	}
}

func init() {
	register(&command{
		words: "project publish",
		short: "write main to a branch of the project's root",
		usage: "project publish --business B --project P [--branch NAME] [--force]",
		help: "Host: write main to a branch of the project's root (default bushost/main), never its checked-out branch; " +
			"a fast-forward unless --force. The root's work tree and index are left alone: merge the branch there, then 'project sync'.",
		setup: runProjectPublish,
	})
}

func runProjectPublish(fs *pflag.FlagSet) runFunc {
	branch := fs.String("branch", "bushost/main", "the root's branch to write main to")
	force := fs.Bool("force", false, "move the branch even if main does not descend from it")
	return hostProjectGit(fs, callTimeout, func(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project string) error {
		res, err := c.PublishProject(ctx, &gitv1.PublishProjectRequest{Business: business, Project: project, Branch: *branch, Force: *force})
		if err != nil {
			return err
		}
		return printOut(e, res.GetCommit(), map[string]any{"commit": res.GetCommit(), "previous": res.GetPrevious(), "branch": res.GetBranch()})
	})
}

func init() {
	register(&command{
		words: "task reopen",
		short: "reopen a closed task that did not land",
		usage: "task reopen --business B --project P --task T",
		help:  "Host: reopen a closed task (task.reopened) so that it takes pushes again; a landed task is refused TASK_LANDED.",
		setup: runTaskReopen,
	})
}

func runTaskReopen(fs *pflag.FlagSet) runFunc {
	return hostTask(fs, func(ctx context.Context, e *Env, business, project, task string) error {
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			r, err := c.ReopenTask(ctx, &brokerv1.ReopenTaskRequest{Business: business, Project: project, Task: task})
			if err != nil {
				return err
			}
			return printOut(e, fmt.Sprintf("reopened (event %d)", r.GetSeq()), map[string]any{"reopened": true, "seq": r.GetSeq()})
		})
	})
}
