// Command bushostd is the bus host daemon; see internal/daemon.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/bushost/bushost/internal/daemon"
)

const usage = `bushostd: the bus host daemon.

usage: bushostd serve [--home DIR] [--broker-dsn DSN] [--max-bundle-bytes N]
                      [--idle-timeout D] [--drain-timeout D]
                      [--max-conns N] [--max-in-flight N] [--socket-group G]

serve makes DIR (0700; 0710 with --socket-group) if missing and serves there:
  git.sock      GitService (0660)
  broker.sock   BrokerService (0660)
  admin.token   the host's credential (0600, made at first start)
  broker.db     the broker's store, unless --broker-dsn postgres://...
  repos/<business>/<project>.git

One bushostd per home: a second refuses to start and names the first.
SIGTERM or SIGINT drains: calls in flight finish, new calls get
Unavailable, and bushostd exits 0.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] != "serve" {
		fmt.Fprintf(stderr, "bushostd: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	var o daemon.Options
	fs := flag.NewFlagSet("bushostd serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage, "\nflags:\n"); fs.PrintDefaults() }
	fs.StringVar(&o.Home, "home", daemon.DefaultHome, "the bus host's home")
	fs.StringVar(&o.BrokerDSN, "broker-dsn", "", "broker store: empty for SQLite in HOME/broker.db, or postgres://...")
	fs.Int64Var(&o.MaxBundleBytes, "max-bundle-bytes", daemon.DefaultMaxBundle, "largest bundle a push may send")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", daemon.DefaultIdleTimeout, "cut a push stream that sends nothing this long")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", daemon.DefaultDrainTimeout, "on SIGTERM, how long calls in flight may take to finish")
	fs.IntVar(&o.MaxConns, "max-conns", daemon.DefaultMaxConns, "connections per socket")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", daemon.DefaultMaxInFlight, "calls in flight per socket")
	fs.StringVar(&o.SocketGroup, "socket-group", "", "group (name or gid) given the sockets; the home becomes 0710 so that members (sandboxed sessions) reach the sockets and nothing else")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bushostd serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := daemon.Serve(ctx, o); err != nil {
		fmt.Fprintf(stderr, "bushostd: %v\n", err)
		return 1
	}
	return 0
}
