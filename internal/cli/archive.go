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
		short: "remove a closed or landed task's repository",
		usage: "task archive --business B --project P --task T",
		help:  "Host: remove a closed or landed task's repository (its events stay in the log; what landed is in the project's pool). An open task is refused with TASK_NOT_CLOSED.",
		setup: runTaskArchive,
	})
}

func runTaskArchive(fs *pflag.FlagSet) runFunc {
	return hostTaskGit(fs, func(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project, task string) error {
		res, err := c.ArchiveTask(ctx, &gitv1.ArchiveTaskRequest{Business: business, Project: project, Task: task})
		if err != nil {
			return err
		}
		scope := business + "/" + project + "/" + task
		text := fmt.Sprintf("archived: the repository of %s is removed (%d bytes); its events stay in the log", scope, res.GetBytes())
		if !res.GetRemoved() {
			text = fmt.Sprintf("%s has no repository (no push, or archived before): nothing to remove", scope)
		}
		return printOut(e, text, map[string]any{"task": scope, "removed": res.GetRemoved(), "bytes": res.GetBytes()})
	})
}
