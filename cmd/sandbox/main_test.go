package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
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
		{"near flag", []string{"run", "--run-dr", "d"}, 2, "unknown flag: --run-dr\n\nDid you mean this?\n\t--run-dir\n"},
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

// TestNoProtobufInPid1: the session's pid 1 is this binary, and protobuf's
// package init opens the executable (starting the runtime's poller)
// before pid 1 closes what it inherited, which kills it. Nothing this
// binary links may bring protobuf in (internal/errdefs does).
func TestNoProtobufInPid1(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "grpcnotrace", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "google.golang.org/protobuf") || strings.HasPrefix(p, "google.golang.org/grpc") {
			t.Fatalf("cmd/sandbox links %s", p)
		}
	}
}

// TestWriteExitThroughNoLink: sandbox keep leaves a session's status in
// its exit file by a new file renamed over it; a link planted at either
// name is replaced, never written through.
func TestWriteExitThroughNoLink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	exit := filepath.Join(dir, "exit")
	for _, name := range []string{exit, exit + ".new"} {
		if err := os.Symlink(victim, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeExit(exit, 3, 42); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep\n" {
		t.Errorf("victim now %q", b)
	}
	fi, err := os.Lstat(exit)
	if err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("exit file: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(exit); string(b) != "3 42\n" {
		t.Errorf("exit file holds %q", b)
	}
	if _, err := os.Lstat(exit + ".new"); !os.IsNotExist(err) {
		t.Errorf("%s.new left: %v", exit, err)
	}
}
