package safepath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

// A uid no passwd entry names: root chowns test files to it.
const other = 54321

func mkdir(t *testing.T, path string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.Mkdir(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// openBase is a directory every user may search, as the way to a
// user's files is.
func openBase(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("/var/tmp", "safepath-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return base
}

func wantRefusal(t *testing.T, err error, reason, path string, words ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want a %s refusal of %s, got %v", reason, path, err)
	}
	if e.Reason != reason || e.Path != path {
		t.Errorf("refusal %s of %s, want %s of %s: %v", e.Reason, e.Path, reason, path, e)
	}
	for _, w := range words {
		if !strings.Contains(e.Msg, w) {
			t.Errorf("refusal does not say %q: %s", w, e.Msg)
		}
	}
}

func TestOpenDirRules(t *testing.T) {
	testenv.NeedRoot(t, "the rules are about other users' files")
	base := openBase(t)
	mine := filepath.Join(base, "mine")
	mkdir(t, mine, 0o755, other)
	ws := filepath.Join(mine, "ws")
	mkdir(t, ws, 0o700, other)
	h, err := OpenDir(ws, other)
	if err != nil {
		t.Fatalf("a directory of the user's, below root's and the user's: %v", err)
	}
	if h.Owner() != other || !h.IsDir() || h.Path() != ws {
		t.Errorf("handle: owner %d dir %v path %s", h.Owner(), h.IsDir(), h.Path())
	}
	h.Close()
	// As root, acting for itself, the user's directory on the way is
	// another user's.
	_, err = OpenDir(ws, 0)
	wantRefusal(t, err, ReasonUnsafe, mine, "belongs to another user", "uid 54321")

	// A link anywhere on the way, even the user's own, is not followed.
	target := filepath.Join(base, "target")
	mkdir(t, target, 0o700, 0)
	if err := os.Mkdir(filepath.Join(target, "ws"), 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(mine, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	os.Lchown(link, other, other)
	_, err = OpenDir(filepath.Join(link, "ws"), other)
	wantRefusal(t, err, ReasonUnsafe, link, "symbolic link")
	_, err = OpenDir(link, other)
	wantRefusal(t, err, ReasonUnsafe, link, "symbolic link")

	// Writable by others: refused on the way unless root's and sticky,
	// refused as the last component always.
	open := filepath.Join(base, "open")
	mkdir(t, open, 0o777, 0)
	mkdir(t, filepath.Join(open, "d"), 0o755, 0)
	_, err = OpenDir(filepath.Join(open, "d"), 0)
	wantRefusal(t, err, ReasonUnsafe, open, "writable by group or others", "drwxrwxrwx")
	sticky := filepath.Join(base, "sticky")
	mkdir(t, sticky, os.ModeSticky|0o777, 0)
	mkdir(t, filepath.Join(sticky, "d"), 0o755, 0)
	if h, err := OpenDir(filepath.Join(sticky, "d"), 0); err != nil {
		t.Errorf("below a root-owned sticky directory: %v", err)
	} else {
		h.Close()
	}
	_, err = OpenDir(sticky, 0)
	wantRefusal(t, err, ReasonUnsafe, sticky, "writable by group or others")
	stickyOther := filepath.Join(base, "sticky-other")
	mkdir(t, stickyOther, os.ModeSticky|0o777, other)
	mkdir(t, filepath.Join(stickyOther, "d"), 0o755, 0)
	_, err = OpenDir(filepath.Join(stickyOther, "d"), 0)
	wantRefusal(t, err, ReasonUnsafe, stickyOther, "belongs to another user")

	// Acting for a user, a directory that user may not search is as far
	// as root looks: nothing beyond it is named.
	closed := filepath.Join(base, "closed")
	mkdir(t, closed, 0o700, 0)
	mkdir(t, filepath.Join(closed, "d"), 0o755, other)
	_, err = OpenDir(filepath.Join(closed, "d"), other)
	wantRefusal(t, err, ReasonUnsafe, closed, "may not search")
	_, err = OpenDir(filepath.Join(closed, "missing"), other)
	wantRefusal(t, err, ReasonUnsafe, closed, "may not search")

	// A file where a directory is wanted.
	f := filepath.Join(base, "file")
	os.WriteFile(f, nil, 0o600)
	_, err = OpenDir(f, 0)
	wantRefusal(t, err, ReasonUnsafe, f, "is not a directory")
	if _, err := OpenDir("relative/path", 0); err == nil {
		t.Error("a relative path was opened")
	}
}

// A fifo is refused at once, never opened (an open would block); a
// missing file is made 0600 with O_CREAT; a file another user owns or can
// write is refused.
func TestOpenFile(t *testing.T) {
	testenv.NeedRoot(t, "files of another user")
	base := t.TempDir()
	fifo := filepath.Join(base, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := OpenFile(fifo, 0, unix.O_RDONLY)
	wantRefusal(t, err, ReasonUnsafe, fifo, "is not a regular file")

	made := filepath.Join(base, "made")
	h, err := OpenFile(made, 0, unix.O_RDWR|unix.O_APPEND|unix.O_CREAT)
	if err != nil {
		t.Fatal(err)
	}
	if st := h.Stat(); st.Mode&0o777 != 0o600 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Errorf("made with mode %o", st.Mode)
	}
	if _, err := unix.Write(h.Fd(), []byte("x\n")); err != nil {
		t.Errorf("write: %v", err)
	}
	h.Close()
	theirs := filepath.Join(base, "theirs")
	os.WriteFile(theirs, []byte("x"), 0o644)
	os.Chown(theirs, other, other)
	_, err = OpenFile(theirs, 0, unix.O_RDWR|unix.O_CREAT)
	wantRefusal(t, err, ReasonUnsafe, theirs, "belongs to another user")
	writable := filepath.Join(base, "writable")
	os.WriteFile(writable, []byte("x"), 0o666)
	os.Chmod(writable, 0o666)
	_, err = OpenFile(writable, 0, unix.O_RDONLY)
	wantRefusal(t, err, ReasonUnsafe, writable, "writable by group or others")
	if b, _ := os.ReadFile(theirs); string(b) != "x" {
		t.Errorf("a refused file changed: %q", b)
	}
}

// Recheck refuses a path swapped for a link to another directory after
// the check, as PATH_CHANGED; the handle still holds what was checked.
func TestRecheckSwap(t *testing.T) {
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	os.Mkdir(ws, 0o700)
	os.WriteFile(filepath.Join(ws, "mine"), nil, 0o600)
	uid := os.Geteuid()
	h, err := OpenDir(ws, uid)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.Recheck(); err != nil {
		t.Fatalf("unchanged: %v", err)
	}
	victim := filepath.Join(base, "victim")
	os.Mkdir(victim, 0o700)
	swap := filepath.Join(base, "ws.swap")
	if err := os.Symlink(victim, swap); err != nil {
		t.Fatal(err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, ws, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, h.Recheck(), ReasonChanged, ws, "changed after it was checked")
	// Another directory in its place: the same refusal.
	os.Remove(ws)
	os.Mkdir(ws, 0o700)
	wantRefusal(t, h.Recheck(), ReasonChanged, ws, "no longer what was checked")
	if _, err := unix.Openat(h.Fd(), "mine", unix.O_RDONLY, 0); err != nil {
		t.Errorf("the handle lost what was checked: %v", err)
	}
}

func TestMkdirAll(t *testing.T) {
	base := t.TempDir()
	home := filepath.Join(base, "a", "b", "home")
	h, err := MkdirAll(home, os.Geteuid(), 0o700)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	for p, want := range map[string]os.FileMode{filepath.Join(base, "a"): 0o755, filepath.Join(base, "a", "b"): 0o755, home: 0o700} {
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want a directory %v", p, fi, err, want)
		}
	}
	// Made again: found, not refused.
	if h, err := MkdirAll(home, os.Geteuid(), 0o700); err != nil {
		t.Errorf("again: %v", err)
	} else {
		h.Close()
	}
}

// OpenBeneath refuses a link on the way and "..", with and without
// openat2.
func TestOpenBeneath(t *testing.T) {
	base := t.TempDir()
	os.MkdirAll(filepath.Join(base, "a", "b"), 0o755)
	os.WriteFile(filepath.Join(base, "a", "b", "f"), []byte("f"), 0o644)
	os.Symlink(filepath.Join(base, "a"), filepath.Join(base, "l"))
	dir, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dir)
	for _, without := range []bool{false, true} {
		noOpenat2.Store(without)
		fd, err := OpenBeneath(dir, "a/b/f", unix.O_RDONLY)
		if err != nil {
			t.Errorf("openat2 off %v: a/b/f: %v", without, err)
		} else {
			unix.Close(fd)
		}
		if fd, err := OpenBeneath(dir, "", unix.O_RDONLY|unix.O_DIRECTORY); err != nil {
			t.Errorf("openat2 off %v: the directory itself: %v", without, err)
		} else {
			unix.Close(fd)
		}
		for _, bad := range []string{"l/b/f", "l", "a/../a/b/f"} {
			if fd, err := OpenBeneath(dir, bad, unix.O_RDONLY); err == nil {
				unix.Close(fd)
				t.Errorf("openat2 off %v: %s opened", without, bad)
			}
		}
		if fd, err := OpenBeneath(dir, "l", unix.O_PATH); err == nil {
			unix.Close(fd)
			t.Errorf("openat2 off %v: O_PATH opened the link itself", without)
		}
	}
	noOpenat2.Store(false)
}

func TestOpenDirBeneath(t *testing.T) {
	testenv.NeedRoot(t, "the rules are about other users' files")
	base := openBase(t)
	ws := filepath.Join(base, "ws")
	mkdir(t, ws, 0o755, other)
	for _, d := range []string{"a", "a/b", "shared", "theirs"} {
		mkdir(t, filepath.Join(ws, d), 0o755, other)
	}
	if err := os.Chmod(filepath.Join(ws, "shared"), 0o777); err != nil {
		t.Fatal(err)
	}
	mkdir(t, filepath.Join(ws, "shared", "x"), 0o755, other)
	if err := os.Chown(filepath.Join(ws, "theirs"), other+1, other+1); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a", filepath.Join(ws, "link")); err != nil {
		t.Fatal(err)
	}
	h, err := OpenDir(ws, other)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	sub, err := OpenDirBeneath(h, "a/b")
	if err != nil {
		t.Fatalf("the user's directory beneath: %v", err)
	}
	if sub.Path() != filepath.Join(ws, "a", "b") || sub.Owner() != other {
		t.Errorf("handle: path %s owner %d", sub.Path(), sub.Owner())
	}
	sub.Close()
	_, err = OpenDirBeneath(h, "shared/x")
	wantRefusal(t, err, ReasonUnsafe, filepath.Join(ws, "shared"), "writable by group or others")
	_, err = OpenDirBeneath(h, "theirs")
	wantRefusal(t, err, ReasonUnsafe, filepath.Join(ws, "theirs"), "belongs to another user")
	_, err = OpenDirBeneath(h, "link/b")
	wantRefusal(t, err, ReasonUnsafe, filepath.Join(ws, "link"), "symbolic link")
	_, err = OpenDirBeneath(h, "link")
	wantRefusal(t, err, ReasonUnsafe, filepath.Join(ws, "link"), "symbolic link")
	for _, bad := range []string{"", "a/../..", "./a", "a//b"} {
		if _, err := OpenDirBeneath(h, bad); err == nil {
			t.Errorf("%q opened", bad)
		}
	}
}

// MkdirOwned (the daemon's repos/, the launcher's sessions/) refuses a
// name that is a link, another user's directory or one others may write,
// and changes nothing it refused: the link's target keeps its mode and
// owner; what it makes or accepts ends up perm.
func TestMkdirOwnedRefusesAndLeavesNothing(t *testing.T) {
	testenv.NeedRoot(t, "directories of another user")
	base := openBase(t)
	stat := func(p string) unix.Stat_t {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	target := filepath.Join(base, "target")
	mkdir(t, target, 0o755, 0)
	link := filepath.Join(base, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(base, "theirs")
	mkdir(t, theirs, 0o755, other)
	open := filepath.Join(base, "open")
	mkdir(t, open, 0o777, 0)
	for _, tc := range []struct{ path, says string }{
		{link, "symbolic link"}, {theirs, "another user"}, {open, "writable by group or others"},
	} {
		before := stat(tc.path)
		wantRefusal(t, MkdirOwned(tc.path, 0, 0o700), ReasonUnsafe, tc.path, tc.says)
		if after := stat(tc.path); after.Mode != before.Mode || after.Uid != before.Uid {
			t.Errorf("%s changed: mode %o uid %d, was %o uid %d", tc.path, after.Mode, after.Uid, before.Mode, before.Uid)
		}
	}
	if st := stat(target); st.Mode&0o7777 != 0o755 || st.Uid != 0 {
		t.Errorf("the link's target changed: mode %o uid %d", st.Mode&0o7777, st.Uid)
	}
	made := filepath.Join(base, "made")
	if err := MkdirOwned(made, 0, 0o711); err != nil {
		t.Fatal(err)
	}
	if st := stat(made); st.Mode&0o7777 != 0o711 || st.Uid != 0 {
		t.Errorf("made mode %o uid %d, want 0711 of root", st.Mode&0o7777, st.Uid)
	}
}
