package cmdline

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/bushost/bushost/internal/errdefs"
)

func TestExecute(t *testing.T) {
	newRoot := func() *cobra.Command {
		root := Root("tool", "a tool", "a tool.")
		root.AddCommand(
			Passthrough("run", "run it", "usage: tool run --config FILE",
				func(w io.Writer) {
					fs := flag.NewFlagSet("run", flag.ContinueOnError)
					fs.SetOutput(w)
					fs.String("config", "", "the file")
					fs.Bool("verbose", false, "say more")
					fs.PrintDefaults()
				},
				func(args []string) int { return len(args) }),
			&cobra.Command{Use: "fail", RunE: func(*cobra.Command, []string) error {
				return Failed(errdefs.ResourceExhausted(errdefs.BundleTooLarge, "too big"))
			}},
			&cobra.Command{Use: "plain", RunE: func(*cobra.Command, []string) error { return Failed(errors.New("broke")) }},
		)
		return root
	}
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--help"}, 0, "a tool."},
		{[]string{"help", "run"}, 0, "  --config string"},
		{[]string{"run", "--help"}, 0, "  --config string"},
		{[]string{"run", "a", "b"}, 2, ""},
		{[]string{"run", "--", "--help"}, 2, ""},
		{[]string{"--version"}, 0, "tool version"},
		{[]string{"rnu"}, 2, "Did you mean this?\n\trun"},
		{nil, 2, "give a command"},
		{[]string{"fail"}, errdefs.ExitLimit, "tool fail: too big"},
		{[]string{"plain"}, 1, "tool plain: broke"},
		{[]string{"fail", "--bogus"}, 2, "Run 'tool fail --help' for usage."},
		// A mistyped flag of a Passthrough command is refused before it
		// runs, with the flags close to it; a value, a flag after the
		// first argument and one after "--" are not checked.
		{[]string{"run", "--confg", "x"}, 2, "unknown flag: --confg\n\nDid you mean this?\n\t--config\nRun 'tool run --help' for usage."},
		{[]string{"run", "-config=x", "--verbos"}, 2, "Did you mean this?\n\t--verbose"},
		{[]string{"run", "--zzz"}, 2, "unknown flag: --zzz\nRun 'tool run --help'"},
		{[]string{"run", "--config", "--confg", "b"}, 3, ""},
		{[]string{"run", "--verbose", "a", "--confg"}, 3, ""},
		{[]string{"run", "--", "--confg", "b"}, 3, ""},
	} {
		var out, errb bytes.Buffer
		code := Execute(newRoot(), tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.out) {
			t.Errorf("%v: exit %d, want %d; output %q lacks %q", tc.args, code, tc.code, out.String()+errb.String(), tc.out)
		}
	}
}

// A mistyped flag of a cobra command (bushostd serve --hom) names the
// flags close to it; one far from every flag gets no list.
func TestFlagHint(t *testing.T) {
	root := Root("tool", "a tool", "a tool.")
	serve := &cobra.Command{Use: "serve", RunE: func(*cobra.Command, []string) error { return nil }}
	serve.Flags().String("home", "", "the home")
	serve.Flags().String("broker-dsn", "", "the store")
	root.PersistentFlags().Bool("json", false, "json")
	root.AddCommand(serve)
	for _, tc := range []struct {
		args []string
		want string
		not  string
	}{
		{[]string{"serve", "--hom"}, "unknown flag: --hom\n\nDid you mean this?\n\t--home\n", ""},
		{[]string{"serve", "--broker"}, "Did you mean this?\n\t--broker-dsn", ""},
		{[]string{"serve", "--jsn"}, "Did you mean this?\n\t--json", ""},
		{[]string{"serve", "--qqqqqq"}, "unknown flag: --qqqqqq\nRun 'tool serve --help'", "Did you mean"},
	} {
		var out, errb bytes.Buffer
		code := Execute(root, tc.args, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.want) || (tc.not != "" && strings.Contains(errb.String(), tc.not)) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.want)
		}
	}
}

// TestCheckFlags: the flags of a Go flag set are read from its
// PrintDefaults, those taking a value told from booleans (one-letter ones
// too), and the first unknown flag is refused with the close ones named.
func TestCheckFlags(t *testing.T) {
	flags := func(w io.Writer) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(w)
		fs.String("run-dir", "", "a directory")
		fs.Bool("fresh-home", false, "empty HOME")
		fs.Bool("v", false, "verbose")
		fs.Int("n", 3, "a count")
		fs.Duration("timeout", 0, "how long")
		fs.PrintDefaults()
	}
	want := map[string]bool{"run-dir": true, "fresh-home": false, "v": false, "n": true, "timeout": true}
	if got := goFlags(flags); !maps.Equal(got, want) {
		t.Errorf("goFlags = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--run-dir", "--fresh-hme", "--v"}, ""},                           // --fresh-hme is run-dir's value
		{[]string{"-n", "2", "--v", "--", "--nope"}, ""},                            // after "--": the command's
		{[]string{"--fresh-home", "--run-dr=x"}, "Did you mean this?\n\t--run-dir"}, // refused, with the close one
		{[]string{"--v", "cmd", "--nope"}, ""},                                      // after the first argument
	} {
		got := ""
		if err := CheckFlags(tc.args, flags); err != nil {
			got = err.Error()
		}
		if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
			t.Errorf("CheckFlags(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}
