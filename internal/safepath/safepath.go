// Package safepath is the one way code running with more privilege than
// the user who named a path touches that path, the way sshd's StrictModes
// judges a user's files: a directory or file another user can write to, or
// swap for a link, is not to be trusted, whatever is in it.
//
// A path is opened once, from "/", one component at a time, following no
// symbolic link (Open, OpenDir, OpenFile, MkdirAll). Every component, the
// last one included, must belong to root or to the user root acts for, and
// be writable by nobody else; a directory above the last may also be a
// root-owned sticky directory (/tmp, /var/tmp), where only an entry's owner
// may rename or remove it. Acting for a user other than root, every
// directory must be one that user may search (by its owner's or others'
// bits): root tells it nothing about what lies beyond one it may not. The result is a Handle: the descriptor of what
// was checked, which whoever acts later acts on (fchown, openat, a bind of
// the descriptor), never on the path again. A path that must be named again
// later is compared with the handle (Handle.Recheck) and refused as
// PATH_CHANGED if it no longer names the same file.
//
// Names under a directory already held are opened with OpenBeneath. A
// refusal is an *Error naming the path, its owner and its mode; the package
// knows no transport (the sandbox and the supervisor link no gRPC), and
// internal/errdefs gives its reasons their codes.
package safepath

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The reasons of this package's refusals, equal to internal/errdefs's
// constants of the same names (a test there keeps them equal).
const (
	ReasonUnsafe  = "PATH_UNSAFE"
	ReasonChanged = "PATH_CHANGED"
)

// Error is a refusal of a path: the reason, the path it is about, its
// owner (-1 when unknown) and mode, and a message naming all three.
type Error struct {
	Reason string
	Path   string
	Owner  int
	Mode   fs.FileMode
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Owner names uid as "name (uid N)", or "uid N" without a passwd entry.
// It reads /etc/passwd itself: os/user would link the C library into the
// sandbox, whose every session start would pay for the loader.
func Owner(uid int) string {
	if b, err := os.ReadFile("/etc/passwd"); err == nil {
		want := strconv.Itoa(uid)
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Split(line, ":"); len(f) > 2 && f[2] == want {
				return fmt.Sprintf("%s (uid %d)", f[0], uid)
			}
		}
	}
	return fmt.Sprintf("uid %d", uid)
}

func modeOf(st *unix.Stat_t) fs.FileMode {
	m := fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	if st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	if st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	return m
}

// refuseStat is the one shape of every refusal here.
func refuseStat(path string, st *unix.Stat_t, why string) *Error {
	mode := modeOf(st)
	return &Error{Reason: ReasonUnsafe, Path: path, Owner: int(st.Uid), Mode: mode,
		Msg: fmt.Sprintf("%s %s (owner %s, mode %v)", path, why, Owner(int(st.Uid)), mode)}
}

func refuse(path string, fi fs.FileInfo, why string) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return &Error{Reason: ReasonUnsafe, Path: path, Owner: -1, Mode: fi.Mode(), Msg: fmt.Sprintf("%s %s (mode %v)", path, why, fi.Mode())}
	}
	return refuseStat(path, &unix.Stat_t{Uid: st.Uid, Mode: st.Mode}, why)
}

// Handle is a file or directory opened once and checked: Fd is what was
// checked, and whatever acts on the path later acts on it. A directory's
// descriptor is opened O_RDONLY|O_DIRECTORY (it reads, fchowns and feeds
// openat, and open_tree with AT_EMPTY_PATH).
type Handle struct {
	path string
	fd   int
	st   unix.Stat_t
	uid  int
}

// Path is the path as it was given, cleaned.
func (h *Handle) Path() string { return h.path }

// Fd is the descriptor; it stays the handle's (Close closes it).
func (h *Handle) Fd() int { return h.fd }

// Stat is what the descriptor said when it was checked.
func (h *Handle) Stat() unix.Stat_t { return h.st }

// Owner is the uid owning what was opened.
func (h *Handle) Owner() int { return int(h.st.Uid) }

// IsDir reports whether the handle is a directory.
func (h *Handle) IsDir() bool { return h.st.Mode&unix.S_IFMT == unix.S_IFDIR }

// Close closes the descriptor.
func (h *Handle) Close() error {
	if h == nil || h.fd < 0 {
		return nil
	}
	err := unix.Close(h.fd)
	h.fd = -1
	return err
}

