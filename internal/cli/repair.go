package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
)

func init() {
	register(&command{
		words: "task repair",
		usage: "task repair --business B --project P --task T",
		help:  "Host: resolve a task marked TASK_NEEDS_REPAIR by the log: restore its ref from the pack kept, or record that its push is lost.",
		setup: runTaskRepair,
	})
}

func runTaskRepair(fs *pflag.FlagSet) runFunc {
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
		res, err := c.RepairTask(ctx, &gitv1.RepairTaskRequest{Business: *business, Project: *project, Task: *task})
		if err != nil {
			return err
		}
		text := fmt.Sprintf("restored: refs/work/%s is %s again (event %d)", *task, res.GetCommit(), res.GetSeq())
		if res.GetOutcome() != "restored" {
			at := res.GetRefCommit()
			if at == "" {
				at = "nothing (no push)"
			}
			text = fmt.Sprintf("push %s is lost: its objects are gone; the task's latest push is now %s (event %d)", res.GetCommit(), at, res.GetSeq())
		}
		return gitPrint(e, text, map[string]any{"outcome": res.GetOutcome(), "commit": res.GetCommit(), "ref_commit": res.GetRefCommit(), "seq": res.GetSeq()})
	}
}

func init() {
	register(&command{
		words: "task show",
		usage: "task show --business B --project P --task T",
		help:  "Show a task's state as its log tells it: open or closed, its latest push, and whether (and why) it needs the host's repair.",
		setup: runTaskShow,
	})
}

// runTaskShow reads the task's events and tells its state; the server's
// log is the whole source, the client only summarizes it.
func runTaskShow(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "business name")
	project := fs.String("project", "", "project name")
	task := fs.String("task", "", "task name")
	return func(ctx context.Context, e *Env, args []string) error {
		if *business == "" || *project == "" || *task == "" {
			return usagef("--business, --project and --task are required")
		}
		c, ctx, done, err := e.brokerClient(ctx)
		if err != nil {
			return err
		}
		defer done()
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		stream, err := c.ListEvents(ctx, &brokerv1.ListEventsRequest{Business: *business, Project: *project, Task: *task})
		if err != nil {
			return err
		}
		st := map[string]any{"task": *business + "/" + *project + "/" + *task, "state": "unknown", "last_push": "", "needs_repair": ""}
		for {
			r, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			ev := r.GetEvent()
			var data map[string]any
			json.Unmarshal([]byte(ev.GetData()), &data)
			switch ev.GetType() {
			case "task.added":
				st["state"] = "open"
			case "task.closed":
				st["state"] = "closed"
			case "action.allowed":
				st["last_push"] = data["commit"]
			case "task.needs_repair":
				st["needs_repair"] = fmt.Sprintf("%v (event %d)", data["reason"], ev.GetSeq())
			case "task.repaired":
				st["needs_repair"] = ""
				if data["outcome"] == "push_lost" {
					st["last_push"] = data["ref_commit"]
				}
			}
		}
		if st["state"] == "unknown" {
			return fmt.Errorf("no task %s", st["task"])
		}
		text := fmt.Sprintf("task %s: %s; latest push %v", st["task"], st["state"], st["last_push"])
		if st["last_push"] == "" || st["last_push"] == nil {
			text = fmt.Sprintf("task %s: %s; no push", st["task"], st["state"])
		}
		if st["needs_repair"] != "" {
			text += fmt.Sprintf("\nneeds repair: %s\n  the host runs: bushost task repair --business %s --project %s --task %s", st["needs_repair"], *business, *project, *task)
		}
		return gitPrint(e, text, st)
	}
}
