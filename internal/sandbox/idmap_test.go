package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

// TestUsernsMapping: the namespace usernsMapping returns maps the owner
// to the session's uid and gid through an idmapped clone of a tree (what
// the session sees), several times over, and its child is reaped before it
// returns: no process of it is left, zombie or not.
func TestUsernsMapping(t *testing.T) {
	testenv.NeedRoot(t, "make a user namespace with another uid's map and an idmapped mount")
	const owner, session = 1234, 61999
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "f")} {
		if err := os.Chown(p, owner, owner); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for i := 0; i < 3; i++ {
		ns, err := usernsMapping(owner, owner, session)
		if err != nil {
			t.Fatalf("usernsMapping: %v", err)
		}
		if link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(ns)); err != nil || !strings.HasPrefix(link, "user:") {
			t.Fatalf("descriptor %d is %q (%v), want a user namespace", ns, link, err)
		}
		mfd, err := idmapClone(fd, ns, true)
		unix.Close(ns)
		if err != nil {
			t.Fatalf("idmapClone: %v", err)
		}
		for _, name := range []string{"", "f"} {
			var st unix.Stat_t
			if err := unix.Fstatat(mfd, name, &st, unix.AT_EMPTY_PATH); err != nil {
				t.Fatal(err)
			}
			if st.Uid != session || st.Gid != session {
				t.Errorf("%q through the mount is %d:%d, want %d:%d", name, st.Uid, st.Gid, session, session)
			}
		}
		unix.Close(mfd)
		// Looked at, not reaped: WNOWAIT.
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err == nil && info.Signo != 0 {
			t.Errorf("a child is left unreaped")
		}
	}
}
