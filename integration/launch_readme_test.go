package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLaunchREADME runs the README's "A lead that launches a worker"
// exactly as written, with the built binaries in ./bin, and checks what it
// says happened: a worker launched from inside the lead session pushed,
// the lead waited for it and asked for a review, and the log holds the
// session's records.
func TestLaunchREADME(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the README's launch is run as root")
	}
	readme, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "### A lead that launches a worker\n")
	if !ok {
		t.Fatal("README has no section \"A lead that launches a worker\"")
	}
	_, block, ok := strings.Cut(section, "\n```sh\n")
	script, _, ok2 := strings.Cut(block, "\n```\n")
	if !ok || !ok2 {
		t.Fatal("the README's launch section has no ```sh block")
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
		if base, ok := strings.CutPrefix(line, "demo in "); ok && strings.HasPrefix(base, "/var/tmp/bushost-launch-") {
			t.Cleanup(func() { os.RemoveAll(base) })
		}
	}
	if err != nil {
		t.Fatalf("the README's launch: %v\nstdout:\n%s\nstderr:\n%s", err, text, errOut.String())
	}
	for _, want := range []string{"launched s-", "worker ended", "\nreview ", "session.launched", "session.ended", "action.allowed", "exited"} {
		if !strings.Contains(text, want) {
			t.Errorf("the README's launch printed no %q:\n%s\n%s", want, text, errOut.String())
		}
	}
	t.Logf("the README's launch:\n%s", text)
}
