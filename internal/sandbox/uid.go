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
	uid uint32
	// lo-hi is the range uid came from: a tree already owned by a uid
	// in it belongs to another session, and is not taken from it.
	lo, hi uint32
	lock   *os.File
	rec    leaseRecord
}

// leaseRecord is the lock file's content while a session holds the uid.
type leaseRecord struct {
	UID    uint32   `json:"uid"`
	Handed []handed `json:"handed"`
}

// handed is a tree (or one directory or file) given to the session's uid:
// what was owned by UID:GID there and the root's mode, to put back.
type handed struct {
	Path    string `json:"path"`
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
		l, err := tryLease(state, uid, lo, hi)
		if err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
	}
	return nil, refuse(ReasonSessionUIDsExhausted, exitLimit, "no free session uid in %d-%d (each is named in /etc/passwd or /etc/group, run by a process, or locked in %s)", lo, hi, state)
}

// tryLease locks uid's file, reclaiming a dead launcher's record; nil if
// another launcher holds it.
func tryLease(state string, uid, lo, hi uint32) (*lease, error) {
	path := filepath.Join(state, strconv.FormatUint(uint64(uid), 10)+".lock")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	l := &lease{uid: uid, lo: lo, hi: hi, lock: f, rec: leaseRecord{UID: uid}}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		f.Close()
		return nil, err
	}
	if len(data) > 0 {
		// A launcher died holding this uid, and no process runs as it
		// any more: hand back what it had handed over.
		var old leaseRecord
		if err := json.Unmarshal(data, &old); err != nil || old.UID != uid {
			f.Close()
			return nil, fmt.Errorf("lock %s holds no record of uid %d: remove it by hand once you know no session uses the uid", path, uid)
		}
		l.rec = old
		if err := l.handBack(); err != nil {
			f.Close()
			return nil, fmt.Errorf("reclaim uid %d from a launcher that died: %w", uid, err)
		}
	}
	return l, nil
}

// save writes the record before anything is handed over, so that a crash
// at any later point leaves enough for the next launcher to undo it.
func (l *lease) save() error {
	data, err := json.Marshal(l.rec)
	if err != nil {
		return err
	}
	if err := l.lock.Truncate(0); err != nil {
		return err
	}
	if _, err := l.lock.WriteAt(data, 0); err != nil {
		return err
	}
	return l.lock.Sync()
}

// handOver gives path to the lease's uid: the root itself (whatever owns
// it, mode 0700 for a directory so no other session may look in) and, with
// recurse, every directory, regular file and symlink under it owned by the
// root's owner. It never follows a link, leaves device nodes, fifos and
// sockets alone, and skips files with more than one link (a hard link
// would hand over a file outside the tree).
func (l *lease) handOver(path string, recurse bool) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open %s (never a symlink): %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Uid >= l.lo && st.Uid <= l.hi {
		return fmt.Errorf("%s belongs to uid %d, another session's (still running, or its launcher died while it runs): it cannot be handed to this one", path, st.Uid)
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if !isDir && st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s is neither a directory nor a regular file", path)
	}
	l.rec.Handed = append(l.rec.Handed, handed{Path: path, UID: st.Uid, GID: st.Gid, Mode: st.Mode & 0o7777, Recurse: recurse && isDir})
	if err := l.save(); err != nil {
		return fmt.Errorf("record the hand-over of %s: %w", path, err)
	}
	if err := unix.Fchown(fd, int(l.uid), -1); err != nil {
		return fmt.Errorf("give %s to uid %d: %w", path, l.uid, err)
	}
	if isDir {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return err
		}
		if recurse {
			return walkAt(fd, path, func(dirfd int, name string, st *unix.Stat_t) error {
				if st.Uid != l.rec.Handed[len(l.rec.Handed)-1].UID || (st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1) {
					return nil
				}
				return unix.Fchownat(dirfd, name, int(l.uid), -1, unix.AT_SYMLINK_NOFOLLOW)
			})
		}
	}
	return nil
}

// handBack gives every handed tree back: whatever the uid (or its group,
// the same number) owns there goes to the root's old owner and group, and
// each root gets its old mode. Only then is the uid free: nothing on the
// host stays owned by it.
func (l *lease) handBack() error {
	var errs []error
	for i := len(l.rec.Handed) - 1; i >= 0; i-- {
		h := l.rec.Handed[i]
		if err := l.handBackOne(h); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("hand %s back: %w", h.Path, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	l.rec.Handed = nil
	return l.lock.Truncate(0)
}

func (l *lease) handBackOne(h handed) error {
	fd, err := unix.Open(h.Path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	back := func(st *unix.Stat_t) (int, int) {
		uid, gid := -1, -1
		if st.Uid == l.uid {
			uid = int(h.UID)
		}
		if st.Gid == l.uid {
			gid = int(h.GID)
		}
		return uid, gid
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if h.Recurse {
		err := walkAt(fd, h.Path, func(dirfd int, name string, st *unix.Stat_t) error {
			if uid, gid := back(st); uid >= 0 || gid >= 0 {
				return unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
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

// release hands everything back and unlocks the uid. The lock file stays
// (empty): removing it could let two launchers lock two different files
// of the same name.
func (l *lease) release() error {
	err := l.handBack()
	l.lock.Close()
	return err
}

// walkAt calls fn for every entry under the directory dirfd (depth first,
// a directory's entries before it), opening each subdirectory through its
// parent's descriptor without following a link.
func walkAt(dirfd int, path string, fn func(dirfd int, name string, st *unix.Stat_t) error) error {
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
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open %s: %w", filepath.Join(path, name), err)
			}
			err = walkAt(sub, filepath.Join(path, name), fn)
			unix.Close(sub)
			if err != nil {
				return err
			}
		case unix.S_IFREG, unix.S_IFLNK:
		default:
			continue // devices, fifos, sockets: never handed over
		}
		if err := fn(dirfd, name, &st); err != nil {
			return fmt.Errorf("%s: %w", filepath.Join(path, name), err)
		}
	}
	return nil
}

// namedIDs are the ids /etc/passwd names as a uid or /etc/group as a gid:
// a session's uid is also its gid, so neither may be taken.
func namedIDs() (map[uint32]bool, error) {
	named := map[uint32]bool{}
	for _, f := range []struct {
		path  string
		field int
	}{{"/etc/passwd", 2}, {"/etc/group", 2}} {
		err := eachLine(f.path, func(fields []string) bool {
			if len(fields) > f.field {
				if id, err := strconv.ParseUint(fields[f.field], 10, 32); err == nil {
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
	dirs, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, d := range dirs {
		data, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
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

// parseUIDRange reads LOW-HIGH.
func parseUIDRange(s string) (uint32, uint32, error) {
	a, b, ok := strings.Cut(s, "-")
	lo, err1 := strconv.ParseUint(a, 10, 32)
	hi, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil || lo == 0 || hi < lo || hi >= 1<<31 {
		return 0, 0, fmt.Errorf("--uid-range %q: want LOW-HIGH, 0 < LOW <= HIGH < 2^31", s)
	}
	return uint32(lo), uint32(hi), nil
}
