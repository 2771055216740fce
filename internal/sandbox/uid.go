package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/testhook"
)

// The default range of session uids: systemd's dynamic users' range, which
// no distribution hands out to ordinary accounts.
const (
	DefaultUIDLow  = 61184
	DefaultUIDHigh = 65519
	// DefaultStateDir holds one lock file per uid in use.
	DefaultStateDir = "/run/bushost-sandbox"
)

// dynamicName is the session user's name before run picks its uid.
const dynamicName = "session"

// lease is a uid held for one session: the lock file stays locked (flock)
// as long as the launcher lives, and records what was handed to the uid,
// so that when the launcher dies the next one hands it back.
type lease struct {
	uid  uint32
	path string // the lock file
	// lo-hi is the range uid came from: a tree already owned by a uid
	// in it belongs to another session, and is not taken from it.
	lo, hi uint32
	lock   *os.File
	rec    leaseRecord
	// held are descriptors of rec.Handed's roots, one each, kept from the
	// hand-over for the hand-back: it acts on them, not on their paths.
	held []int
}

// leaseRecord is the lock file's content while a session holds the uid.
type leaseRecord struct {
	UID    uint32   `json:"uid"`
	Handed []handed `json:"handed"`
	// Session is what the session was given (SessionBounds), written
	// before it starts.
	Session *SessionBounds `json:"session,omitempty"`
}

// handed is a tree (or one directory or file) given to the session's uid:
// what was owned by UID:GID there and the root's mode, to put back.
type handed struct {
	Path string `json:"path"`
	// Dev and Ino are the tree's root as handed over: a launcher that
	// hands it back from the record finds it again only if the path still
	// leads, through no link, to this very file.
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	UID     uint32 `json:"uid"`
	GID     uint32 `json:"gid"`
	Mode    uint32 `json:"mode"`
	Recurse bool   `json:"recurse"`
}

// acquireUID takes the first uid of [lo, hi] that /etc/passwd and
// /etc/group do not name, that no process runs as, and whose lock file in
// state is free. A lock file that still records a session (its launcher
// died) is reclaimed first: what it handed over is handed back.
func acquireUID(state string, lo, hi uint32) (*lease, error) {
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("state directory %s: %w", state, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(state, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("state directory %s must be a directory of root's that no one else may write", state)
	}
	named, err := namedIDs()
	if err != nil {
		return nil, err
	}
	running := runningUIDs()
	for uid := lo; uid <= hi && uid >= lo; uid++ {
		if named[uid] || running[uid] {
			continue
		}
		if l, err := tryLease(state, uid, lo, hi); err != nil || l != nil {
			return l, err
		}
	}
	return nil, refuse(ReasonSessionUIDsExhausted, exitLimit, "no free session uid in %d-%d (each is named in /etc/passwd or /etc/group, run by a process, or locked in %s)", lo, hi, state)
}

// tryLease locks uid's file, reclaiming a dead launcher's record; nil if
// another launcher holds it.
func tryLease(state string, uid, lo, hi uint32) (l *lease, err error) {
	path := lockPath(state, uid)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer func() {
		if l == nil {
			f.Close()
		}
	}()
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// A launcher that released the uid unlinks the file while it holds the
	// lock: one that opened it before then holds a lock on a file no
	// longer there, and must not use it.
	var held, named unix.Stat_t
	if unix.Fstat(fd, &held) != nil || unix.Lstat(path, &named) != nil || held.Ino != named.Ino || held.Dev != named.Dev {
		return nil, nil
	}
	l = &lease{path: path, uid: uid, lo: lo, hi: hi, lock: f, rec: leaseRecord{UID: uid}}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, err
	}
	if len(data) > 0 {
		// A launcher died holding this uid, and no process runs as it
		// any more: hand back what it had handed over.
		var old leaseRecord
		if err := json.Unmarshal(data, &old); err != nil || old.UID != uid {
			return nil, fmt.Errorf("lock %s holds no record of uid %d: remove it by hand once you know no session uses the uid", path, uid)
		}
		l.rec = old
		if err := l.handBack(); err != nil {
			// Left as it is, record and all, for a person to look at:
			// this launch takes another uid.
			return nil, nil
		}
		if old.Session != nil {
			restoreModes(old.Session.Mapped)
		}
	}
	return l, nil
}

// lockPath is uid's lock file in the state directory.
func lockPath(state string, uid uint32) string {
	return filepath.Join(state, strconv.FormatUint(uint64(uid), 10)+".lock")
}

// save writes the record before anything is handed over, so that a
// launcher that dies at any later point leaves enough for the next one to
// undo it. It is not synced: the default state directory is under /run,
// which a reboot empties anyway, and a tree a lost record leaves with a
// session uid is refused, naming the uid, rather than taken over.
func (l *lease) save() error {
	data, err := json.Marshal(l.rec)
	if err != nil {
		return err
	}
	if err := l.lock.Truncate(0); err != nil {
		return err
	}
	_, err = l.lock.WriteAt(data, 0)
	return err
}

