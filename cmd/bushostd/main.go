// Command bushostd is the bus host daemon; see internal/daemon.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/daemon"
)

const serveLong = `serve makes the home (0700; 0710 with --socket-group) if missing and
serves there:
  git.sock      GitService (0660)
  broker.sock   BrokerService (0660)
  admin.token   the host's credential (0600, made at first start)
  broker.db     the broker's store, unless --broker-dsn postgres://...
  repos/<business>/<project>.git

One bushostd per home: a second refuses to start and names the first.
SIGTERM or SIGINT drains: calls in flight finish, new calls get
Unavailable, and bushostd exits 0.`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	root := cmdline.Root("bushostd", "bushostd: the bus host daemon",
		"bushostd: the bus host daemon.\n\nusage: bushostd serve [--home DIR] [--broker-dsn DSN] [--max-bundle-bytes SIZE] [limits...]\n\n"+serveLong)
	var o daemon.Options
	serve := &cobra.Command{
		Use:   "serve",
		Short: "serve git.sock and broker.sock on the home",
		Long:  serveLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return cmdline.Failed(daemon.Serve(ctx, o))
		},
	}
	o.AddFlags(serve.Flags())
	root.AddCommand(serve)
	return cmdline.Execute(root, args, stdout, stderr)
}
