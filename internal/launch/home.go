package launch

import (
	"crypto/sha256"
	"encoding/hex"
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
// Root keeps its own state (launch.lock, sessions/, probe-disk) only in a
// directory root alone may write: the home when it is root's, else one
// outside it (stateFor), since the owner of a directory may rename what
// is in it and put its own tree, with links, in its place.

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

// StateBase holds the state directory of each home that is not root's
// (sandbox serve --launch-state's default there): root's, outside every
// home, so that its owner names nothing root acts on.
const StateBase = "/var/lib/bushost-launch"

// stateFor is the launcher's state directory for the home abs, whose
// owner is uid: the home itself when it is root's (trustHome and
// safepath then found it, and every directory above, writable by root
// alone), else one of StateBase's, named by a hash of the home's path.
func stateFor(abs string, uid int) string {
	if uid == 0 {
		return abs
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(StateBase, hex.EncodeToString(sum[:8]))
}

// openHome checks the launcher's home (made 0700 if missing) and its
// state directory (state, "" for stateFor's), made 0711 if missing, root's
// with every directory above, reached through no link; it takes the
// state's lock, made there without following a link and root's. It
// returns the absolute paths to use from then on.
func openHome(dir, state string) (abs, stateAbs string, lock *os.File, err error) {
	abs, uid, err := trustHome("--home", dir)
	if err != nil {
		return "", "", nil, err
	}
	h, err := safepath.MkdirAll(abs, uid, 0o700)
	if err != nil {
		return "", "", nil, err
	}
	stateAbs = stateFor(abs, uid)
	if state != "" {
		if stateAbs, err = filepath.Abs(state); err != nil {
			h.Close()
			return "", "", nil, fmt.Errorf("--launch-state %s: %w", state, err)
		}
	}
	if stateAbs != abs || uid != 0 {
		h.Close()
		// Under root's rule: a directory the home's owner (or anyone but
		// root) may write is refused, the home among them.
		if h, err = safepath.MkdirAll(stateAbs, 0, 0o711); err != nil {
			return "", "", nil, err
		}
	}
	defer h.Close()
	path := home.At(stateAbs).LaunchLock()
	fd, err := unix.Openat(h.Fd(), filepath.Base(path), unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", "", nil, safepath.Linked(path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err == nil {
		err = safepath.File(path, fi, 0)
	}
	if err != nil {
		f.Close()
		return "", "", nil, err
	}
	return abs, stateAbs, f, nil
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
