package gitd

import (
	"os"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// openGoGit opens the bare repository at path with go-git, for its refs:
// objects are read through the daemon's mapped pack indexes (view.go),
// never through go-git's storage, which decodes every index of a
// repository whole on a request's first read.
func openGoGit(path string) (*git.Repository, error) {
	fs := osfs.New(path)
	if _, err := fs.Stat(""); err != nil {
		if os.IsNotExist(err) {
			return nil, git.ErrRepositoryNotExists
		}
		return nil, err
	}
	return git.Open(filesystem.NewStorage(fs, cache.NewObjectLRUDefault()), nil)
}
