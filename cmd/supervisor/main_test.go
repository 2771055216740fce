package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCommandLine(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("debounce = \"soon\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // expected in stdout+stderr
	}{
		{"help", []string{"--help"}, 0, "supervisor init --config FILE --seed DIR"},
		{"no command", nil, 2, "Run 'supervisor --help' for usage."},
		{"near command", []string{"rnu"}, 2, "Did you mean this?\n\trun"},
		{"help run", []string{"help", "run"}, 0, "--config"},
		{"run --help", []string{"run", "--help"}, 0, "--config"},
		{"bad flag", []string{"run", "--bogus"}, 2, "Run 'supervisor run --help' for usage."},
		{"near flag", []string{"run", "--confg", "x"}, 2, "unknown flag: --confg\n\nDid you mean this?\n\t--config\n"},
		{"near flag of init", []string{"init", "--config", "x", "--sed", "y"}, 2, "Did you mean this?\n\t--seed\n"},
		{"unknown command", []string{"serve"}, 2, `unknown command "serve"`},
		{"run without config", []string{"run"}, 2, "--config FILE is required"},
		{"init without seed", []string{"init", "--config", bad}, 2, "--seed DIR are required"},
		{"config error names the key", []string{"run", "--config", bad}, 2, "debounce"},
		{"bad log format", []string{"run", "--config", bad, "--log-format", "yaml"}, 2, `--log-format "yaml": want text or json`},
		{"bad log level", []string{"init", "--config", bad, "--seed", bad, "--log-level", "loud"}, 2, `--log-level "loud"`},
		{"run --help lists the log flags", []string{"run", "--help"}, 0, "-log-format"},
		{"missing config", []string{"run", "--config", filepath.Join(t.TempDir(), "none.toml")}, 2, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			all := stdout.String() + stderr.String()
			if code != tc.code || !strings.Contains(all, tc.out) {
				t.Errorf("exit %d, want %d; output %q lacks %q", code, tc.code, all, tc.out)
			}
		})
	}
}
