package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no verb", nil, 2, "Run 'sandbox --help' for usage."},
		{"unknown verb", []string{"escape"}, 2, `unknown command "escape"`},
		{"near verb", []string{"rn"}, 2, "Did you mean this?\n\trun"},
		{"bad flag", []string{"run", "--no-such-flag"}, 2, "no-such-flag"},
		{"missing flags", []string{"explain"}, 2, "--run-dir is required"},
		{"init outside a session", []string{"init", "/bin/true", "true"}, 125, "only as a session's pid 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(tc.args, strings.NewReader(""), &out, &errOut)
			if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errOut.String(), tc.code, tc.want)
			}
		})
	}
}
