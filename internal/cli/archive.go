package cli

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
)

func init() {
	register(&command{
		words: "task archive",
		usage: "task archive --business B --project P --task T",
		help:  "Host: remove a closed or landed task's repository (its events stay in the log; what landed is in the project's pool). An open task is refused with TASK_NOT_CLOSED.",
		setup: runTaskArchive,
	})
}

func runTaskArchive(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "business name")
	project := fs.String("project", "", "project name")
	task := fs.String("task", "", "task name")
	return func(ctx context.Context, e *Env, args []string) error {
		if *business == "" || *project == "" || *task == "" {
			return usagef("--business, --project and --task are required")
		}
		c, ctx, closeConn, err := e.gitClient(ctx)
		if err != nil {
			return err
		}
		defer closeConn()
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		res, err := c.ArchiveTask(ctx, &gitv1.ArchiveTaskRequest{Business: *business, Project: *project, Task: *task})
		if err != nil {
			return err
		}
		text := fmt.Sprintf("archived: the repository of %s/%s/%s is removed (%d bytes); its events stay in the log", *business, *project, *task, res.GetBytes())
		if !res.GetRemoved() {
			text = fmt.Sprintf("%s/%s/%s has no repository (no push, or archived before): nothing to remove", *business, *project, *task)
		}
		return gitPrint(e, text, map[string]any{"task": *business + "/" + *project + "/" + *task, "removed": res.GetRemoved(), "bytes": res.GetBytes()})
	}
}
