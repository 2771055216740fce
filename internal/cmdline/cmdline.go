// Package cmdline is what the four binaries' command lines share on top of
// spf13/cobra: --version from the build, --help and `help CMD` that exit
// 0, and for an unknown command or flag a "did you mean" with a one-line
// hint and exit 2 (suggest.go). It also wraps commands whose flags an older parser
// reads (sandbox, supervisor): cobra routes and answers --help, the
// command's own parser does the rest.
//
// It must not import gRPC or protobuf (internal/errdefs): the sandbox's
// pid 1 is the sandbox binary, and protobuf's package init opens the
// executable, which starts the runtime's poller before pid 1 has closed
// what it inherited. An error says its exit status by an ExitStatus
// method instead (errdefs.Error has one).
package cmdline

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/bushost/bushost/internal/version"
)

// UsageError is a mistake in the command line: exit 2 with a hint.
type UsageError struct{ Msg string }

func (u UsageError) Error() string { return u.Msg }

// Root returns a root command for binary name with --version and
// cobra's own printing silenced (Execute prints).
func Root(name, short, long string) *cobra.Command {
	root := &cobra.Command{
		Use:                        name,
		Short:                      short,
		Long:                       long,
		Version:                    version.Read().String(),
		SilenceUsage:               true,
		SilenceErrors:              true,
		SuggestionsMinimumDistance: 2,
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
		// With no command, the usage is an answer to a mistake: exit 2.
		RunE: func(cmd *cobra.Command, args []string) error {
			return UsageError{"give a command; '" + name + " --help' lists them"}
		},
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return UsageError{FlagHint(cmd, err)} })
	return root
}

// Passthrough is a command whose arguments, flags included, go unparsed to
// run, which returns the exit status. --help (or -h, -help) before any
// "--" prints the command's Long text and, when flags is set, what flags
// writes (a Go flag set's defaults, respelled --flag), and exits 0. With
// flags set, a flag it does not list is refused before run, as a usage
// error naming the flags close to it.
func Passthrough(use, short, long string, flags func(w io.Writer), run func(args []string) int) *cobra.Command {
	c := &cobra.Command{Use: use, Short: short, Long: long, DisableFlagParsing: true}
	help := func(cmd *cobra.Command, _ []string) {
		w := cmd.OutOrStdout()
		fmt.Fprintln(w, strings.TrimRight(long, "\n"))
		if flags != nil {
			fmt.Fprintln(w, "\nFlags:")
			var b strings.Builder
			flags(&b)
			io.WriteString(w, DoubleDash(b.String()))
		}
	}
	c.SetHelpFunc(help) // for `help CMD`
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if WantsHelp(args) {
			help(cmd, args)
			return nil
		}
		if flags != nil {
			if err := CheckFlags(args, flags); err != nil {
				return err
			}
		}
		return exitStatus(run(args))
	}
	return c
}

// exitStatus carries a Passthrough command's exit status out of cobra.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// WantsHelp reports whether args ask for help before any "--".
func WantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// goFlagLine is compiled at its first use, not at package
// initialisation: every start of every command would pay for it, among
// them the sandbox's, which every session's start waits for.
var goFlagLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)^  -([A-Za-z])`) })

// DoubleDash respells the flag names of a Go flag set's PrintDefaults
// ("  -run-dir string") as they are written here ("  --run-dir string").
func DoubleDash(defaults string) string {
	s := goFlagLine().ReplaceAllString(defaults, "  --$1")
	if i := strings.Index(s, "\n"); strings.HasPrefix(s, "Usage of ") && i >= 0 {
		s = s[i+1:]
	}
	return s
}

// Failed marks err as a command's own failure (not a mistake in the
// command line): Execute prints it and exits with the status of the first
// error in its chain that has an ExitStatus method (an *errdefs.Error:
// errdefs' table), else 1.
func Failed(err error) error {
	if err == nil {
		return nil
	}
	return failure{err}
}

type failure struct{ err error }

func (f failure) Error() string { return f.err.Error() }
func (f failure) Unwrap() error { return f.err }

// Execute runs root with args and returns the exit status: 0; a
// Passthrough command's own status; for a Failed error, errdefs' class
// (1 when it has none); and for anything else, which is cobra refusing the
// command line (an unknown command or flag, with its "Did you mean
// this?"), or a UsageError, 2 with a one-line hint.
func Execute(root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var st exitStatus
	if errors.As(err, &st) {
		return int(st)
	}
	path := root.Name()
	if cmd != nil {
		path = cmd.CommandPath()
	}
	var f failure
	if errors.As(err, &f) {
		fmt.Fprintf(stderr, "%s: %v\n", path, f.err)
		var es interface{ ExitStatus() int }
		if errors.As(f.err, &es) {
			return es.ExitStatus()
		}
		return exitRefused
	}
	fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for usage.\n", path, err, path)
	return exitUsage
}

// The exit statuses of errdefs' table that this package gives itself.
const (
	exitOK      = 0 // errdefs.ExitOK
	exitRefused = 1 // errdefs.ExitRefused
	exitUsage   = 2 // errdefs.ExitUsage
)
