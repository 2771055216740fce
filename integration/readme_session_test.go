package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/testenv"
)

// runREADMESection runs the first ```sh block of the README's section
// "### heading" exactly as written, as root, in a fresh directory whose
// ./bin holds the built binaries, and returns what it printed. demoPrefix
// is the directory the script says it made ("demo in DIR"), removed at the
// end. The group bushost the scripts make is removed unless it was there.
func runREADMESection(t *testing.T, heading, demoPrefix string) (stdout, stderr string) {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "### "+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	_, block, ok := strings.Cut(section, "\n```sh\n")
	script, _, ok2 := strings.Cut(block, "\n```\n")
	if !ok || !ok2 {
		t.Fatalf("the README's section %q has no ```sh block", heading)
	}
	hadGroup := exec.Command("getent", "group", "bushost").Run() == nil
	if !hadGroup {
		t.Cleanup(func() {
			if out, err := exec.Command("groupdel", "bushost").CombinedOutput(); err != nil {
				t.Errorf("groupdel bushost: %v %s", err, out)
			}
		})
	}
	dir := t.TempDir()
	for _, name := range []string{"bushostd", "bushost", "sandbox"} {
		bin(t, name)
	}
	if err := os.Symlink(binDir, filepath.Join(dir, "bin")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	text := out.String()
	for _, line := range strings.Split(text, "\n") {
		if base, ok := strings.CutPrefix(line, "demo in "); ok && strings.HasPrefix(base, demoPrefix) {
			t.Cleanup(func() { os.RemoveAll(base) })
		}
	}
	if err != nil {
		t.Fatalf("the README's %q: %v\nstdout:\n%s\nstderr:\n%s", heading, err, text, errOut.String())
	}
	return text, errOut.String()
}

// TestREADMESession runs the README's whole session (section "A whole
// session, from prepare to push") exactly as written, with the built
// binaries in ./bin, and checks what it says happened.
func TestREADMESession(t *testing.T) {
	testenv.NeedRoot(t, "the README's session is run as root")
	text, errOut := runREADMESection(t, "A whole session, from prepare to push", "/var/tmp/bushost-demo-")
	var pushed string
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, "pushed "); ok {
			pushed = v
		}
	}
	_, events, ok := strings.Cut(text, "\nreview ")
	if len(pushed) != 40 || !ok {
		t.Fatalf("the session did not print a pushed commit and a review request:\n%s\n%s", text, errOut)
	}
	if !strings.Contains(events, "action.allowed") || !strings.Contains(events, pushed) {
		t.Errorf("the host's events do not show the push of %s:\n%s", pushed, events)
	}
	t.Logf("the README's session:\n%s", text)
}
