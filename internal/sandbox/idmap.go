package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/testhook"
)

// A session with a uid of its own sees its workspace, HOME, /tmp and token
// through idmapped mounts: each maps the uid that owns it on disk to the
// session's uid, and its group to the session's gid, so that inside they
// are the session's and what the session writes lands on disk as the
// owner's. Nothing is chowned before or after, so a start costs the same
// whatever the workspace holds. Files of other owners have no uid through
// the mount: the session sees them as the overflow uid, reads them as
// their modes allow and can never write them (the kernel refuses a write
// to an inode whose owner the mount does not map). Other groups keep their
// own numbers, so group permissions mean what they mean on the host.
//
// Where the kernel (before Linux 5.12) or a file system cannot, run falls
// back to handing the trees over by walking them (handOver, handBack).

// idmapped is the session's trees as detached idmapped mounts, made before
// the launch, attached only in the private mount namespace bwrap starts in.
type idmapped struct {
	mounts []idmount
}

// idmount is one tree: mfd is the idmapped clone of the tree held by fd
// (named path), attached over the tree itself in the launching thread's
// own mount namespace. fd is kept to give the tree's root its mode (st)
// back at the end: the session owns the root inside, and may open it to
// everyone.
type idmount struct {
	mfd  int
	fd   int
	path string
	st   unix.Stat_t
}

// Mapped is a directory a session sees as its own through an idmapped
// mount, as run records it for sandbox serve: the session's uid stands
// there for UID, who owns it on disk. Mode is its mode before the
// session, which a launcher that reclaims the uid of a dead one gives it
// back.
type Mapped struct {
	Path string `json:"path"`
	Dev  uint64 `json:"dev"`
	Ino  uint64 `json:"ino"`
	UID  uint32 `json:"uid"`
	Mode uint32 `json:"mode,omitempty"`
}

