// Command supervisor runs the services an agent may edit, commits the agent's
// edits, and reverts an edit that leaves a service crash-looping. The logic
// lives in internal/supervisor; this file is flags, wiring and exit codes.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/supervisor"
)

const usage = `usage:
  supervisor run  --config FILE              supervise the services of FILE's workspace
  supervisor init --config FILE --seed DIR   as root: users, seed, ownership, AGENTS.md,
                                             then drop to user app and run
  (both take --log-format text|json and --log-level debug|info|warn|error)
  supervisor ack  --config FILE              as root or the supervisor's user: acknowledge the
                                             files a first commit adopted without history
  supervisor --version | --help | help COMMAND
`

// reference says where the configuration file is described: the
// installed reference if there is one beside this binary, else where make
// install and the source put it.
func reference() string {
	if p := cmdline.InstalledDoc("supervisor.md"); p != "" {
		return "The configuration file is described in " + p + ";\nan example is in " + filepath.Join(filepath.Dir(p), "examples", "supervisor.toml") + ".\n"
	}
	return "The configuration file is described in supervisor.md of the installed docs\n" +
		"(make install: /usr/local/share/doc/bushost), internal/supervisor/README.md in the source.\n"
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	// The shim a service runs under is this binary too: it goes first.
	if len(args) > 0 && args[0] == supervisor.ShimArg {
		return supervisor.RunShim(args[1:])
	}
	root := cmdline.Root("supervisor", "supervisor: run the services an agent may edit", "supervisor: run the services an agent may edit.\n\n"+usage+"\n"+reference())
	// sub is a subcommand whose flag set (writing to w) gives what it
	// runs once parsed.
	sub := func(name, short, long string, flags func(w io.Writer) (*flag.FlagSet, func() int)) *cobra.Command {
		return cmdline.Passthrough(name, short, long,
			func(w io.Writer) { fs, _ := flags(w); fs.PrintDefaults() },
			func(args []string) int {
				fs, run := flags(io.Discard)
				if err := fs.Parse(args); err != nil {
					return exitParse(name, err, stderr)
				}
				return run()
			})
	}
	root.AddCommand(
		sub("run", "supervise the services of a workspace",
			"usage: supervisor run --config FILE [--log-format text|json] [--log-level LEVEL]\n\nsupervise the services of FILE's workspace.\n\n"+reference(),
			func(w io.Writer) (*flag.FlagSet, func() int) {
				fs, config, lf := flags("run", w)
				return fs, func() int { return runSupervisor(*config, lf, stderr) }
			}),
		sub("init", "as root: users, seed, ownership, then run as app",
			"usage: supervisor init --config FILE --seed DIR [--log-format text|json] [--log-level LEVEL]\n\nas root: make the users, seed the workspace, hand it over, write AGENTS.md,\nthen drop to user app and run.\n\n"+reference(),
			func(w io.Writer) (*flag.FlagSet, func() int) {
				fs, config, lf := flags("init", w)
				seed := fs.String("seed", "", "directory that seeds the workspace on first boot")
				return fs, func() int { return initWorkspace(*config, *seed, lf, stderr) }
			}),
		sub("ack", "acknowledge files adopted without history",
			"usage: supervisor ack --config FILE\n\nas root or the supervisor's user (app): acknowledge the first commit of a\nworkspace whose git_dir held no history (/status awaiting_ack), so that it\nmay become good once healthy for good_after. The agent cannot: git_dir is\nnot its to write.\n\n"+reference(),
			func(w io.Writer) (*flag.FlagSet, func() int) {
				fs := flag.NewFlagSet("supervisor ack", flag.ContinueOnError)
				fs.SetOutput(w)
				config := fs.String("config", "", "TOML configuration file (required)")
				return fs, func() int { return ack(*config, stdout, stderr) }
			}),
	)
	return cmdline.Execute(root, args, stdout, stderr)
}

// logFlags are --log-format and --log-level, as bushostd has them.
type logFlags struct{ format, level string }

// args gives them back to `supervisor run`, which init executes.
func (l *logFlags) args() []string {
	return []string{"--log-format", l.format, "--log-level", l.level}
}