// File returns an *os.File of a duplicate of the descriptor, for the
// caller to close (for example to hand to a child as an extra file).
func (h *Handle) File() (*os.File, error) {
	fd, err := unix.FcntlInt(uintptr(h.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), h.path), nil
}

// Recheck walks the path again under the rule it was opened with and
// refuses with PATH_CHANGED when it no longer leads to the handle's file
// (renamed away, swapped for a link or another directory), or with the
// walk's own refusal.
func (h *Handle) Recheck() error {
	again, err := walk(h.path, h.uid, unix.O_PATH, kindAny, nil)
	if err != nil {
		var e *Error
		if errors.As(err, &e) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return &Error{Reason: ReasonChanged, Path: h.path, Owner: h.Owner(), Mode: modeOf(&h.st),
				Msg: fmt.Sprintf("PATH_CHANGED: %s changed after it was checked (%v): refused, never followed", h.path, err)}
		}
		return err
	}
	defer again.Close()
	if again.st.Dev != h.st.Dev || again.st.Ino != h.st.Ino {
		return &Error{Reason: ReasonChanged, Path: h.path, Owner: again.Owner(), Mode: modeOf(&again.st),
			Msg: fmt.Sprintf("PATH_CHANGED: %s is no longer what was checked (now owner %s, mode %v): refused, never followed", h.path, Owner(again.Owner()), modeOf(&again.st))}
	}
	return nil
}

// FromFd makes a handle of a descriptor another process opened and
// checked (sandbox serve hands sandbox run the workspace it checked), named
// path, opened under uid's rule for Recheck. It takes fd over.
func FromFd(fd int, path string, uid int) (*Handle, error) {
	h := &Handle{path: filepath.Clean(path), fd: fd, uid: uid}
	if err := unix.Fstat(fd, &h.st); err != nil {
		return nil, fmt.Errorf("descriptor %d for %s: %w", fd, path, err)
	}
	return h, nil
}

type kind int

const (
	kindAny kind = iota
	kindDir
	kindFile
)

// OpenDir opens the directory path under uid's rule (see the package
// comment).
func OpenDir(path string, uid int) (*Handle, error) {
	return walk(path, uid, unix.O_RDONLY|unix.O_DIRECTORY, kindDir, nil)
}

// OpenFile opens the regular file path under uid's rule with flags
// (O_RDONLY, O_RDWR, O_WRONLY, O_APPEND, O_CREAT: a missing file is made
// with O_EXCL, mode 0600). Anything but a regular file (a fifo, a device,
// a directory) is refused before it is opened, so nothing blocks.
func OpenFile(path string, uid int, flags int) (*Handle, error) {
	return walk(path, uid, flags, kindFile, nil)
}

// MkdirAll makes the directory path (mode perm) and whatever is missing
// above it (0755), under uid's rule for what exists and what it made, and
// returns the directory opened.
func MkdirAll(path string, uid int, perm uint32) (*Handle, error) {
	return walk(path, uid, unix.O_RDONLY|unix.O_DIRECTORY, kindDir, &perm)
}

// Trusted checks a file or directory opened under a directory already
// checked (session.json in a run directory): not a link, owned by root or
// uid, writable by nobody else.
func Trusted(path string, st *unix.Stat_t, uid int) error {
	return trusted(path, st, uid, true)
}

// trusted checks one component: owned by root or uid, writable by nobody
// else unless last is false and it is a root-owned sticky directory.
func trusted(path string, st *unix.Stat_t, uid int, last bool) error {
	o := int(st.Uid)
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return refuseStat(path, st, "is a symbolic link: it is not followed")
	case o != uid && o != 0 && uid == 0:
		return refuseStat(path, st, "belongs to another user, not root")
	case o != uid && o != 0:
		return refuseStat(path, st, fmt.Sprintf("belongs to another user, neither root nor %s", Owner(uid)))
	case st.Mode&0o022 != 0 && (last || o != 0 || st.Mode&unix.S_ISVTX == 0):
		if last {
			return refuseStat(path, st, "is writable by group or others")
		}
		return refuseStat(path, st, "is writable by group or others (and not a root-owned sticky directory like /tmp)")
	case uid != 0 && st.Mode&unix.S_IFMT == unix.S_IFDIR && (o == uid && st.Mode&0o100 == 0 || o != uid && st.Mode&0o001 == 0):
		// Root walks on behalf of uid only where uid could walk itself:
		// what lies beyond is none of its business, not even its owner.
		return refuseStat(path, st, fmt.Sprintf("is a directory %s may not search", Owner(uid)))
	}
	return nil
}