// restoreModes gives each directory a dead launcher's session saw as its
// own the mode it had, if its path still leads, through no link, to that
// very directory (one moved away is left as it is).
func restoreModes(mapped []Mapped) {
	for _, m := range mapped {
		if m.Mode == 0 {
			continue
		}
		fd, err := safepath.OpenNoFollow(m.Path, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Dev == m.Dev && st.Ino == m.Ino {
			unix.Fchmod(fd, m.Mode)
		}
		unix.Close(fd)
	}
}

// close lets go of the mounts (those not attached vanish with their
// descriptors, those attached stay in the namespace that holds them) and
// gives each tree's root the mode it had: what the session did to a
// root's mode would stay on the host, world-writable maybe.
func (m *idmapped) close() error {
	var errs []error
	for _, x := range m.mounts {
		unix.Close(x.mfd)
		if err := unix.Fchmod(x.fd, x.st.Mode&0o7777); err != nil {
			errs = append(errs, fmt.Errorf("give %s its mode %o back: %w", x.path, x.st.Mode&0o7777, err))
		}
		unix.Close(x.fd)
	}
	m.mounts = nil
	return errors.Join(errs...)
}

// waitPid waits for the child pid to exit, reaps it and returns its
// status.
func waitPid(pid int) (ws unix.WaitStatus) {
	for {
		if _, err := unix.Wait4(pid, &ws, 0, nil); err != unix.EINTR {
			return ws
		}
	}
}

// errNoIDMap marks why the idmapped mounts cannot be used here.
type errNoIDMap struct{ why string }

func (e *errNoIDMap) Error() string { return e.why }

// idmapTrees makes an idmapped clone of each tree (the run directory
// itself excepted: it stays the host's, and the session only passes
// through it), mapping the uid and gid owning its root to id. An
// *errNoIDMap says this kernel or file system cannot; run then walks.
func (p *Plan) idmapTrees(trees []tree, id uint32) (_ *idmapped, err error) {
	if why := p.idmapBlocked(); why != "" {
		return nil, &errNoIDMap{why}
	}
	m := &idmapped{}
	userns := map[[2]uint32]int{}
	defer func() {
		for _, fd := range userns {
			unix.Close(fd)
		}
		if err != nil {
			m.close()
		}
	}()
	for _, t := range trees {
		if t.fd == p.run.Fd() {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstat(t.fd, &st); err != nil {
			return nil, err
		}
		key := [2]uint32{st.Uid, st.Gid}
		ns, ok := userns[key]
		if !ok {
			var err error
			ns, err = usernsMapping(st.Uid, st.Gid, id)
			if err != nil {
				return nil, &errNoIDMap{fmt.Sprintf("make a user namespace for the mapping: %v", err)}
			}
			userns[key] = ns
		}
		mfd, err := idmapClone(t.fd, ns, st.Mode&unix.S_IFMT == unix.S_IFDIR)
		if err != nil {
			return nil, &errNoIDMap{fmt.Sprintf("%s: %v", t.path, err)}
		}
		fd, err := unix.FcntlInt(uintptr(t.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			unix.Close(mfd)
			return nil, err
		}
		m.mounts = append(m.mounts, idmount{mfd: mfd, fd: fd, path: t.path, st: st})
	}
	return m, nil
}

// idmapBlocked is why run would not try idmapped mounts, or "".
func (p *Plan) idmapBlocked() string {
	if testhook.NoIDMap() {
		return "idmapped mounts turned off for this test"
	}
	if st := p.run.Stat(); st.Mode&0o001 == 0 {
		return fmt.Sprintf("the run directory %s is not searchable by others (mode %o), so the session could not reach its HOME through it", p.RunDir, st.Mode&0o777)
	}
	var st unix.Stat_t
	if err := unix.Fstat(p.ws.Fd(), &st); err != nil {
		return err.Error()
	}
	if st.Uid == 0 && !dirEmpty(p.ws.Fd()) {
		return fmt.Sprintf("the workspace %s is root's and not empty: through an idmapped mount the session would own root's files there, and could rewrite a set-user-ID program of root's through a shared mapping, which strips no set-id bit (the walk's chown strips them)", p.Workspace)
	}
	if st.Uid != 0 && st.Gid == 0 {
		return fmt.Sprintf("the workspace %s is uid %d's in group root: through an idmapped mount, which maps its group to the session's, the session would be in group root there and read what only that group may (give it its owner's group)", p.Workspace, st.Uid)
	}
	return ""
}

// dirEmpty says whether the directory fd holds no entry; an error reads
// as not empty.
func dirEmpty(fd int) bool {
	d, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(d), ".")
	defer f.Close()
	names, err := f.Readdirnames(1)
	return len(names) == 0 && err == io.EOF
}

// idmapClone clones the mount of what fd holds (with the mounts under it,
// for a directory) and maps it through the user namespace ns.
func idmapClone(fd, ns int, dir bool) (int, error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_EMPTY_PATH
	attrFlags := unix.AT_EMPTY_PATH
	if dir {
		flags |= unix.AT_RECURSIVE
		attrFlags |= unix.AT_RECURSIVE
	}
	mfd, err := unix.OpenTree(fd, "", uint(flags))
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}
	if err := unix.MountSetattr(mfd, "", uint(attrFlags), &attr); err != nil {
		unix.Close(mfd)
		return -1, fmt.Errorf("mount_setattr MOUNT_ATTR_IDMAP: %w", err)
	}
	return mfd, nil
}

// holdSignals is every signal: blocked around the clone below, so the
// child, which shares this process's memory and stack, never runs a
// handler.
var holdSignals = ^uint64(0)

// usernsMapping makes a user namespace whose uid map takes uid to id and
// whose gid map takes gid to id and every other group to itself, and
// returns its descriptor, what mount_setattr reads an idmap from. The
// namespace is a child's, cloned straight into it (cloneExited), which
// exits at once: its credentials, and so its namespace, stay until it is
// reaped, here, once the maps are written through its /proc entry and the
// namespace is held by the descriptor.
func usernsMapping(uid, gid, id uint32) (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old uint64
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&holdSignals)), uintptr(unsafe.Pointer(&old)), 8, 0, 0); errno != 0 {
		return -1, errno
	}
	pid, errno := cloneExited(uintptr(unix.CLONE_NEWUSER | unix.SIGCHLD))
	unix.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&old)), 0, 8, 0, 0)
	if errno != 0 {
		return -1, fmt.Errorf("clone: %w", unix.Errno(errno))
	}
	defer waitPid(int(pid))
	dir := "/proc/" + strconv.Itoa(int(pid)) + "/"
	if err := os.WriteFile(dir+"uid_map", []byte(fmt.Sprintf("%d %d 1\n", uid, id)), 0); err != nil {
		return -1, err
	}
	if err := os.WriteFile(dir+"gid_map", []byte(gidMap(gid, id)), 0); err != nil {
		return -1, err
	}
	return unix.Open(dir+"ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// maxID bounds the ids a map may name: (uid_t)-1 is no id.
const maxID = 1<<32 - 1

// gidMap is gid as id, and every other group but id itself as itself.
func gidMap(gid, id uint32) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %d 1\n", gid, id)
	cuts := []uint32{min(gid, id), max(gid, id)}
	next := uint64(0)
	for _, c := range cuts {
		if uint64(c) > next {
			fmt.Fprintf(&b, "%d %d %d\n", next, next, uint64(c)-next)
		}
		next = max(next, uint64(c)+1)
	}
	if next < maxID {
		fmt.Fprintf(&b, "%d %d %d\n", next, next, maxID-next)
	}
	return b.String()
}

