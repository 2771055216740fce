package sandbox

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

// TestAttackBusSocketSwappedAfterPlan: the broker socket lies in a home
// its owner (bushostd's user) may write. Between the plan, which checked
// it is a socket, and bwrap's mount, that owner swaps the name for a link
// to a file (here behind a directory only root may cross, bwrap running as
// root; in a session bwrap runs as its uid: any host file that uid may
// read, outside its bind table). bwrap must bind what was checked, not
// what the name reaches by then: the session sees the socket, never the
// file.
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

// TestAttackBusSocketLinkedToAnotherSocket: the home's owner makes
// broker.sock a link to another socket on the host, one whose group is
// power (docker.sock's docker group, which is root): a symbolic link, or
// a hard link where the host lets users link files of others
// (fs.protected_hardlinks=0). Root resolved the link and gave the session
// the group of whatever socket it reached, so the session could connect
// to it. A bus socket whose last name is a link, or that has another
// name, is refused: the link's owner would choose which socket, and which
// group, the session gets. Nothing is given, nothing is left.
func TestAttackBusSocketLinkedToAnotherSocket(t *testing.T) {
	testenv.NeedRoot(t, "only a session started by root is given groups")
	for _, link := range []struct {
		name string
		make func(oldname, newname string) error
		want string
	}{{"symbolic", os.Symlink, "is a link"}, {"hard", os.Link, "2 names"}} {
		t.Run(link.name, func(t *testing.T) {
			base, flags := layout(t)
			gid := freeGID(t)
			socketHome(t, base, gid)
			elsewhere := filepath.Join(base, "elsewhere")
			if err := os.Mkdir(elsewhere, 0o755); err != nil {
				t.Fatal(err)
			}
			power := filepath.Join(elsewhere, "power.sock")
			l, err := net.Listen("unix", power)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if err := os.Chown(power, 0, int(gid+1)); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(power, 0o660); err != nil {
				t.Fatal(err)
			}
			broker := filepath.Join(base, "bus", "broker.sock")
			if err := os.Rename(broker, broker+".old"); err != nil {
				t.Fatal(err)
			}
			if err := link.make(power, broker); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(broker)
			p, err := plan(t, flags...)
			if err == nil {
				defer p.Close()
				t.Fatalf("planned with broker.sock a %s link to %s: session groups %v, socket groups %+v", link.name, power, p.User.Groups, p.SocketGroups)
			}
			if !strings.Contains(err.Error(), broker) || !strings.Contains(err.Error(), link.want) {
				t.Errorf("refusal %q does not name %s as %q", err, broker, link.want)
			}
			if after, err := os.Lstat(broker); err != nil || !os.SameFile(before, after) || after.Mode() != before.Mode() {
				t.Errorf("%s changed: %v (%v), was %v", broker, after, err, before)
			}
			if fi, err := os.Stat(power); err != nil || fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != gid+1 {
				t.Errorf("the other socket changed: %v %v", fi, err)
			}
		})
	}
}
