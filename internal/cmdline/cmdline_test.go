package cmdline

import (
	"bytes"
	"errors"
	"flag"
	"io"
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
	} {
		var out, errb bytes.Buffer
		code := Execute(newRoot(), tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.out) {
			t.Errorf("%v: exit %d, want %d; output %q lacks %q", tc.args, code, tc.code, out.String()+errb.String(), tc.out)
		}
	}
}