// attach puts each mount over the tree it maps, in a mount namespace of
// the calling thread's own (which bwrap, forked from this thread, starts
// in): nothing is mounted where anyone else could see it, and the
// namespace goes when bwrap and the thread are gone. Each tree is found
// again by its path from this namespace's root, following no link, and
// must still be the file checked (else PATH_CHANGED); the mount is
// attached to that very descriptor. The caller's thread must stay locked
// and must not be unlocked again: it ends with its goroutine.
func (m *idmapped) attach() error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace for the session's idmapped mounts: %w", err)
	}
	// Nothing mounted here may reach the host's namespace.
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the session's mount namespace a slave: %w", err)
	}
	for _, x := range m.mounts {
		fd, err := safepath.OpenNoFollow(x.path, unix.O_PATH)
		if err == nil {
			var st unix.Stat_t
			if err = unix.Fstat(fd, &st); err == nil && (st.Dev != x.st.Dev || st.Ino != x.st.Ino) {
				err = errors.New("another file is there now")
			}
			if err != nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			return &safepath.Error{Reason: safepath.ReasonChanged, Path: x.path, Owner: int(x.st.Uid), Mode: os.FileMode(x.st.Mode & 0o777),
				Msg: fmt.Sprintf("PATH_CHANGED: %s changed after it was checked (%v): refused, never followed", x.path, err)}
		}
		err = unix.MoveMount(x.mfd, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("attach the idmapped mount of %s: %w", filepath.Clean(x.path), err)
		}
	}
	return nil
}

// mapped is what the session sees as its own, for its record.
func (m *idmapped) mapped() []Mapped {
	var out []Mapped
	for _, x := range m.mounts {
		if x.st.Mode&unix.S_IFMT == unix.S_IFDIR {
			out = append(out, Mapped{Path: x.path, Dev: x.st.Dev, Ino: x.st.Ino, UID: x.st.Uid, Mode: x.st.Mode & 0o7777})
		}
	}
	return out
}

// shareMode says how run would give a session's uid its trees here: it
// makes (and drops) an idmapped clone of the workspace, as run would.
func (p *Plan) shareMode() string {
	const mapped = "idmapped mounts: the session sees the workspace, HOME, /tmp and its token as its own, and what it writes is their owner's on disk; files of other owners are the overflow uid inside, never writable; nothing is chowned"
	why := p.idmapBlocked()
	if why == "" {
		st := p.ws.Stat()
		ns, err := usernsMapping(st.Uid, st.Gid, p.Config.UIDLow)
		if err == nil {
			var mfd int
			mfd, err = idmapClone(p.ws.Fd(), ns, true)
			unix.Close(ns)
			if err == nil {
				unix.Close(mfd)
				return mapped
			}
		}
		why = err.Error()
	}
	return fmt.Sprintf("walked (no idmapped mounts here: %s): the workspace, the run directory, HOME, /tmp and the token are handed to the session's uid by chowning every entry before the session and back after, which takes time with their size", why)
}