func flags(name string, out io.Writer) (*flag.FlagSet, *string, *logFlags) {
	fs := flag.NewFlagSet("supervisor "+name, flag.ContinueOnError)
	fs.SetOutput(out)
	config := fs.String("config", "", "TOML configuration file (required)")
	lf := &logFlags{}
	fs.StringVar(&lf.format, "log-format", "text", "log format: text or json (in json, the services' output lines too)")
	fs.StringVar(&lf.level, "log-level", "info", "least severe log level written: debug, info, warn or error")
	return fs, config, lf
}

func ack(config string, stdout, stderr io.Writer) int {
	if config == "" {
		fmt.Fprint(stderr, "supervisor ack: --config FILE is required\n")
		return 2
	}
	cfg, err := supervisor.LoadConfig(config)
	if err != nil {
		fmt.Fprintf(stderr, "supervisor ack: %v\n", err)
		return 2
	}
	commit, err := supervisor.Ack(cfg)
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "supervisor ack: %v\n", err)
		return 1
	case commit == "":
		fmt.Fprintln(stdout, "nothing to acknowledge: no commit waits for one")
	default:
		fmt.Fprintf(stdout, "acknowledged %s: it becomes good once every service is healthy for good_after\n", commit)
	}
	return 0
}

func exitParse(verb string, err error, stderr io.Writer) int {
	fmt.Fprintf(stderr, "supervisor %s: %v\nRun 'supervisor %s --help' for usage.\n", verb, err, verb)
	return 2
}

// start begins verb: it refuses a missing required flag (missing, with
// the message need) and makes the logger lf chooses. fail writes a failure
// of verb in that format (in JSON, a record like every other line) and
// returns its code. code is not 0 when verb ends here.
func start(verb string, missing bool, need string, lf *logFlags, stderr io.Writer) (log *slog.Logger, fail func(code int, err error) int, code int) {
	if missing {
		fmt.Fprintf(stderr, "supervisor %s: %s\n", verb, need)
		return nil, nil, 2
	}
	log, err := supervisor.NewLogger(stderr, lf.format, lf.level)
	if err != nil {
		fmt.Fprintf(stderr, "supervisor %s: %v\n", verb, err)
		return nil, nil, 2
	}
	return log, func(code int, err error) int {
		if lf.format == "json" {
			log.Error("supervisor "+verb+" failed", "err", err)
		} else {
			fmt.Fprintf(stderr, "supervisor %s: %v\n", verb, err)
		}
		return code
	}, 0
}

func runSupervisor(config string, lf *logFlags, stderr io.Writer) int {
	log, fail, code := start("run", config == "", "--config FILE is required", lf, stderr)
	if code != 0 {
		return code
	}
	cfg, err := supervisor.LoadConfig(config)
	if err != nil {
		return fail(2, err)
	}
	if os.Geteuid() == 0 {
		log.Warn("running as root; services run as root too (use `supervisor init` to drop to user app)")
	}
	s, err := supervisor.New(cfg, supervisor.Options{Log: stderr, LogFormat: lf.format, LogLevel: lf.level})
	if err != nil {
		return fail(1, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := s.Run(ctx); err != nil {
		return fail(1, err)
	}
	return 0
}

func initWorkspace(config, seed string, lf *logFlags, stderr io.Writer) int {
	log, fail, code := start("init", config == "" || seed == "", "--config FILE and --seed DIR are required", lf, stderr)
	if code != 0 {
		return code
	}
	// As a container's PID 1, init reaps: the work goes on in a child.
	if code, ok := supervisor.ReapAsPID1(); ok {
		return code
	}
	// Every line init writes is in the chosen format (fail).
	abs, err := filepath.Abs(config)
	if err != nil {
		return fail(2, err)
	}
	cfg, err := supervisor.LoadConfig(abs)
	if err != nil {
		return fail(2, err)
	}
	app, err := supervisor.Prepare(context.Background(), cfg, abs, seed, log)
	if err != nil {
		return fail(1, err)
	}
	err = supervisor.DropAndExec(app, append([]string{"run", "--config", abs}, lf.args()...))
	return fail(1, fmt.Errorf("run as %s: %w", app.Name, err))
}
