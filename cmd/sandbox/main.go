// Command sandbox confines an agent session with bubblewrap; the logic is in
// internal/sandbox.
//
//	sandbox probe [--user U] [--bwrap PATH]
//	sandbox prepare --run-dir D ... --token-file F
//	sandbox explain [--json] RUN-FLAGS
//	sandbox run RUN-FLAGS -- COMMAND...
//	sandbox serve [--home DIR] [--bus-home DIR] [--max-sessions-per-grant N] ...
//
// and, started by bwrap inside a session only, `sandbox init` as its pid 1
// where no sandbox-init lies beside it (cmd/sandbox-init is the same pid 1
// in a binary that starts faster); started by sandbox serve only,
// `sandbox keep EXIT-FILE RUN-FLAGS`.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/sandbox"
	"github.com/bushost/bushost/internal/sandbox/pid1"
	"github.com/bushost/bushost/internal/testhook"
)

const usage = `usage:
  sandbox --version | --help | help COMMAND
  sandbox probe [--user U] [--bwrap PATH]
  sandbox prepare --run-dir D --business B --project P --task T --role R --caps C,... --token-file F [--git-name N --git-email E]
  sandbox explain [--json] --run-dir D --workspace W --role R --caps C,... --broker-socket S [--git-socket G] [--launch-socket L] [--net=none|proxy|host] [--ro PATH]...
  sandbox run --run-dir D --workspace W --role R --caps C,... --broker-socket S [--git-socket G] [--launch-socket L] [--net=none|proxy|host] [--ro PATH]...
              [--allow-domain NAME[:PORT]]... [--allow-host HOST:PORT]... [--allow-host-address ADDR]... [--resolve-file F] [--audit-token-file F] [--egress-conns N] [--egress-idle D]
              [--memory SIZE] [--pids N] [--cpu F] [--nofile N] [--fsize SIZE] [--timeout D] [--disk SIZE] [--fresh-home]
              [--user U | --uid-range LOW-HIGH] [--state-dir DIR] [--allow-abstract-sockets]
              [--cgroup-parent DIR]... [--end-with PID:START] -- COMMAND...
  sandbox serve [--home DIR] [--bus-home DIR] [--max-sessions-per-grant N] [--max-sessions N] [--max-launch-depth N] [--keep-ended N]
              [--uid-range LOW-HIGH] [--state-dir DIR] [--stop-grace D] [--keep-workspaces D] [--default-LIMIT V]... [socket limits...]
  (sandbox run -h lists every flag)
`

