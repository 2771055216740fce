package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/testenv"
)

// otherUser makes a uniquely named user for the test and removes it at the
// end; it returns the name and uid.
func otherUser(t *testing.T) (string, int) {
	t.Helper()
	testenv.NeedRoot(t, "making another user needs root")
	name := "bhx" + randSuffix()
	if out, err := exec.Command("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v\n%s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v\n%s", name, err, out)
		}
	})
	out, err := exec.Command("id", "-u", name).Output()
	if err != nil {
		t.Fatal(err)
	}
	uid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	return name, uid
}

// serveRefused runs bushostd serve on home, wants it refused (exit 1) with
// every one of wants in its output, and returns the output.
func serveRefused(t *testing.T, home string, wants ...string) string {
	t.Helper()
	out, err := exec.Command(bin(t, "bushostd"), "serve", "--home", home).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("bushostd serve --home %s: want exit 1, got %v\n%s", home, err, out)
	}
	for _, w := range wants {
		if !strings.Contains(string(out), w) {
			t.Errorf("refusal does not say %q:\n%s", w, out)
		}
	}
	return string(out)
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range des {
		out = append(out, d.Name())
	}
	return out
}

// A 777 home another user made is not adopted: refused naming the path,
// its owner and its mode, and nothing is written into it.
func TestDaemonRefusesHomeOfAnotherUser(t *testing.T) {
	name, uid := otherUser(t)
	home := filepath.Join(baseDir(t), "home")
	if err := os.Mkdir(home, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(home, 0o777)
	if err := os.Chown(home, uid, uid); err != nil {
		t.Fatal(err)
	}
	serveRefused(t, home, home, name, "drwxrwxrwx", "belongs to another user")
	if got := entries(t, home); len(got) != 0 {
		t.Fatalf("refused start wrote into the home: %v", got)
	}
	if fi, _ := os.Stat(home); fi.Mode().Perm() != 0o777 {
		t.Fatalf("refused start changed the home's mode to %v", fi.Mode())
	}
}

// A home under a directory others may write to (not sticky) is refused,
// naming that directory.
func TestDaemonRefusesWritableParent(t *testing.T) {
	open := filepath.Join(baseDir(t), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777)
	home := filepath.Join(open, "home")
	serveRefused(t, home, open, "writable by group or others", "drwxrwxrwx")
	if _, err := os.Lstat(home); !os.IsNotExist(err) {
		t.Fatalf("refused start made the home: %v", err)
	}
}

// A bushostd.lock that is a link to a root-owned file: refused, the file
// unchanged (it used to receive the daemon's pid).
func TestDaemonRefusesLinkedLock(t *testing.T) {
	base := baseDir(t)
	home := filepath.Join(base, "home")
	os.Mkdir(home, 0o700)
	target := filepath.Join(base, "precious")
	if err := os.WriteFile(target, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(home, "bushostd.lock")); err != nil {
		t.Fatal(err)
	}
	serveRefused(t, home, filepath.Join(home, "bushostd.lock"), "symbolic link", "owner root (uid 0)")
	if b, _ := os.ReadFile(target); string(b) != "precious\n" {
		t.Fatalf("the link's target was written: %q", b)
	}
	if got := entries(t, home); len(got) != 1 {
		t.Fatalf("refused start wrote into the home: %v", got)
	}
}

// An admin.token planted by another user (0600, theirs) does not become
// the host's credential: refused naming its owner, nothing served.
func TestDaemonRefusesPlantedToken(t *testing.T) {
	name, uid := otherUser(t)
	home := filepath.Join(baseDir(t), "home")
	os.Mkdir(home, 0o700)
	tok := filepath.Join(home, "admin.token")
	planted := strings.Repeat("b", 64) + "\n"
	if err := os.WriteFile(tok, []byte(planted), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tok, uid, uid); err != nil {
		t.Fatal(err)
	}
	serveRefused(t, home, tok, name, "belongs to another user", "-rw-------")
	if got := entries(t, home); len(got) != 1 {
		t.Fatalf("refused start wrote into the home: %v", got)
	}
	if b, _ := os.ReadFile(tok); string(b) != planted {
		t.Fatalf("planted token changed: %q", b)
	}
}

// A home that is a link is not followed: refused, the target keeps its
// mode and gets no repos/.
func TestDaemonRefusesLinkedHome(t *testing.T) {
	base := baseDir(t)
	target := filepath.Join(base, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home")
	if err := os.Symlink(target, home); err != nil {
		t.Fatal(err)
	}
	serveRefused(t, home, home, "symbolic link")
	fi, err := os.Stat(target)
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("target's mode changed: %v %v", fi.Mode(), err)
	}
	if got := entries(t, target); len(got) != 0 {
		t.Fatalf("refused start wrote into the link's target: %v", got)
	}
}

// A home below a root-owned sticky directory (t.TempDir is under /tmp) is
// fine, as sshd's rule allows for /tmp.
func TestDaemonHomeBelowStickyTmp(t *testing.T) {
	sticky := filepath.Join(baseDir(t), "sticky")
	if err := os.Mkdir(sticky, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	h := startHostWith(t, hostOpts{Home: filepath.Join(sticky, "home")})
	h.AddProject(t, "acme", "web")
}
