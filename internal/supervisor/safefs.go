package supervisor

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/errdefs"
)

// init runs as root in a workspace the agent has written. Everything it
// changes there it changes through a file descriptor: each name is opened
// relative to a directory it already holds, following no link (openat2 with
// RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH; on a kernel without openat2, openat
// with O_NOFOLLOW on a single path component, which is the same for a name
// read from the directory itself), and ownership and modes are set on what
// was opened (fchown, fchmod, fsetxattr), never on a path that could have
// been swapped for a link in between.

// randReader names init's temporary files.
var randReader = rand.Reader

// noOpenat2 is set once the kernel says it has no openat2.
var noOpenat2 atomic.Bool

// openBeneath opens name (one or more components, none of them "..") under
// dirfd following no link. flags gets O_NOFOLLOW and O_CLOEXEC.
func openBeneath(dirfd int, name string, flags int) (int, error) {
	flags |= unix.O_NOFOLLOW | unix.O_CLOEXEC
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(dirfd, name, &unix.OpenHow{
			Flags:   uint64(flags),
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		})
		if !errors.Is(err, unix.ENOSYS) {
			return fd, err
		}
		noOpenat2.Store(true)
	}
	// Without openat2: one component at a time, each with O_NOFOLLOW.
	parts := strings.Split(name, "/")
	cur := dirfd
	for i, p := range parts {
		if p == "" || p == "." || p == ".." {
			if cur != dirfd {
				unix.Close(cur)
			}
			return -1, unix.EXDEV
		}
		f := unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_RDONLY
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
		cur = fd
	}
	return cur, nil
}

// openDirNoFollow opens the absolute directory path refusing a link in any
// component.
func openDirNoFollow(path string) (int, error) {
	root, err := unix.Open("/", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(root)
	rel := strings.TrimPrefix(filepath.Clean(path), "/")
	if rel == "" {
		return unix.Dup(root)
	}
	return openBeneath(root, rel, unix.O_DIRECTORY|unix.O_RDONLY)
}

// unsafePath is the refusal for a link or a non-directory where init needs
// a directory of its own making.
func unsafePath(path string, err error) error {
	return errdefs.FailedPrecondition(errdefs.WorkspaceUnsafe, "%s: %v (init follows no link: remove it as root)", path, err).With("path", path)
}

// mkdirAllBeneath makes rel (slash-separated) under dirfd, component by
// component, following no link, and returns a descriptor of the last one.
// Directories it makes get mode.
func mkdirAllBeneath(dirfd int, base, rel string, mode uint32) (int, error) {
	cur, err := unix.Dup(dirfd)
	if err != nil {
		return -1, err
	}
	for _, p := range strings.Split(rel, "/") {
		if err := unix.Mkdirat(cur, p, mode); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(cur)
			return -1, fmt.Errorf("%s: %w", filepath.Join(base, p), err)
		}
		next, err := openBeneath(cur, p, unix.O_DIRECTORY|unix.O_RDONLY)
		unix.Close(cur)
		if err != nil {
			return -1, unsafePath(filepath.Join(base, rel), err)
		}
		cur = next
	}
	return cur, nil
}

// readFileBeneath reads name under dirfd if it is a single-link regular file
// reached by no link; exists is false if there is nothing at name.
func readFileBeneath(dirfd int, name string, limit int64) (data []byte, exists bool, err error) {
	fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if errors.Is(err, unix.ENOENT) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, true, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return nil, true, fmt.Errorf("%s is not a single-link regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	return b, true, err
}

// replaceFileAt writes data to a new file in dirfd and renames it over name:
// a link at name is replaced, never written through.
func replaceFileAt(dirfd int, name string, data []byte, mode uint32) error {
	var buf [8]byte
	if _, err := io.ReadFull(randReader, buf[:]); err != nil {
		return err
	}
	tmp := fmt.Sprintf(".%s.tmp-%x", name, buf)
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, werr := f.Write(data)
	if werr == nil {
		werr = unix.Fchmod(fd, mode)
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dirfd, tmp, dirfd, name)
	}
	if werr != nil {
		unix.Unlinkat(dirfd, tmp, 0)
	}
	return werr
}
