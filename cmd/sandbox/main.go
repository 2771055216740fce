// Command sandbox confines an agent session with bubblewrap; the logic is in
// internal/sandbox.
//
//	sandbox probe [--user U] [--bwrap PATH]
//	sandbox prepare --run-dir D ... --token-file F
//	sandbox explain [--json] RUN-FLAGS
//	sandbox run RUN-FLAGS -- COMMAND...
//
// and, started by bwrap inside a session only, `sandbox init` as its pid 1.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/bushost/bushost/internal/sandbox"
)

const usage = `usage:
  sandbox probe [--user U] [--bwrap PATH]
  sandbox prepare --run-dir D --business B --project P --task T --role R --caps C,... --token-file F [--git-name N --git-email E]
  sandbox explain [--json] --run-dir D --workspace W --role R --caps C,... --broker-socket S [--git-socket G] [--net] [--ro PATH]...
  sandbox run --run-dir D --workspace W --role R --caps C,... --broker-socket S [--git-socket G] [--net] [--ro PATH]...
              [--memory SIZE] [--pids N] [--cpu F] [--nofile N] [--fsize SIZE] [--timeout D] [--fresh-home]
              [--user U | --uid-range LOW-HIGH] [--state-dir DIR] [--allow-abstract-sockets] -- COMMAND...
  (sandbox run -h lists every flag)
`

func main() {
	// The session's pid 1 is this binary too: it goes first, before any
	// other setup, since every session's start waits for it.
	if len(os.Args) > 1 && os.Args[1] == sandbox.InitVerb {
		os.Exit(sandbox.Init(os.Args[2:], os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case sandbox.InitVerb:
		return sandbox.Init(args[1:], stderr)
	case "probe":
		fs := flag.NewFlagSet("sandbox probe", flag.ContinueOnError)
		fs.SetOutput(stderr)
		user := fs.String("user", "", "the session user to probe as when root (default nobody)")
		bwrap := fs.String("bwrap", "", "the bwrap binary (default /usr/bin/bwrap, else on PATH)")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		msg, err := sandbox.Probe(*user, *bwrap)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintln(stdout, msg)
		return 0
	case "prepare":
		return sandbox.Prepare(args[1:], stdout, stderr)
	case "explain", "run":
		cfg, err := sandbox.ParseFlags(args[0], args[1:], stderr)
		if err != nil {
			if !errors.Is(err, flag.ErrHelp) {
				fmt.Fprintf(stderr, "sandbox %s: %v\n", args[0], err)
			}
			return 2
		}
		plan, err := sandbox.BuildPlan(cfg)
		if err != nil {
			fmt.Fprintf(stderr, "sandbox %s: %v\n", args[0], err)
			if args[0] == "run" {
				return sandbox.ExitSandbox
			}
			return 1
		}
		if args[0] == "explain" {
			if err := sandbox.Explain(stdout, plan, cfg.JSON); err != nil {
				fmt.Fprintf(stderr, "sandbox explain: %v\n", err)
				return 1
			}
			if len(plan.Problems) > 0 {
				return 1
			}
			return 0
		}
		// The session gets the caller's descriptors themselves (bwrap is
		// started directly, with no copying in between); a test's buffer
		// stands for /dev/null.
		status, err := sandbox.Run(plan, asFile(stdin), asFile(stdout), asFile(stderr))
		if err != nil {
			fmt.Fprintf(stderr, "sandbox run: %v\n", err)
			return sandbox.ExitSandbox
		}
		return status
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
}

func asFile(v any) *os.File {
	f, _ := v.(*os.File)
	return f
}
