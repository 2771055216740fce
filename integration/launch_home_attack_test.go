package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// noDefaults keeps sandbox serve from needing a cgroup or a tmpfs: these
// tests are about its homes.
var noDefaults = []string{"--default-memory", "none", "--default-pids", "none", "--default-cpu", "none", "--default-disk", "none"}

// sandbox serve runs as root in the home a flag (or $BUSHOST_HOME) names.
// A home someone else made or can change is refused before root makes,
// opens or changes anything in it: a home a user made in a directory
// anyone may write, one writable by others, a link, and links planted
// where root makes its lock, its state directory and reads the admin
// token. Nothing outside is touched (a root directory's mode, a file
// made), nothing is left in the home but, in a home it trusts, the
// launcher's own lock.
func TestLaunchHomeAttack(t *testing.T) {
	testenv.NeedRoot(t, "sandbox serve runs as root")
	sb := bin(t, "sandbox")
	bin(t, "bushostd") // sandbox serve becomes the bushostd beside it
	base := baseDir(t)
	victim := filepath.Join(base, "victim") // stands for /root, /etc
	mkdirMode(t, victim, 0o700)
	mustWrite(t, filepath.Join(victim, "secret"), "root's secret\n", 0o600)
	token := "0123456789abcdef0123456789abcdef0123456789abcdef\n"

	serve := func(t *testing.T, env []string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(sb, append(append([]string{"serve"}, args...), noDefaults...)...)
		cmd.Env = append(cleanEnv(), env...)
		cmd.Dir = base
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan error, 1)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			<-done
			t.Fatalf("sandbox serve served a hostile home:\n%s", out.String())
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}

	cases := []struct {
		name string
		// make builds the home and returns the flags naming it.
		make func(t *testing.T, dir string) (env []string, args []string)
		want string
	}{
		{"a user's home in a directory anyone may write", func(t *testing.T, dir string) ([]string, []string) {
			// /var/tmp is 1777: the user made it, and filled it.
			home := evilDir(t, base)
			mustWrite(t, filepath.Join(home, "admin.token"), token, 0o600)
			os.Symlink(victim, filepath.Join(home, "sessions"))
			os.Symlink(filepath.Join(victim, "made"), filepath.Join(home, "launch.lock"))
			chownAll(t, home, 65534)
			return nil, []string{"--home", home}
		}, "which anyone may write: anyone could have made it"},
		{"the same, named by $BUSHOST_HOME", func(t *testing.T, dir string) ([]string, []string) {
			home := evilDir(t, base)
			os.Symlink(victim, filepath.Join(home, "sessions"))
			chownAll(t, home, 65534)
			return []string{"BUSHOST_HOME=" + home}, nil
		}, "which anyone may write"},
		{"a home others may write", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o777)
			return nil, []string{"--home", dir}
		}, "is writable by group or others"},
		{"a home that is a link", func(t *testing.T, dir string) ([]string, []string) {
			os.Symlink(victim, dir)
			return nil, []string{"--home", dir}
		}, "is a symbolic link"},
		{"a relative home through a link", func(t *testing.T, dir string) ([]string, []string) {
			// Relative to sandbox serve's directory, base; dir/l -> victim.
			mkdirMode(t, dir, 0o700)
			os.Symlink(victim, filepath.Join(dir, "l"))
			return nil, []string{"--home", filepath.Base(dir) + "/l/x"}
		}, "l is a symbolic link"},
		{"a relative home with .. through a link", func(t *testing.T, dir string) ([]string, []string) {
			// The kernel would take dir/l/.. to victim's parent; the
			// launcher takes the path once, as written (dir), and finds it
			// others may write.
			mkdirMode(t, dir, 0o777)
			os.Symlink(victim, filepath.Join(dir, "l"))
			return nil, []string{"--home", filepath.Base(dir) + "/l/../"}
		}, "is writable by group or others"},
		{"launch.lock a link", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			os.Symlink(filepath.Join(victim, "made"), filepath.Join(dir, "launch.lock"))
			return nil, []string{"--home", dir}
		}, "launch.lock is a symbolic link"},
		{"sessions a link", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			mustWrite(t, filepath.Join(dir, "admin.token"), token, 0o600)
			os.Symlink(victim, filepath.Join(dir, "sessions"))
			return nil, []string{"--home", dir}
		}, "sessions is a symbolic link"},
		{"admin.token a link to a root file", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			os.Symlink(filepath.Join(victim, "secret"), filepath.Join(dir, "admin.token"))
			return nil, []string{"--home", dir}
		}, "admin.token is a symbolic link"},
		{"a bus home a user made in a directory anyone may write", func(t *testing.T, dir string) ([]string, []string) {
			mkdirMode(t, dir, 0o700)
			bus := evilDir(t, base)
			mustWrite(t, filepath.Join(bus, "admin.token"), token, 0o600)
			chownAll(t, bus, 65534)
			return nil, []string{"--home", dir, "--bus-home", bus}
		}, "--bus-home " + filepath.Dir(base)},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(base, "home"+string(rune('a'+i)))
			env, args := tc.make(t, dir)
			before := lsnap(t, base, filepath.Dir(base)+"/bh-evil*")
			out, code := serve(t, env, args...)
			if code != 1 || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want 1 and %q:\n%s", code, tc.want, out)
			}
			// Past the home's own checks, the launcher takes its lock
			// (root's, 0600) before it reads the rest: that may stay.
			if lock := filepath.Join(dir, "launch.lock"); !strings.Contains(before, lock+" ") {
				os.Remove(lock)
			}
			if after := lsnap(t, base, filepath.Dir(base)+"/bh-evil*"); after != before {
				t.Fatalf("sandbox serve changed what it refused:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			if fi, err := os.Stat(victim); err != nil || fi.Mode().Perm() != 0o700 {
				t.Fatalf("victim: %v %v", fi.Mode(), err)
			}
		})
	}

	// The deployed layout still serves: bushostd's user owns the home
	// (0710, in a directory only root may write); root makes its lock and
	// its state directory there, root's.
	t.Run("bushostd's home", func(t *testing.T) {
		lib, err := os.MkdirTemp("/var/lib", "bh-atk-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(lib) })
		os.Chmod(lib, 0o755)
		home := filepath.Join(lib, "home")
		mkdirMode(t, home, 0o710)
		mustWrite(t, filepath.Join(home, "admin.token"), token, 0o600)
		chownAll(t, home, 65534)
		cmd := exec.Command(sb, append([]string{"serve", "--home", home}, noDefaults...)...)
		cmd.Env = cleanEnv()
		var out syncBuf
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}()
		testenv.WaitFor(t, time.Minute, "sandbox serve serving", func() bool {
			return strings.Contains(out.String(), "serving") || cmd.ProcessState != nil
		})
		if !strings.Contains(out.String(), "serving "+filepath.Join(home, "launch.sock")) {
			t.Fatalf("sandbox serve on bushostd's home:\n%s", out.String())
		}
		for name, want := range map[string]os.FileMode{"launch.lock": 0o600, "sessions": os.ModeDir | 0o711} {
			fi, err := os.Lstat(filepath.Join(home, name))
			if err != nil || fi.Mode() != want || fi.Sys().(*syscall.Stat_t).Uid != 0 {
				t.Errorf("%s: %v, want root's %v (%v)", name, fi.Mode(), want, err)
			}
		}
	})
}

