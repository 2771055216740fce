package mcp

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/bushost/bushost/internal/errdefs"
)

// maxRepoArg bounds a repo argument, in bytes.
const maxRepoArg = 1024

// repo returns the directory a repo (or workspace) argument names: rel,
// relative to the server's working directory, which it must stay inside.
// It refuses an absolute path, a ".." anywhere, and a link on the way
// (each existing component is looked at without following it); what does
// not exist yet is left for the command to make. The server runs as its
// caller, so this keeps a tool to the directory the harness started it in
// rather than guarding anything the caller could not reach itself.
func (sv *server) repo(rel string) (string, error) {
	switch {
	case rel == "":
		return "", errdefs.InvalidArgument(errdefs.ArgumentInvalid, "give repo: a directory relative to the server's working directory %s", sv.root)
	case len(rel) > maxRepoArg:
		return "", errdefs.InvalidArgument(errdefs.ArgumentInvalid, "repo is %d bytes, over the limit of %d", len(rel), maxRepoArg).With("limit", "1024")
	case strings.ContainsRune(rel, 0):
		return "", errdefs.InvalidArgument(errdefs.ArgumentInvalid, "repo %q holds a NUL byte", rel)
	case filepath.IsAbs(rel):
		return "", errdefs.InvalidArgument(errdefs.ArgumentInvalid, "repo %q is absolute: give a directory relative to the server's working directory %s", rel, sv.root).With("repo", rel)
	}
	for _, part := range strings.Split(rel, "/") {
		if part == ".." {
			return "", errdefs.InvalidArgument(errdefs.ArgumentInvalid, "repo %q climbs out with \"..\": give a directory inside the server's working directory %s", rel, sv.root).With("repo", rel)
		}
	}
	clean := filepath.Clean(rel)
	p := sv.root
	for _, part := range strings.Split(clean, "/") {
		if part == "." {
			continue
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return "", errdefs.FailedPrecondition(errdefs.PathUnsafe, "repo %q: %v", rel, err).With("repo", rel)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return "", errdefs.FailedPrecondition(errdefs.PathUnsafe, "repo %q: %s is a symbolic link, which a tool does not follow: give the directory itself, inside %s", rel, p, sv.root).With("repo", rel)
		}
		if !fi.IsDir() {
			return "", errdefs.FailedPrecondition(errdefs.PathUnsafe, "repo %q: %s is not a directory", rel, p).With("repo", rel)
		}
	}
	return filepath.Join(sv.root, clean), nil
}
