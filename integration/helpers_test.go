package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// syncBuf collects a process's output while the test reads it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// sessionHost is what a `sandbox run` session of task acme/web/t1 needs
// to reach a real bus host: bushostd serving with --socket-group of a
// group made for the test (removed at its end), the session's workspace
// (nobody's), and its run directory (root's, as sandbox run started by
// root requires) holding session.json and the session's token.
type sessionHost struct {
	h       *Host
	group   string
	ws, run string
	token   string   // the session's token, in run
	flags   []string // sandbox run's flags for the session
}

// newSessionHost makes a sessionHost whose session has role coder and
// caps, granted and asked for.
func newSessionHost(t *testing.T, caps ...string) *sessionHost {
	t.Helper()
	group := testGroup(t, fmt.Sprintf("bht-%d-%s", os.Getpid(), randSuffix()[:6]))
	h := startHostWith(t, hostOpts{Args: []string{"--socket-group", group}})
	h.AddProject(t, "acme", "web")
	granted := h.Grant(t, "acme", "web", "t1", "coder", caps...)
	base := filepath.Dir(h.Home)
	s := &sessionHost{h: h, group: group, ws: filepath.Join(base, "ws"), run: filepath.Join(base, "run")}
	for _, d := range []string{s.ws, s.run} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(s.ws, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	// session.json names the token: run hands it to the session's uid.
	if err := os.WriteFile(filepath.Join(s.run, "session.json"), []byte(`{"task":"t1","token_file":"token"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// The session's own token, root's in its run directory: sandbox run
	// hands it to the session's uid alone.
	tok, err := os.ReadFile(granted)
	if err != nil {
		t.Fatal(err)
	}
	s.token = filepath.Join(s.run, "token")
	if err := os.WriteFile(s.token, tok, 0o400); err != nil {
		t.Fatal(err)
	}
	s.flags = []string{"--run-dir", s.run, "--workspace", s.ws, "--role", "coder", "--caps", strings.Join(caps, ","),
		"--broker-socket", filepath.Join(h.Home, "broker.sock"), "--git-socket", filepath.Join(h.Home, "git.sock")}
	return s
}

// testGroup makes the group name, the test's own, and removes it at the
// test's end, so no group that existed before is touched.
func testGroup(t *testing.T, name string) string {
	t.Helper()
	if out, err := exec.Command("groupadd", name).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("groupdel", name).CombinedOutput(); err != nil {
			t.Errorf("groupdel %s: %v\n%s", name, err, out)
		}
	})
	return name
}