func mkdirMode(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

// chownAll gives dir and what is in it (links themselves) to uid.
func chownAll(t *testing.T, dir string, uid int) {
	t.Helper()
	filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			err = os.Lchown(p, uid, uid)
		}
		if err != nil {
			t.Fatal(err)
		}
		return nil
	})
}

// evilDir is a directory of 65534's in base's parent (/var/tmp, 1777), as
// any user can make one; removed at the end of the test.
func evilDir(t *testing.T, base string) string {
	t.Helper()
	d := filepath.Join(filepath.Dir(base), "bh-evil"+randSuffix())
	mkdirMode(t, d, 0o700)
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// lsnap lists root and the directories glob matches, following no link:
// each entry's path, mode, owner and link target or content.
func lsnap(t *testing.T, root, glob string) string {
	t.Helper()
	roots, _ := filepath.Glob(glob)
	var b strings.Builder
	for _, r := range append([]string{root}, roots...) {
		filepath.Walk(r, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s %v %d", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
			switch {
			case fi.Mode()&os.ModeSymlink != 0:
				l, _ := os.Readlink(p)
				b.WriteString(" -> " + l)
			case fi.Mode().IsRegular():
				c, _ := os.ReadFile(p)
				fmt.Fprintf(&b, " %q", c)
			}
			b.WriteString("\n")
			return nil
		})
	}
	return b.String()
}
