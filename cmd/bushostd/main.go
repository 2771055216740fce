// Command bushostd is the bus host daemon; see internal/daemon.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/daemon"
	"github.com/bushost/bushost/internal/launch"
)

const serveLong = `serve makes the home (0700; 0710 with --socket-group) if missing and
serves there:
  git.sock      GitService (0660)
  broker.sock   BrokerService (0660)
  admin.token   the host's credential (0600, made at first start)
  broker.db     the broker's store, unless --broker-dsn postgres://...
  repos/<business>/<project>/pool.git          main and what landed
  repos/<business>/<project>/tasks/<task>.git  one task's pushes

One bushostd per home: a second refuses to start and names the first.
Sockets passed by a service manager (LISTEN_FDS, bound to HOME/git.sock
and HOME/broker.sock) are served instead of new ones.

Both sockets answer gRPC health checking and reflection without a token.
One log line per call (--log-format, --log-level); Prometheus metrics
with --metrics-addr. SIGTERM or SIGINT drains: health turns NOT_SERVING
and new calls get Unavailable for --drain-grace, then the sockets close,
calls in flight finish (up to --drain-timeout), and bushostd exits 0.
Once it serves, it prints the commands that come next (text logs only).
See docs/operations.md.`

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
	// The launcher is sandbox serve's: the sandbox binary, every session's
	// pid 1, links no gRPC and becomes this verb.
	// Its flags are listed in its help but checked in run, so that a
	// mistyped one is named as `sandbox serve`'s, the command users type.
	var flags strings.Builder
	launch.ServeFlags([]string{"-h"}, &flags)
	launcher := cmdline.Passthrough("launcher", "serve launch.sock (started as sandbox serve)",
		"usage: bushostd launcher --sandbox PATH [sandbox serve's flags]\n\nserve launch.sock: what `sandbox serve` becomes (docs/launch.md).\n\nFlags:\n"+cmdline.DoubleDash(flags.String()),
		nil,
		func(args []string) int {
			// A mistyped flag is the user's `sandbox serve`'s: named so.
			if err := cmdline.CheckFlags(args, func(w io.Writer) { launch.ServeFlags([]string{"-h"}, w) }); err != nil {
				fmt.Fprintf(stderr, "sandbox serve: %v\nRun 'sandbox serve --help' for usage.\n", err)
				return 2
			}
			return launch.Serve(args, stderr)
		})
	launcher.Hidden = true
	root.AddCommand(launcher)
	return cmdline.Execute(root, args, stdout, stderr)
}
