package supervisor

import (
	"errors"
	"fmt"
	"io"
	"path"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/safepath"
)

// A tree the agent wrote may be as deep as it likes: a walk that held one
// descriptor per level would run out of them (1,024 in the seed's
// container) in a 1,100-level tree, and take the boot, the commit or the
// revert with it. walkTree holds at most heldDirs descriptors of its own at
// any depth.

// heldDirs is how many directory descriptors a walk keeps open at once,
// besides the root its caller holds.
const heldDirs = 16

// maxTreeDepth is how many directories deep below its watched tree a
// directory may be and still be recorded: git itself holds a descriptor per
// level while it stages, so a deeper directory is refused by name, and
// blocks commits until it is gone (a revert removes it).
const maxTreeDepth = 256

// errTreeChanged is a directory that was no longer the one the walk had
// left when it came back to it.
var errTreeChanged = errors.New("a directory changed while the tree was walked")

type walkFrame struct {
	name     string
	fd       int
	dev, ino uint64
}

// walkFuncs are what a walk does. visit is called for each entry, with its
// parent's descriptor (valid during the call only), its path from the root
// and its lstat, at depth 1 for the root's entries; a directory is entered
// when it returns true. post is called once a directory entered has been
// walked, with its parent's descriptor. dirErr is called for a directory
// that cannot be opened or read: a non-nil return (or no dirErr) ends the walk.
type walkFuncs struct {
	visit  func(dirfd int, rel, name string, st *unix.Stat_t, depth int) (bool, error)
	post   func(dirfd int, rel, name string) error
	dirErr func(rel string, err error) error
}

type dirWalk struct {
	// frames[0] is the root, whose descriptor is the caller's.
	frames []walkFrame
	held   int
}

// walkTree walks the tree under the directory root, depth first, following
// no link. A directory whose descriptor the walk let go is opened again
// from the nearest one still held, one name at a time, and must be the
// same directory (device and inode), or the walk fails with
// errTreeChanged.
func walkTree(root int, f walkFuncs) error {
	if f.dirErr == nil {
		f.dirErr = func(rel string, err error) error { return fmt.Errorf("%s: %w", QuotePath(rel), err) }
	}
	w := &dirWalk{frames: []walkFrame{{fd: root}}}
	defer func() {
		for len(w.frames) > 1 {
			w.pop()
		}
	}()
	return w.dir("", 0, f)
}

// fd returns the descriptor of frame i, opening it again if it was let go,
// with the frames above it that fit in heldDirs: the walk back up a deep
// tree opens each directory again about depth/heldDirs times, not depth.
func (w *dirWalk) fd(i int) (int, error) {
	if w.frames[i].fd >= 0 {
		return w.frames[i].fd, nil
	}
	j := i
	for w.frames[j].fd < 0 {
		j--
	}
	cur, curHeld := w.frames[j].fd, true
	for k := j + 1; k <= i; k++ {
		fd, err := openSame(cur, w.frames[k].name, w.frames[k].dev, w.frames[k].ino)
		if !curHeld {
			unix.Close(cur)
		}
		if errors.Is(err, errTreeChanged) {
			return -1, err
		}
		if err != nil {
			return -1, fmt.Errorf("%w: %v", errTreeChanged, err)
		}
		cur, curHeld = fd, k > i-heldDirs
		if curHeld {
			w.frames[k].fd = fd
			w.held++
		}
	}
	w.trim()
	return cur, nil
}

