package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

// TestAttackBusSocketSwappedAfterPlan: the broker socket lies in a home
// its owner (bushostd's user) may write. Between the plan, which checked
// it is a socket, and bwrap's mount, that owner swaps the name for a link
// to a file behind a directory only root may cross. bwrap must bind what
// was checked, not what the name reaches by then: the session sees the
// socket, never the file.
func TestAttackBusSocketSwappedAfterPlan(t *testing.T) {
	testenv.NeedRoot(t, "bwrap binds as root, as sandbox serve's sessions are")
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		testenv.Missing(t, "bwrap", err.Error())
	}
	base, flags := layout(t)
	private := filepath.Join(base, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(private, "secret")
	if err := os.WriteFile(secret, []byte("root's secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := plan(t, flags...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	broker := filepath.Join(base, "bus", "broker.sock")
	// Moved aside (it stays the live socket), the name made a link.
	if err := os.Rename(broker, broker+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, broker); err != nil {
		t.Fatal(err)
	}
	// The broker socket's bind, exactly as run gives it to bwrap, with the
	// descriptors run passes in their places.
	all := p.bwrapArgs()
	var bind []string
	for i := 0; i+2 < len(all); i++ {
		if all[i+2] == broker && strings.HasPrefix(all[i], "--ro-bind") {
			bind = all[i : i+3]
		}
	}
	if bind == nil {
		t.Fatalf("no bind of %s in %v", broker, all)
	}
	// As in a session, the socket's directory is the new root's, not the
	// home: only the socket is bound there.
	args := append([]string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--unshare-user"}, bind...)
	args = append(args, "--", "/usr/bin/stat", "-c", "%F", broker)
	cmd := exec.Command(bwrap, args...)
	// Closed ones in the places run fills, then the sockets' (dups, so
	// that their Files' finalizers close no descriptor of the plan's).
	cmd.ExtraFiles = make([]*os.File, fdBusSockets-3)
	for i, fd := range p.busFDs {
		d, err := unix.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(d), p.busSockets[i])
		defer f.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	}
	out, err := cmd.CombinedOutput()
	if got := strings.TrimSpace(string(out)); got != "socket" {
		t.Fatalf("after the name was swapped for a link to %s, the session's %s is %q (%v), want the socket that was checked", secret, broker, got, err)
	}
	// Nothing left behind: the home holds the owner's link, untouched.
	if target, err := os.Readlink(broker); err != nil || target != secret {
		t.Errorf("%s now %q (%v), want the owner's link left as it was", broker, target, err)
	}
}
