package gitobj

import (
	"io"
	"os"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/objfile"
)

// LooseHeader is the type and size of the loose object at path (go-git's
// objfile reads it; nothing past the header is inflated).
func LooseHeader(path string) (plumbing.ObjectType, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return 0, 0, plumbing.ErrObjectNotFound
		}
		return 0, 0, err
	}
	defer f.Close()
	r, err := objfile.NewReader(f)
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	return r.Header()
}

// ReadLoose reads the loose object at path whole, which its header must
// say is n bytes (the caller bounded n, from LooseHeader): one of another
// size, or cut short, was replaced meanwhile and is not found.
func ReadLoose(path string, n int64) (plumbing.EncodedObject, error) {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, plumbing.ErrObjectNotFound
		}
		return nil, err
	}
	defer f.Close()
	r, err := objfile.NewReader(f)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	t, size, err := r.Header()
	if err != nil {
		return nil, err
	}
	if size != n {
		return nil, plumbing.ErrObjectNotFound // replaced meanwhile
	}
	obj := &plumbing.MemoryObject{}
	obj.SetType(t)
	got, err := io.Copy(obj, io.LimitReader(r, size))
	if err != nil {
		return nil, err
	}
	if got != size {
		return nil, plumbing.ErrObjectNotFound // cut short
	}
	return obj, nil
}