func main() {
	// The session's pid 1 is this binary too: it goes first, before any
	// other setup, since every session's start waits for it.
	if len(os.Args) > 1 && os.Args[1] == pid1.Verb {
		os.Exit(pid1.Main(os.Args[2:], os.Stderr))
	}
	testhook.Step("main")
	status := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	testhook.Step("exit")
	os.Exit(status)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := cmdline.Root("sandbox", "sandbox: confine an agent session with bubblewrap", "sandbox: confine an agent session with bubblewrap.\n\n"+usage)
	root.AddCommand(
		cmdline.Passthrough("probe", "exit 0, or 1 with why bwrap cannot run here",
			"usage: sandbox probe [--user U] [--bwrap PATH]\n\nexit 0, or 1 with why bwrap cannot run here.",
			func(w io.Writer) { probeFlags(w).PrintDefaults() },
			func(args []string) int { return probe(args, stdout, stderr) }),
		cmdline.Passthrough("prepare", "make a session's run directory: session.json, bundle/, home/, tmp/, token",
			"usage: sandbox prepare --run-dir D --business B --project P --task T --role R --caps C,... --token-file F [--git-name N --git-email E]\n\nmake a session's run directory (docs/sandbox.md).",
			func(w io.Writer) { sandbox.ParsePrepareFlags([]string{"-h"}, w) },
			func(args []string) int { return sandbox.Prepare(args, stdout, stderr) }),
		cmdline.Passthrough("explain", "print the bind table: kind, source, target, why",
			"usage: sandbox explain [--json] RUN-FLAGS\n\nprint the bind table of a session: kind, source, target, why.",
			func(w io.Writer) { sandbox.ParseFlags("explain", []string{"-h"}, w) },
			func(args []string) int { return runOrExplain("explain", args, stdin, stdout, stderr, nil) }),
		cmdline.Passthrough("run", "run COMMAND in a session",
			"usage: sandbox run RUN-FLAGS -- COMMAND...\n\nrun COMMAND confined, as a uid of its own when started as root.",
			func(w io.Writer) { sandbox.ParseFlags("run", []string{"-h"}, w) },
			func(args []string) int { return runOrExplain("run", args, stdin, stdout, stderr, nil) }),
	)
	root.AddCommand(cmdline.Passthrough("serve", "serve the launch socket: sessions launched by a grant with session.launch",
		"usage: sandbox serve [--home DIR] [--launch-state STATE] [--bus-home DIR] [--max-sessions-per-grant N] [--max-sessions N] [--max-launch-depth N] [--keep-ended N]\n"+
			"                     [--uid-range LOW-HIGH] [--state-dir DIR] [--stop-grace D] [--keep-workspaces D]\n"+
			"                     [--default-memory SIZE] [--default-pids N] [--default-cpu F] [--default-nofile N] [--default-fsize SIZE]\n"+
			"                     [--default-timeout D] [--default-disk SIZE]\n"+
			"                     [--max-conns N] [--max-in-flight N] [--max-conns-per-uid N] [--max-calls-per-uid N] [--reserved-conns N] [--reserved-calls N]\n"+
			"                     [--max-calls-per-grant N] [--request-timeout D] [--idle-timeout D]\n\n"+
			"serve LaunchService on DIR/launch.sock (docs/launch.md), as root, keeping sessions' state in\n"+
			"STATE, a directory root alone may write (the home when it is root's, else\n"+
			"/var/lib/bushost-launch/HASH-OF-HOME). The server is bushostd's\n"+
			"(next to this executable, else on PATH), which this process becomes: the sandbox links no\n"+
			"gRPC, since it is also every session's pid 1. `bushostd launcher --help` describes every flag.",
		nil,
		func(args []string) int { return serveLauncher(args, stderr) }))
	// keep is sandbox run for a session sandbox serve launched: it leaves
	// the status in EXIT-FILE, for a launcher that is no longer its parent.
	keep := cmdline.Passthrough("keep", "sandbox run, leaving the exit status in a file (started by sandbox serve)", "", nil,
		func(args []string) int {
			if len(args) < 1 {
				fmt.Fprintln(stderr, "sandbox keep: want EXIT-FILE RUN-FLAGS -- COMMAND...")
				return 2
			}
			return keepRun(args[0], args[1:], stdin, stdout, stderr)
		})
	keep.Hidden = true
	root.AddCommand(keep)
	initCmd := cmdline.Passthrough(pid1.Verb, "a session's pid 1 (started by bwrap only)", "", nil,
		func(args []string) int { return pid1.Main(args, stderr) })
	initCmd.Hidden = true
	root.AddCommand(initCmd)
	return cmdline.Execute(root, args, stdout, stderr)
}

func probeFlags(w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sandbox probe", flag.ContinueOnError)
	fs.SetOutput(w)
	fs.String("user", "", "the session user to probe as when root (default nobody)")
	fs.String("bwrap", "", "the bwrap binary (default /usr/bin/bwrap, else on PATH)")
	return fs
}

func probe(args []string, stdout, stderr io.Writer) int {
	fs := probeFlags(io.Discard)
	err := fs.Parse(args)
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err != nil {
		fmt.Fprintf(stderr, "sandbox probe: %v\nRun 'sandbox probe --help' for usage.\n", err)
		return 2
	}
	msg, err := sandbox.Probe(fs.Lookup("user").Value.String(), fs.Lookup("bwrap").Value.String())
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, msg)
	return 0
}

// keepLogBytes bounds what sandbox keep writes of each of a session's
// output streams.
const keepLogBytes = 16 << 20