// walk opens path from "/" one component at a time. mkdir, when set, makes
// missing directories with that mode.
func walk(path string, uid int, flags int, k kind, mkdir *uint32) (*Handle, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%s: not an absolute path", path)
	}
	path = filepath.Clean(path)
	cur, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	err = unix.Fstat(cur, &st)
	if err == nil && path == "/" {
		err = refuseStat("/", &st, "is the root directory")
	}
	if err == nil {
		err = trusted("/", &st, uid, false)
	}
	if err != nil {
		unix.Close(cur)
		return nil, err
	}
	return walkFrom(cur, "", strings.Split(strings.TrimPrefix(path, "/"), "/"), uid, flags, k, mkdir)
}

// OpenDirBeneath opens the directory rel (slash-separated names, none of
// them "." or "..") beneath the directory h holds, one component at a time
// following no link, each component checked under h's rule as OpenDir
// checks those of a path. The handle's path is h's joined with rel.
func OpenDirBeneath(h *Handle, rel string) (*Handle, error) {
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	if rel == "" || slices.ContainsFunc(parts, func(p string) bool { return p == "" || p == "." || p == ".." }) {
		return nil, fmt.Errorf("%s: %q is not a plain relative path", h.path, rel)
	}
	cur, err := unix.FcntlInt(uintptr(h.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return walkFrom(cur, h.path, parts, h.uid, unix.O_RDONLY|unix.O_DIRECTORY, kindDir, nil)
}

// walkFrom goes down parts from the directory cur (which it closes), named
// sofar ("" for /), under uid's rule.
func walkFrom(cur int, sofar string, parts []string, uid int, flags int, k kind, mkdir *uint32) (*Handle, error) {
	closeCur := func() { unix.Close(cur) }
	var st unix.Stat_t
	path := sofar + "/" + strings.Join(parts, "/")
	for i, name := range parts {
		sofar += "/" + name
		if i == len(parts)-1 {
			break
		}
		next, err := unix.Openat(cur, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && mkdir != nil {
			if err = unix.Mkdirat(cur, name, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(cur, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		closeCur()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sofar, err)
		}
		cur = next
		err = unix.Fstat(cur, &st)
		if err == nil {
			err = trusted(sofar, &st, uid, false)
		}
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			err = fmt.Errorf("%s: %w", sofar, unix.ENOTDIR)
		}
		if err != nil {
			closeCur()
			return nil, err
		}
	}
	defer closeCur()
	name := parts[len(parts)-1]
	h, err := openLast(cur, name, path, flags, k, mkdir)
	if err != nil {
		return nil, err
	}
	h.uid = uid
	if err := trusted(path, &h.st, uid, true); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// openLast opens the last component under dirfd: its type is learned
// first without following it, so that a fifo or a device is never opened.
func openLast(dirfd int, name, path string, flags int, k kind, mkdir *uint32) (*Handle, error) {
	for attempt := 0; ; attempt++ {
		var pre unix.Stat_t
		err := unix.Fstatat(dirfd, name, &pre, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) && attempt == 0 {
			switch {
			case mkdir != nil:
				if err := unix.Mkdirat(dirfd, name, *mkdir); err != nil && !errors.Is(err, unix.EEXIST) {
					return nil, fmt.Errorf("%s: %w", path, err)
				}
				continue
			case k == kindFile && flags&unix.O_CREAT != 0:
				fd, err := unix.Openat(dirfd, name, flags|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, 0o600)
				if errors.Is(err, unix.EEXIST) {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("%s: %w", path, err)
				}
				return held(fd, path)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch t := pre.Mode & unix.S_IFMT; {
		case t == unix.S_IFLNK:
			return nil, refuseStat(path, &pre, "is a symbolic link: it is not followed")
		case k == kindDir && t != unix.S_IFDIR:
			return nil, refuseStat(path, &pre, "is not a directory")
		case k == kindFile && t != unix.S_IFREG:
			return nil, refuseStat(path, &pre, "is not a regular file")
		}
		f := flags &^ (unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC)
		if k == kindAny && pre.Mode&unix.S_IFMT != unix.S_IFDIR {
			f = unix.O_PATH
		}
		fd, err := unix.Openat(dirfd, name, f|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		h, err := held(fd, path)
		if err != nil {
			return nil, err
		}
		if h.st.Dev != pre.Dev || h.st.Ino != pre.Ino {
			h.Close()
			return nil, &Error{Reason: ReasonChanged, Path: path, Owner: int(pre.Uid), Mode: modeOf(&pre),
				Msg: fmt.Sprintf("PATH_CHANGED: %s changed while it was opened: refused, never followed", path)}
		}
		if flags&unix.O_NONBLOCK == 0 && f&unix.O_PATH == 0 {
			// Regular files and directories do not block; the flag only
			// kept a swapped-in fifo from holding the open.
			if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
				_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
			}
		}
		return h, nil
	}
}

func held(fd int, path string) (*Handle, error) {
	h := &Handle{path: path, fd: fd}
	if err := unix.Fstat(fd, &h.st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return h, nil
}

// OpenNoFollow opens the absolute path from / following no link on the
// way (OpenBeneath from /), with no owner rule: for a path whose identity
// the caller checks itself (a recorded device and inode).
func OpenNoFollow(path string, flags int) (int, error) {
	if !filepath.IsAbs(path) {
		return -1, fmt.Errorf("%s: not an absolute path", path)
	}
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	return OpenBeneath(root, strings.TrimPrefix(filepath.Clean(path), "/"), flags)
}

// noOpenat2 is set once the kernel (or a seccomp filter) says there is no
// openat2.
var noOpenat2 atomic.Bool

// OpenBeneath opens name (slash-separated components, none of them "..";
// "" or "." for dirfd itself) under the directory dirfd following no link:
// openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or without openat2
// one component at a time with O_NOFOLLOW. A link anywhere on the way
// fails with ELOOP; flags gets O_NOFOLLOW and O_CLOEXEC.
func OpenBeneath(dirfd int, name string, flags int) (int, error) {
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if name == "" {
		name = "."
	}
	parts := strings.Split(strings.Trim(name, "/"), "/")
	if slices.Contains(parts, "..") {
		return -1, unix.EXDEV
	}
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   uint64(flags),
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		})
		// EPERM: a seccomp filter refusing the call, as ENOSYS.
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			if err == nil && flags&unix.O_PATH != 0 {
				return notLink(fd)
			}
			return fd, err
		}
		noOpenat2.Store(true)
	}
	cur := dirfd
	for i, p := range parts {
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if i == len(parts)-1 {
			f = flags
		}
		fd, err := unix.Openat(cur, p, f, 0)
		if cur != dirfd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		if f&unix.O_PATH != 0 {
			if fd, err = notLink(fd); err != nil {
				return -1, err
			}
		}
		cur = fd
	}
	return cur, nil
}

// notLink fails with ELOOP, closing fd, if fd is a link itself: with
// O_PATH, O_NOFOLLOW opens a link instead of failing.
func notLink(fd int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(fd)
		return -1, unix.ELOOP
	}
	return fd, nil
}

// Dir checks a directory the daemon owns: not a link, a directory, owned
// by uid, writable by nobody else. fi is from Lstat.
func Dir(path string, fi fs.FileInfo, uid int) error {
	return owned(path, fi, uid, "directory", fi.IsDir(), "is not a directory")
}

// File checks a regular file the daemon owns, from Lstat or an open
// file's Stat: not a link, regular, owned by uid, writable by nobody else.
func File(path string, fi fs.FileInfo, uid int) error {
	return owned(path, fi, uid, "file", fi.Mode().IsRegular(), "is not a regular file")
}

// owned is Dir's and File's check: fi is not a link, is of its kind
// (isKind; else the refusal says notKind), is owned by uid and is
// writable by nobody else.
func owned(path string, fi fs.FileInfo, uid int, kind string, isKind bool, notKind string) error {
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return refuse(path, fi, "is a symbolic link, not a "+kind+" of the host's")
	case !isKind:
		return refuse(path, fi, notKind)
	case st == nil || int(st.Uid) != uid:
		return refuse(path, fi, "belongs to another user, not to the daemon's "+Owner(uid))
	case fi.Mode().Perm()&0o022 != 0:
		return refuse(path, fi, "is writable by group or others")
	}
	return nil
}

// MkdirOwned makes the directory path (perm) unless it is there, and
// checks it as Dir does through a descriptor opened without following a
// link, then gives it perm through that descriptor.
func MkdirOwned(path string, uid int, perm fs.FileMode) error {
	if err := os.Mkdir(path, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		// A link is ENOTDIR here: O_DIRECTORY is judged on the link.
		if fi, lerr := os.Lstat(path); lerr == nil {
			if derr := Dir(path, fi, uid); derr != nil {
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
	if err := Dir(path, fi, uid); err != nil {
		return err
	}
	return f.Chmod(perm)
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