// handOver gives each tree's root, held by its descriptor, to the lease's
// uid: the root itself (whatever owns it, mode 0700 for a directory so no
// other session may look in) and, with recurse, every directory, regular
// file and symlink under it owned by the root's owner. handBack walks the
// whole tree when recurse or back is set: a directory whose root alone is
// handed over may still gain the session's files. It never resolves a
// path: it acts on the descriptors it was given and on names beneath them
// (fchownat without following), leaves device nodes, fifos and sockets
// alone, and skips files with more than one link (a hard link would hand
// over a file outside the tree).
func (l *lease) handOver(trees ...tree) error {
	sts := make([]unix.Stat_t, len(trees))
	// Every root is checked, and the record written once, before
	// anything changes hands.
	for i, t := range trees {
		st := &sts[i]
		if err := unix.Fstat(t.fd, st); err != nil {
			return err
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if st.Uid >= l.lo && st.Uid <= l.hi {
			return fmt.Errorf("%s belongs to uid %d, another session's (still running, or its launcher died while it runs): it cannot be handed to this one", t.path, st.Uid)
		}
		if !isDir && st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%s is neither a directory nor a regular file", t.path)
		}
		fd, err := unix.FcntlInt(uintptr(t.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return err
		}
		l.held = append(l.held, fd)
		l.rec.Handed = append(l.rec.Handed, handed{Path: t.path, Dev: st.Dev, Ino: st.Ino, UID: st.Uid, GID: st.Gid, Mode: st.Mode & 0o7777, Recurse: (t.recurse || t.back) && isDir})
	}
	if err := l.save(); err != nil {
		return fmt.Errorf("record the hand-over: %w", err)
	}
	for i, t := range trees {
		if err := unix.Fchown(t.fd, int(l.uid), -1); err != nil {
			return fmt.Errorf("give %s to uid %d: %w", t.path, l.uid, err)
		}
		if sts[i].Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		if err := unix.Fchmod(t.fd, 0o700); err != nil {
			return err
		}
		if !t.recurse {
			continue
		}
		owner := sts[i].Uid
		err := walkAt(t.fd, t.path, 0, func(fd int, st *unix.Stat_t) error {
			switch typ := st.Mode & unix.S_IFMT; {
			case st.Uid != owner:
			case typ == unix.S_IFDIR, typ == unix.S_IFLNK, typ == unix.S_IFREG && st.Nlink <= 1:
				return chownFd(fd, int(l.uid), -1)
			}
			return nil // devices, fifos, sockets, files with other links: never handed over
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// tree is one root to hand over, held by fd (named path): recurse hands
// over what is under it too; back makes handBack walk it even when only
// the root was handed over.
type tree struct {
	fd            int
	path          string
	recurse, back bool
}

// handBack gives every handed tree back: whatever the uid (or its group,
// the same number) owns there goes to the root's old owner and group, and
// each root gets its old mode. Only then is the uid free: nothing on the
// host stays owned by it.
func (l *lease) handBack() error {
	var errs []error
	for i := len(l.rec.Handed) - 1; i >= 0; i-- {
		h := l.rec.Handed[i]
		// A root the session moved away (and maybe put a link in its
		// place) is found again by the walk of the directory it is in.
		if err := l.handBackOne(i); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
			errs = append(errs, fmt.Errorf("hand %s back: %w", h.Path, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	l.rec.Handed = nil
	l.closeHeld()
	return l.lock.Truncate(0)
}

func (l *lease) closeHeld() {
	for _, fd := range l.held {
		unix.Close(fd)
	}
	l.held = nil
}

// rootOf is the descriptor of handed root i: the one held since the
// hand-over, or, for a record a dead launcher left, its path opened from /
// through no link, if it still is the file handed over.
func (l *lease) rootOf(i int) (int, error) {
	if i < len(l.held) {
		return unix.FcntlInt(uintptr(l.held[i]), unix.F_DUPFD_CLOEXEC, 0)
	}
	h := l.rec.Handed[i]
	fd, err := safepath.OpenNoFollow(h.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || (h.Ino != 0 && (st.Dev != h.Dev || st.Ino != h.Ino)) {
		// Another file there now: the tree moved away, and the walk of
		// the one it is in finds it.
		unix.Close(fd)
		return -1, unix.ENOENT
	}
	return fd, nil
}

func (l *lease) handBackOne(i int) error {
	h := l.rec.Handed[i]
	fd, err := l.rootOf(i)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if h.Recurse {
		err := walkAt(fd, h.Path, 0, func(fd int, st *unix.Stat_t) error {
			uid, gid := -1, -1
			if st.Uid == l.uid {
				uid = int(h.UID)
			}
			if st.Gid == l.uid {
				gid = int(h.GID)
			}
			if uid >= 0 || gid >= 0 {
				return chownFd(fd, uid, gid)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if err := unix.Fchown(fd, int(h.UID), int(h.GID)); err != nil {
		return err
	}
	return unix.Fchmod(fd, h.Mode)
}

// release hands everything back and frees the uid: the lock file is
// removed while still locked (tryLease checks that the file it locked is
// still the one at the path), unless something could not be handed back,
// when its record stays for the next launcher to retry.
func (l *lease) release() error {
	err := l.handBack()
	if err == nil {
		err = unix.Unlink(l.path)
	}
	l.closeHeld()
	l.lock.Close()
	return err
}

// maxDepth bounds walkAt: each level holds a descriptor, and a session
// may nest directories as deep as it likes.
const maxDepth = 4096

// walkAt calls fn for every entry of any type under the directory dirfd
// (depth first, a directory's entries before it) with a descriptor of
// the entry and what that descriptor says of it. Each entry is opened
// once through its parent's descriptor without following a link (O_PATH,
// so that a fifo or a device is never opened for real), and what fn
// checks and does is on that descriptor: an entry renamed or swapped
// after the walk looked at it is not the one acted on. depth is dirfd's,
// 0 at the top.
func walkAt(dirfd int, path string, depth int, fn func(fd int, st *unix.Stat_t) error) error {
	if depth > maxDepth {
		return fmt.Errorf("%s: more than %d directories deep", path, maxDepth)
	}
	dup, err := unix.Dup(dirfd)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), path)
	defer d.Close()
	if _, err := d.Seek(0, io.SeekStart); err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	for _, name := range names {
		if err := walkEntry(dirfd, path, name, depth, fn); err != nil {
			return err
		}
	}
	return nil
}

func walkEntry(dirfd int, path, name string, depth int, fn func(fd int, st *unix.Stat_t) error) error {
	sub := filepath.Join(path, name)
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", sub, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return err
	}
	testhook.SwapEntry("walk.entry", name)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// The directory itself, read through this descriptor.
		dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("open %s: %w", sub, err)
		}
		fd = dfd
		if err := walkAt(fd, sub, depth+1, fn); err != nil {
			unix.Close(fd)
			return err
		}
	}
	defer unix.Close(fd)
	if err := fn(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", sub, err)
	}
	return nil
}

// chownFd changes the owner of what fd (a walkAt descriptor) holds, a
// link itself rather than what it points to; -1 leaves an id.
func chownFd(fd, uid, gid int) error {
	return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
}

// namedIDs are the ids /etc/passwd names as a uid or /etc/group as a gid:
// a session's uid is also its gid, so neither may be taken.
func namedIDs() (map[uint32]bool, error) {
	named := map[uint32]bool{}
	for _, path := range []string{"/etc/passwd", "/etc/group"} {
		err := eachLine(path, func(fields []string) bool {
			if len(fields) > 2 {
				if id, err := strconv.ParseUint(fields[2], 10, 32); err == nil {
					named[uint32(id)] = true
				}
			}
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	return named, nil
}

// runningUIDs are the uids (real, effective, saved, file system) of every
// live process on the host. A zombie is not counted: it runs nothing and
// holds no file, and a session's bwrap killed with its launcher stays one
// until whoever inherited it reaps it.
func runningUIDs() map[uint32]bool {
	uids := map[uint32]bool{}
	procs, _ := os.ReadDir("/proc")
	buf := make([]byte, 2048) // State and Uid are in the first lines
	for _, p := range procs {
		if c := p.Name()[0]; c < '0' || c > '9' {
			continue
		}
		fd, err := unix.Open("/proc/"+p.Name()+"/status", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // gone meanwhile
		}
		n, _ := unix.Read(fd, buf)
		unix.Close(fd)
		if n <= 0 {
			continue
		}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			if state, ok := strings.CutPrefix(line, "State:"); ok {
				if s := strings.TrimSpace(state); s != "" && (s[0] == 'Z' || s[0] == 'X') {
					break
				}
			}
			if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
				for _, f := range strings.Fields(rest) {
					if id, err := strconv.ParseUint(f, 10, 32); err == nil {
						uids[uint32(id)] = true
					}
				}
				break
			}
		}
	}
	return uids
}

// ParseUIDRange reads --uid-range LOW-HIGH, for run and for sandbox serve
// to tell sessions' uids.
func ParseUIDRange(s string) (uint32, uint32, error) {
	a, b, ok := strings.Cut(s, "-")
	lo, err1 := strconv.ParseUint(a, 10, 32)
	hi, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || lo == 0 || hi < lo || hi >= 1<<31 {
		return 0, 0, fmt.Errorf("--uid-range %q: want LOW-HIGH, 0 < LOW <= HIGH < 2^31", s)
	}
	return uint32(lo), uint32(hi), nil
}
