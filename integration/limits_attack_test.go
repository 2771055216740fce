package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// bushostd serve and sandbox serve refuse a count that would wrap in
// HTTP/2's 32-bit settings (--max-streams-per-conn 4294967296 served
// with no bound on a connection's streams) or overflow the memory budget,
// before they make anything: no home is left.
func TestCountFlagsAttack(t *testing.T) {
	base := baseDir(t)
	for i, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-streams-per-conn", "4294967296"}, "--max-streams-per-conn must be at most 1048576"},
		{[]string{"--max-conns", "9223372036854775807"}, "--max-conns must be at most"},
		{[]string{"--max-in-flight", "9223372036854775807"}, "--max-in-flight must be at most"},
		{[]string{"--reserved-calls", "4294967296"}, "--reserved-calls must be at most"},
	} {
		home := filepath.Join(base, "home", strings.Repeat("x", i+1))
		out, err := exec.Command(bin(t, "bushostd"), append([]string{"serve", "--home", home}, tc.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("bushostd serve %s: %v, want a refusal %q:\n%s", strings.Join(tc.args, " "), err, tc.want, out)
		}
		if _, err := os.Lstat(filepath.Join(base, "home")); err == nil {
			t.Fatalf("bushostd serve %s made its home", strings.Join(tc.args, " "))
		}
	}
	sb := bin(t, "sandbox")
	bin(t, "bushostd") // sandbox serve becomes the bushostd beside it
	home := filepath.Join(base, "launcher")
	out, err := exec.Command(sb, "serve", "--home", home, "--max-conns", "9223372036854775807").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "must be at most 1048576") {
		t.Errorf("sandbox serve --max-conns 9223372036854775807: %v:\n%s", err, out)
	}
	if _, err := os.Lstat(home); err == nil {
		t.Fatal("sandbox serve made its home")
	}
}
