package main

import (
	"bytes"
	"strings"
	"testing"
)

// The daemon's command line refuses a mistyped flag before serving
// anything, naming the flag meant, and its help shows the home's layout.
func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string
	}{
		{"near flag", []string{"serve", "--hom", "x"}, 2, "unknown flag: --hom\n\nDid you mean this?\n\t--home\n"},
		{"near command", []string{"serv"}, 2, "Did you mean this?\n\tserve"},
		{"serve --help", []string{"serve", "--help"}, 0, "repos/<business>/<project>/pool.git"},
		// sandbox serve execs `bushostd launcher --sandbox SELF ARGS`.
		{"near flag of sandbox serve", []string{"launcher", "--sandbox", "/bin/sandbox", "--hom", "x"}, 2,
			"sandbox serve: unknown flag: --hom\n\nDid you mean this?\n\t--home\nRun 'sandbox serve --help' for usage."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if all := stdout.String() + stderr.String(); code != tc.code || !strings.Contains(all, tc.out) {
				t.Errorf("exit %d, want %d; output %q lacks %q", code, tc.code, all, tc.out)
			}
		})
	}
}
