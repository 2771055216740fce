package gitobj

import (
	"os"

	"github.com/go-git/go-billy/v5/osfs"
	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// OpenRepository opens the bare repository at path with go-git, for its
// refs and its storage's reads: a caller that reads many objects reads
// them through mapped indexes (gitd's views), since go-git's storage
// decodes every index of a repository whole on its first read.
func OpenRepository(path string) (*gogit.Repository, error) {
	fs := osfs.New(path)
	if _, err := fs.Stat(""); err != nil {
		if os.IsNotExist(err) {
			return nil, gogit.ErrRepositoryNotExists
		}
		return nil, err
	}
	return gogit.Open(filesystem.NewStorage(fs, cache.NewObjectLRUDefault()), nil)
}
