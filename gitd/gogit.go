package gitd

import (
	"bufio"
	"io"
	"os"
	"strings"

	"github.com/go-git/go-billy/v5"
	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// openGoGit opens the bare repository at path for reads in process, as
// git.PlainOpen does, except that pack indexes are read through a buffer.
//
// go-git decodes a pack index with one read system call per field of every
// entry, and it decodes every index of a repository whole on the first
// object read. Each fetch opens its repositories afresh, so its first read
// cost a system call per object the task had ever received: 0.8 ms at 100
// one-commit pushes, 1.7 ms at 1,000, more as the history grew
// (BenchmarkPushGrowth's fetch-review).
func openGoGit(path string) (*git.Repository, error) {
	fs := osfs.New(path)
	if _, err := fs.Stat(""); err != nil {
		if os.IsNotExist(err) {
			return nil, git.ErrRepositoryNotExists
		}
		return nil, err
	}
	return git.Open(filesystem.NewStorage(bufferedIndexes{fs}, cache.NewObjectLRUDefault()), nil)
}

// indexBuffer is the read buffer of a pack index (the fan-out table and
// about 3,000 entries at a time).
const indexBuffer = 64 << 10

// bufferedIndexes is a filesystem whose *.idx files are read through a
// buffer; everything else is the filesystem's own.
type bufferedIndexes struct{ billy.Filesystem }

func (f bufferedIndexes) Open(name string) (billy.File, error) {
	file, err := f.Filesystem.Open(name)
	return bufferIndex(name, file, err)
}

func (f bufferedIndexes) OpenFile(name string, flag int, perm os.FileMode) (billy.File, error) {
	file, err := f.Filesystem.OpenFile(name, flag, perm)
	if flag&(os.O_WRONLY|os.O_RDWR) != 0 {
		return file, err
	}
	return bufferIndex(name, file, err)
}

func (f bufferedIndexes) Chroot(path string) (billy.Filesystem, error) {
	c, err := f.Filesystem.Chroot(path)
	if err != nil {
		return nil, err
	}
	return bufferedIndexes{c}, nil
}

func bufferIndex(name string, file billy.File, err error) (billy.File, error) {
	if err != nil || !strings.HasSuffix(name, ".idx") {
		return file, err
	}
	return &bufferedFile{File: file, r: bufio.NewReaderSize(file, indexBuffer)}, nil
}

// bufferedFile reads file through r. Seek accounts for what r holds and
// drops it; ReadAt reads the file itself, which r does not change.
type bufferedFile struct {
	billy.File
	r *bufio.Reader
}

func (b *bufferedFile) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *bufferedFile) Seek(offset int64, whence int) (int64, error) {
	if whence == io.SeekCurrent {
		offset -= int64(b.r.Buffered())
	}
	n, err := b.File.Seek(offset, whence)
	b.r.Reset(b.File)
	return n, err
}