// openSame opens the directory name beneath dirfd, following no link, and
// refuses (errTreeChanged) one that is not the directory dev, ino.
func openSame(dirfd int, name string, dev, ino uint64) (int, error) {
	fd, err := safepath.OpenBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil && (st.Dev != dev || st.Ino != ino) {
		err = errTreeChanged
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// trim lets go of the held descriptors nearest the root (never the root's
// nor the deepest) until at most heldDirs are held.
func (w *dirWalk) trim() {
	for i := 1; w.held > heldDirs && i < len(w.frames)-1; i++ {
		if w.frames[i].fd >= 0 {
			unix.Close(w.frames[i].fd)
			w.frames[i].fd = -1
			w.held--
		}
	}
}

func (w *dirWalk) push(name string, fd int, st *unix.Stat_t) {
	w.frames = append(w.frames, walkFrame{name: name, fd: fd, dev: st.Dev, ino: st.Ino})
	w.held++
	w.trim()
}

func (w *dirWalk) pop() {
	top := w.frames[len(w.frames)-1]
	if top.fd >= 0 {
		unix.Close(top.fd)
		w.held--
	}
	w.frames = w.frames[:len(w.frames)-1]
}

// readBatch is how many bytes of a directory's entries a walk reads at a
// time: a directory's names cost the agent a directory entry each (a hard
// link needs no inode), so a walk holds a batch of them per level, never
// the whole list of a directory of millions.
const readBatch = 8 << 10

// readNames lists the directory fd from the position pos (0: its start),
// one batch of entries, and returns the position after them; no names at
// its end. A position is the file system's own (lseek on the directory),
// which stays valid while entries are added and removed.
func readNames(fd int, pos int64) ([]string, int64, error) {
	d, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(d)
	if _, err := unix.Seek(d, pos, io.SeekStart); err != nil {
		return nil, 0, err
	}
	buf := make([]byte, readBatch)
	for {
		n, err := unix.Getdents(d, buf)
		if err != nil || n <= 0 {
			return nil, 0, err
		}
		// ParseDirent leaves out "." and "..".
		_, _, names := unix.ParseDirent(buf[:n], -1, nil)
		if len(names) > 0 {
			next, err := unix.Seek(d, 0, io.SeekCurrent)
			return names, next, err
		}
	}
}

func (w *dirWalk) dir(rel string, depth int, f walkFuncs) error {
	top := len(w.frames) - 1
	var pos int64
	for {
		fd, err := w.fd(top)
		if err != nil {
			return err
		}
		names, next, err := readNames(fd, pos)
		if err != nil {
			return f.dirErr(rel, err)
		}
		if len(names) == 0 {
			return nil
		}
		pos = next
		if err := w.entries(rel, depth, top, names, f); err != nil {
			return err
		}
	}
}

// entries walks names, one batch of the directory frames[top].
func (w *dirWalk) entries(rel string, depth, top int, names []string, f walkFuncs) error {
	for _, name := range names {
		fd, err := w.fd(top)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("%s: %w", QuotePath(path.Join(rel, name)), err)
		}
		crel := path.Join(rel, name)
		enter, err := f.visit(fd, crel, name, &st, depth+1)
		if err != nil {
			return err
		}
		if !enter || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		cfd, err := openSame(fd, name, st.Dev, st.Ino)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, errTreeChanged) {
				// Swapped or removed since the stat: not followed.
				continue
			}
			if err := f.dirErr(crel, err); err != nil {
				return err
			}
			continue
		}
		w.push(name, cfd, &st)
		err = w.dir(crel, depth+1, f)
		w.pop()
		if err != nil {
			return err
		}
		if f.post != nil {
			pfd, err := w.fd(top)
			if err != nil {
				return err
			}
			if err := f.post(pfd, crel, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeAllAt removes name under the directory dirfd and, if it is a
// directory, everything in it, at any depth, following no link and
// holding at most heldDirs descriptors. It returns the first path (from
// rel, name's own path) it could not remove.
func removeAllAt(dirfd int, rel, name string) error {
	// at names the path crel below rel in an error.
	at := func(crel string, err error) error {
		return fmt.Errorf("%s: %w", QuotePath(path.Join(rel, crel)), err)
	}
	unlink := func(dirfd int, crel, name string, flags int) error {
		if err := unix.Unlinkat(dirfd, name, flags); err != nil && !errors.Is(err, unix.ENOENT) {
			return at(crel, err)
		}
		return nil
	}
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return at("", err)
	}
	fd, err := safepath.OpenBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return at("", err)
	}
	defer unix.Close(fd)
	err = walkTree(fd, walkFuncs{
		visit: func(dirfd int, crel, name string, st *unix.Stat_t, _ int) (bool, error) {
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return true, nil
			}
			return false, unlink(dirfd, crel, name, 0)
		},
		post:   func(dirfd int, crel, name string) error { return unlink(dirfd, crel, name, unix.AT_REMOVEDIR) },
		dirErr: at,
	})
	if err != nil {
		return err
	}
	return unlink(dirfd, "", name, unix.AT_REMOVEDIR)
}
