package launch

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/safepath"
)

// The launcher runs as root in homes a flag or $BUSHOST_HOME names: its
// own (--home: launch.lock, launch.sock, sessions/) and bushostd's
// (--bus-home: admin.token, broker.sock), usually one directory that
// bushostd's user owns. Root acts there only as that owner could
// (internal/safepath, as sshd's StrictModes): the home and every
// directory above it are root's or the owner's, writable by no one else,
// reached through no link. A home that is not root's must also lie in no
// directory others may write (/tmp): there anyone could have made it.

// trustHome resolves dir (relative, with "..": cleaned, once) and says
// whose rule root acts under there: root's for a home that is missing or
// root's, else its owner's.
func trustHome(flag, dir string) (abs string, uid int, err error) {
	abs, err = filepath.Abs(dir)
	if err != nil {
		return "", 0, fmt.Errorf("%s %s: %w", flag, dir, err)
	}
	fi, err := os.Lstat(abs)
	switch {
	case err == nil:
		uid = int(fi.Sys().(*syscall.Stat_t).Uid)
	case errors.Is(err, fs.ErrNotExist):
		return abs, 0, nil
	default:
		return "", 0, fmt.Errorf("%s %s: %w", flag, abs, err)
	}
	if uid == 0 {
		return abs, 0, nil
	}
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		if st, err := os.Lstat(p); err == nil && st.Mode().Perm()&0o002 != 0 {
			return "", 0, &safepath.Error{Reason: safepath.ReasonUnsafe, Path: abs, Owner: uid, Mode: fi.Mode(),
				Msg: fmt.Sprintf("%s %s belongs to %s and lies in %s, which anyone may write: anyone could have made it; give a home outside it (bushostd's, e.g. /var/lib/bushost)", flag, abs, safepath.Owner(uid), p)}
		}
		if p == "/" {
			return abs, uid, nil
		}
	}
}

// openHome checks the launcher's home (made 0700 if missing) and takes
// its lock, made without following a link and root's; the home's
// absolute path is the one to use from then on.
func openHome(dir string) (abs string, lock *os.File, err error) {
	abs, uid, err := trustHome("--home", dir)
	if err != nil {
		return "", nil, err
	}
	h, err := safepath.MkdirAll(abs, uid, 0o700)
	if err != nil {
		return "", nil, err
	}
	h.Close()
	path := home.At(abs).LaunchLock()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return "", nil, safepath.Linked(path, err)
	}
	fi, err := f.Stat()
	if err == nil {
		err = safepath.File(path, fi, 0)
	}
	if err != nil {
		f.Close()
		return "", nil, err
	}
	return abs, f, nil
}

// makeSessionsDir makes the state directory (0711), root's, following no
// link.
func makeSessionsDir(path string) error {
	if err := os.Mkdir(path, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		// A link is ENOTDIR here: O_DIRECTORY is judged on the link.
		if fi, lerr := os.Lstat(path); lerr == nil {
			if derr := safepath.Dir(path, fi, 0); derr != nil {
				return derr
			}
		}
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if err := safepath.Dir(path, fi, 0); err != nil {
		return err
	}
	return f.Chmod(0o711)
}

// readAdminToken reads the host's admin token in bushostd's home dir, as
// its owner could.
func readAdminToken(dir string) (string, error) {
	abs, uid, err := trustHome("--bus-home", dir)
	if err != nil {
		return "", err
	}
	h, err := safepath.OpenFile(home.At(abs).AdminToken(), uid, unix.O_RDONLY)
	if err != nil {
		return "", err
	}
	f, err := h.File()
	h.Close()
	if err != nil {
		return "", err
	}
	defer f.Close()
	// bushostd writes 64 hex digits and a newline.
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
