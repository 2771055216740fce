// Command supervisor runs the services an agent may edit, commits the agent's
// edits, and reverts an edit that leaves a service crash-looping. The logic
// lives in internal/supervisor; this file is flags, wiring and exit codes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/bushost/bushost/internal/supervisor"
)

const usage = `usage:
  supervisor run  --config FILE              supervise the services of FILE's workspace
  supervisor init --config FILE --seed DIR   as root: users, seed, ownership, AGENTS.md,
                                             then drop to user app and run
  supervisor --help

The configuration file is described in internal/supervisor/README.md.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case supervisor.ShimArg:
		return supervisor.RunShim(args[1:])
	case "run":
		fs, config := flags("run", stderr)
		if err := fs.Parse(args[1:]); err != nil {
			return exitParse(err)
		}
		return runSupervisor(*config, stderr)
	case "init":
		fs, config := flags("init", stderr)
		seed := fs.String("seed", "", "directory that seeds the workspace on first boot")
		if err := fs.Parse(args[1:]); err != nil {
			return exitParse(err)
		}
		return initWorkspace(*config, *seed, stderr)
	}
	fmt.Fprintf(stderr, "supervisor: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func flags(name string, stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("supervisor "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "TOML configuration file (required)")
	return fs, config
}

func exitParse(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

func runSupervisor(config string, stderr io.Writer) int {
	if config == "" {
		fmt.Fprint(stderr, "supervisor run: --config FILE is required\n")
		return 2
	}
	cfg, err := supervisor.LoadConfig(config)
	if err != nil {
		fmt.Fprintf(stderr, "supervisor: %v\n", err)
		return 2
	}
	if os.Geteuid() == 0 {
		fmt.Fprint(stderr, "supervisor: warning: running as root; services run as root too (use `supervisor init` to drop to user app)\n")
	}
	s, err := supervisor.New(cfg, supervisor.Options{Log: stderr})
	if err != nil {
		fmt.Fprintf(stderr, "supervisor: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := s.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "supervisor: %v\n", err)
		return 1
	}
	return 0
}

func initWorkspace(config, seed string, stderr io.Writer) int {
	if config == "" || seed == "" {
		fmt.Fprint(stderr, "supervisor init: --config FILE and --seed DIR are required\n")
		return 2
	}
	abs, err := filepath.Abs(config)
	if err != nil {
		fmt.Fprintf(stderr, "supervisor: %v\n", err)
		return 2
	}
	cfg, err := supervisor.LoadConfig(abs)
	if err != nil {
		fmt.Fprintf(stderr, "supervisor: %v\n", err)
		return 2
	}
	app, err := supervisor.Prepare(context.Background(), cfg, abs, seed, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "supervisor init: %v\n", err)
		return 1
	}
	err = supervisor.DropAndExec(app, []string{"run", "--config", abs})
	fmt.Fprintf(stderr, "supervisor init: run as %s: %v\n", app.Name, err)
	return 1
}
