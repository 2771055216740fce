package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sandbox serve runs as root with whatever umask it was started with:
// 000 here. What it makes for a session (its directory, record, logs,
// run directory, the workspace it made) and what the session makes with
// the umask it inherits are writable by no one but their owner: another
// user must not rewrite a record root reads back (its pids are
// signalled), a session's output or its work. (Under 000 the session's
// files in its workspace were made 0666, its directories 0777.)
func TestLaunchHostileUmask(t *testing.T) {
	e := newLaunchEnv(t)
	e.stop(t)
	wrapper := filepath.Join(filepath.Dir(e.h.Home), "sandbox-umask0")
	mustWrite(t, wrapper, "#!/bin/sh\numask 000\nexec "+bin(t, "sandbox")+" \"$@\"\n", 0o755)
	e.sandbox = wrapper
	e.start(t)
	id, errOut, code := e.as(t, e.lead, "session", "launch", "--task", "t1", "--role", "worker", "--caps", "git.push.working",
		"--", "sh", "-c", "echo out; echo err >&2; mkdir d; echo x > d/f")
	id = strings.TrimSpace(id)
	if code != 0 {
		t.Fatalf("session launch: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := e.as(t, e.lead, "session", "wait", id); code != 0 {
		t.Fatalf("session wait: exit %d\n%s", code, errOut)
	}
	filepath.Walk(filepath.Join(e.h.Home, "sessions"), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0 {
			t.Errorf("%s: mode %v under umask 000", p, fi.Mode())
		}
		return nil
	})
}
