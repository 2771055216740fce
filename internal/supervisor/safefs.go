package supervisor

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/safepath"
)

// init runs as root in a workspace the agent has written. Everything it
// changes there it changes through a file descriptor: the workspace, its
// parent, the seed and the git dir are opened from / following no link
// (internal/safepath), each name below them relative to a directory it
// already holds (safepath.OpenBeneath), and ownership and modes are set on
// what was opened (fchown, fchmod, fsetxattr), never on a path that could
// have been swapped for a link in between.

// randReader names init's temporary files.
var randReader = rand.Reader

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
		next, err := safepath.OpenBeneath(cur, p, unix.O_DIRECTORY|unix.O_RDONLY)
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
	fd, err := safepath.OpenBeneath(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
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
