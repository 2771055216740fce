package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/bushost/bushost/internal/testenv"
)

// Whoever starts bushostd chooses its umask: 000 here, with a socket
// group (whose members, the sessions, may enter the home, 0710). What the
// daemon makes in its home has the modes the docs give whatever the umask
// (the sockets 0660, the admin token, the broker's store and the log key
// 0600, the repositories 0700 and nothing in them writable by another
// uid), after a project, a grant and a push have made what they make: a
// session reaches the sockets and reads only what is public (host-id,
// log.pub). (Under umask 000 a project's pool.git was made 0777, and the
// daemon then refused its own store.)
func TestDaemonHomeModesHostileUmask(t *testing.T) {
	testenv.NeedRoot(t, "a socket group is made and removed")
	group := "bhu" + randSuffix()
	if out, err := exec.Command("groupadd", group).CombinedOutput(); err != nil {
		t.Fatalf("groupadd: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("groupdel", group).Run() })
	wrapper := filepath.Join(baseDir(t), "bushostd-umask0")
	mustWrite(t, wrapper, "#!/bin/sh\numask 000\nexec "+bin(t, "bushostd")+" \"$@\"\n", 0o755)
	w := newGitWorld(t, hostOpts{Daemon: wrapper, Args: []string{"--socket-group", group}})
	w.commit(t, "a.txt", "one\n")
	w.as(t, w.worker, "push-working", "--repo", w.work)

	want := map[string]os.FileMode{
		".":             os.ModeDir | 0o710,
		"git.sock":      os.ModeSocket | 0o660,
		"broker.sock":   os.ModeSocket | 0o660,
		"admin.token":   0o600,
		"broker.db":     0o600,
		"broker.db-wal": 0o600,
		"broker.db-shm": 0o600,
		"bushostd.lock": 0o600,
		"log.key":       0o600,
		"log.pub":       0o644,
		"host-id":       0o644,
		"repos":         os.ModeDir | 0o700,
		"git-home":      os.ModeDir | 0o700,
	}
	ents, err := os.ReadDir(w.h.Home)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{"."}, names(ents)...) {
		fi, err := os.Lstat(filepath.Join(w.h.Home, name))
		if err != nil {
			t.Fatal(err)
		}
		mode, ok := want[name]
		switch {
		case !ok:
			t.Errorf("%s (mode %v): not in the documented layout", name, fi.Mode())
		case fi.Mode()&(os.ModeType|os.ModePerm) != mode:
			t.Errorf("%s: mode %v under umask 000, want %v", name, fi.Mode(), mode)
		}
	}
	// In the repositories (git made them, and the push's objects), nothing
	// another uid could write: the daemon would refuse its own store.
	filepath.Walk(filepath.Join(w.h.Home, "repos"), func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s: mode %v under umask 000", p, fi.Mode())
		}
		return nil
	})
}

func names(ents []os.DirEntry) []string {
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