// keepRun is `sandbox keep EXIT-FILE RUN-FLAGS`: sandbox run for a session
// sandbox serve launched. The session's stdout and stderr reach the files
// keep was given through pipes, at most keepLogBytes of each; its status
// and peak memory are left in EXIT-FILE as it ends.
func keepRun(exitFile string, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var wg sync.WaitGroup
	var ends []*os.File
	pipe := func(dst io.Writer) io.Writer {
		r, w, err := os.Pipe()
		if err != nil {
			return dst // unbounded rather than no session
		}
		ends = append(ends, w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			boundedCopy(dst, r, keepLogBytes)
		}()
		return w
	}
	out, errw := pipe(stdout), pipe(stderr)
	return runOrExplain("run", args, stdin, out, errw, func(status int, peak int64) {
		// The session is gone: its ends of the pipes are closed, ours go
		// now, and the copies reach end of file.
		for _, w := range ends {
			w.Close()
		}
		wg.Wait()
		if err := writeExit(exitFile, status, peak); err != nil {
			fmt.Fprintf(stderr, "sandbox keep: %v\n", err)
		}
	})
}

// boundedCopy copies r to dst up to n bytes, says once that it dropped the
// rest, and drains r to its end so that the writer never blocks.
func boundedCopy(dst io.Writer, r io.Reader, n int64) {
	copied, _ := io.Copy(dst, io.LimitReader(r, n))
	if extra, _ := io.Copy(io.Discard, r); extra > 0 {
		fmt.Fprintf(dst, "\n[sandbox keep: %d bytes beyond the first %d dropped]\n", extra, copied)
	}
}

// runOrExplain runs `sandbox explain` or `sandbox run`; ended, if not nil,
// is told run's status and the session's peak memory as it ends.
func runOrExplain(verb string, args []string, stdin io.Reader, stdout, stderr io.Writer, ended func(status int, peak int64)) (status int) {
	var plan *sandbox.Plan
	if ended != nil {
		defer func() {
			var peak int64
			if plan != nil {
				peak = plan.PeakMemory
			}
			ended(status, peak)
		}()
	}
	cfg, err := sandbox.ParseFlags(verb, args, io.Discard)
	if err != nil {
		fmt.Fprintf(stderr, "sandbox %s: %v\nRun 'sandbox %s --help' for usage.\n", verb, err, verb)
		return 2
	}
	testhook.Step("flags")
	plan, err = sandbox.BuildPlan(cfg)
	testhook.Step("plan")
	if err != nil {
		fmt.Fprintf(stderr, "sandbox %s: %v\n", verb, err)
		if verb == "run" {
			return sandbox.ExitSandbox
		}
		return 1
	}
	if verb == "explain" {
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
	status, err = sandbox.Run(plan, asFile(stdin), asFile(stdout), asFile(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "sandbox run: %v\n", err)
		return sandbox.ExitSandbox
	}
	return status
}

// serveLauncher becomes `bushostd launcher --sandbox SELF ARGS...`, the
// launcher (internal/launch), with the same pid.
func serveLauncher(args []string, stderr io.Writer) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "sandbox serve: %v\n", err)
		return 1
	}
	daemon := filepath.Join(filepath.Dir(self), "bushostd")
	if _, err := os.Stat(daemon); err != nil {
		if daemon, err = exec.LookPath("bushostd"); err != nil {
			fmt.Fprintf(stderr, "sandbox serve: no bushostd next to %s nor on PATH: %v\n", self, err)
			return 1
		}
	}
	argv := append([]string{daemon, "launcher", "--sandbox", self}, args...)
	err = syscall.Exec(daemon, argv, os.Environ())
	fmt.Fprintf(stderr, "sandbox serve: exec %s: %v\n", daemon, err)
	return 1
}

// writeExit records a session's exit status and peak memory in path
// ("STATUS PEAK"), atomically (a new file renamed over), for a launcher
// that is not its parent any more.
func writeExit(path string, status int, peak int64) error {
	// A name already there (a link, left or planted) is removed, never
	// written through: the new file is made with O_EXCL.
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(status) + " " + strconv.FormatInt(peak, 10) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func asFile(v any) *os.File {
	f, _ := v.(*os.File)
	return f
}
