package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
)

func init() {
	register(&command{
		words: "task list",
		short: "list tasks with their state and latest push",
		usage: "task list [--business B] [--project P] [--state open|closed|landed]",
		help: "List tasks with their state and latest push, as a table (--json: {\"tasks\":[...]}, docs/broker.md). " +
			"The host sees every task; a grant sees its own only.",
		setup: runTaskList,
	})
}

// taskJSON is the stable --json shape of one task (docs/broker.md).
type taskJSON struct {
	Business    string `json:"business"`
	Project     string `json:"project"`
	Task        string `json:"task"`
	State       string `json:"state"`
	LastPush    string `json:"last_push"`
	LastPushSeq int64  `json:"last_push_seq"`
	LandedSeq   int64  `json:"landed_seq"`
}

func runTaskList(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "only this business")
	project := fs.String("project", "", "only this project")
	state := fs.String("state", "", "only tasks in this state: open, closed or landed")
	return func(ctx context.Context, e *Env, args []string) error {
		switch *state {
		case "", "open", "closed", "landed":
		default:
			return usagef("--state is open, closed or landed")
		}
		return unary(ctx, e, func(ctx context.Context, c brokerv1.BrokerServiceClient) error {
			r, err := c.ListTasks(ctx, &brokerv1.ListTasksRequest{Business: *business, Project: *project, State: *state})
			if err != nil {
				return err
			}
			tasks := []taskJSON{}
			for _, t := range r.GetTasks() {
				tasks = append(tasks, taskJSON{Business: t.GetBusiness(), Project: t.GetProject(), Task: t.GetTask(), State: t.GetState(),
					LastPush: t.GetLastPushCommit(), LastPushSeq: t.GetLastPushSeq(), LandedSeq: t.GetLandedSeq()})
			}
			return printList(e, "tasks", tasks, "BUSINESS\tPROJECT\tTASK\tSTATE\tLAST PUSH", func(w io.Writer, t taskJSON) {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.Business, t.Project, t.Task, t.State, cmp.Or(t.LastPush, "-"))
			})
		})
	}
}
