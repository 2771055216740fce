// Package safepath decides whether a path the daemon is about to trust is
// its own, the way sshd's StrictModes does: a directory or file another user
// can write to, or swap for a link, is not the host's, whatever is in it.
//
// The rules: the home and every directory above it up to / belong to the
// daemon's uid or to root and are writable by neither group nor others,
// except a root-owned sticky directory (/tmp, /var/tmp), where only an
// entry's owner may rename or remove it, so that a home below it stays the
// daemon's. What the daemon opens in its home (the lock, admin.token, the
// store, repos/, each project directory) belongs to the daemon's uid, is
// not a link, and is writable by nobody else. A refusal names the path,
// its owner and its mode.
package safepath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/bushost/bushost/internal/errdefs"
)

// Owner names uid as "name (uid N)", or "uid N" without a passwd entry.
func Owner(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("%s (uid %d)", u.Username, uid)
	}
	return fmt.Sprintf("uid %d", uid)
}

func owner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// refuse is the one shape of every refusal here.
func refuse(path string, fi fs.FileInfo, why string) error {
	return errdefs.FailedPrecondition(errdefs.PathUnsafe,
		"%s %s (owner %s, mode %v)", path, why, Owner(owner(fi)), fi.Mode()).
		With("path", path).With("owner", owner(fi)).With("mode", fmt.Sprintf("%v", fi.Mode()))
}

// Parents checks every existing directory above dir (dir excluded) up to /,
// after resolving links: each owned by uid or root, not writable by group or
// others unless it is root's and sticky.
func Parents(dir string, uid int) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	// The deepest ancestor that exists: what is missing the daemon makes.
	parent := filepath.Dir(abs)
	for {
		if _, err := os.Lstat(parent); err == nil || parent == filepath.Dir(parent) {
			break
		}
		parent = filepath.Dir(parent)
	}
	parent, err = filepath.EvalSymlinks(parent)
	if err != nil {
		return fmt.Errorf("resolve the parents of %s: %w", abs, err)
	}
	for p := parent; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		o := owner(fi)
		switch {
		case o != uid && o != 0:
			return refuse(p, fi, "is a parent of the home "+abs+" owned by another user")
		case fi.Mode().Perm()&0o022 != 0 && !(o == 0 && fi.Mode()&fs.ModeSticky != 0):
			return refuse(p, fi, "is a parent of the home "+abs+" writable by group or others (and not a root-owned sticky directory like /tmp)")
		}
		if p == "/" || p == filepath.Dir(p) {
			return nil
		}
	}
}

// Dir checks a directory the daemon owns: not a link, a directory, owned
// by uid, writable by nobody else. fi is from Lstat.
func Dir(path string, fi fs.FileInfo, uid int) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return refuse(path, fi, "is a symbolic link, not a directory of the host's")
	case !fi.IsDir():
		return refuse(path, fi, "is not a directory")
	case owner(fi) != uid:
		return refuse(path, fi, "belongs to another user, not to the daemon's "+Owner(uid))
	case fi.Mode().Perm()&0o022 != 0:
		return refuse(path, fi, "is writable by group or others")
	}
	return nil
}

// File checks a regular file the daemon owns, from Lstat or an open
// file's Stat: not a link, regular, owned by uid, writable by nobody else.
func File(path string, fi fs.FileInfo, uid int) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return refuse(path, fi, "is a symbolic link, not a file of the host's")
	case !fi.Mode().IsRegular():
		return refuse(path, fi, "is not a regular file")
	case owner(fi) != uid:
		return refuse(path, fi, "belongs to another user, not to the daemon's "+Owner(uid))
	case fi.Mode().Perm()&0o022 != 0:
		return refuse(path, fi, "is writable by group or others")
	}
	return nil
}

// IfExists runs check on path's Lstat if path exists; a missing path is
// fine (the daemon makes it).
func IfExists(path string, uid int, check func(string, fs.FileInfo, int) error) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return check(path, fi, uid)
}

// Linked reports an open that failed because the last component is a link
// (O_NOFOLLOW gives ELOOP), as the refusal that names it.
func Linked(path string, err error) error {
	if errors.Is(err, syscall.ELOOP) {
		if fi, lerr := os.Lstat(path); lerr == nil {
			return refuse(path, fi, "is a symbolic link, not a file of the host's")
		}
	}
	return err
}
