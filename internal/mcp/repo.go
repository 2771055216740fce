package mcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/bushost/bushost/internal/errdefs"
)

// maxRepoArg bounds a repo argument, in bytes.
const maxRepoArg = 1024

// maxPointer bounds a .git or commondir file a tool reads, in bytes.
const maxPointer = 4096

// repo returns the directory a repo (or workspace) argument names: rel,
// relative to the server's working directory, which it must stay inside.
// It refuses an absolute path, a ".." anywhere, and a link on the way
// (each existing component is looked at without following it); what does
// not exist yet is left for the command to make. The repository's git
// directory must be inside it too (gitDirInside). The server runs as its
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
	if slices.Contains(strings.Split(rel, "/"), "..") {
		return "", errdefs.InvalidArgument(errdefs.ArgumentInvalid, "repo %q climbs out with \"..\": give a directory inside the server's working directory %s", rel, sv.root).With("repo", rel)
	}
	clean := filepath.Clean(rel)
	if _, p, err := dirsBelow(sv.root, clean); err != nil {
		if errors.Is(err, errLink) {
			return "", errdefs.FailedPrecondition(errdefs.PathUnsafe, "repo %q: %s is a symbolic link, which a tool does not follow: give the directory itself, inside %s", rel, p, sv.root).With("repo", rel)
		}
		return "", errdefs.FailedPrecondition(errdefs.PathUnsafe, "repo %q: %s: %v", rel, p, err).With("repo", rel)
	}
	dir := filepath.Join(sv.root, clean)
	if err := gitDirInside(dir, rel); err != nil {
		return "", err
	}
	return dir, nil
}

var (
	errLink   = errors.New("a symbolic link")
	errNotDir = errors.New("not a directory")
)

// dirsBelow looks at each component of rel below base without following
// it: each that exists must be a directory (errNotDir), not a link
// (errLink). It reports whether all of rel exists and, on an error, the
// path it stopped at.
func dirsBelow(base, rel string) (exists bool, stop string, err error) {
	p := base
	for _, part := range strings.Split(rel, "/") {
		if part == "." || part == "" {
			continue
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return false, "", nil
		}
		switch {
		case err != nil:
			return false, p, err
		case fi.Mode()&fs.ModeSymlink != 0:
			return false, p, errLink
		case !fi.IsDir():
			return false, p, errNotDir
		}
	}
	return true, "", nil
}

// gitDirInside refuses a repository whose git directory is not inside it
// (GIT_DIR_OUTSIDE_REPO). Git follows a .git that is a link, a .git file
// ("gitdir: PATH", as a worktree or a submodule has) and a commondir file
// in the git directory to wherever they point, and would read and write
// objects and refs there; it writes through a link among the git
// directory's own entries, its objects' directories and its refs and
// logs, and reads the objects objects/info/alternates names. A .git file
// or commondir naming a directory inside the repository, reached through
// directories only, is kept; a link is refused wherever it points, as a
// tool follows none.
func gitDirInside(dir, rel string) error {
	refuse := func(format string, a ...any) error {
		msg := fmt.Sprintf("repo %q: ", rel) + fmt.Sprintf(format, a...) +
			": a tool reads and writes only inside repo; give a repository whose .git is a directory of its own (fetch_main makes one in a new directory)"
		return errdefs.FailedPrecondition(errdefs.GitDirOutsideRepo, "%s", msg).With("repo", rel)
	}
	gitDir := filepath.Join(dir, ".git")
	fi, err := os.Lstat(gitDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A new directory, a bare repository (which has a HEAD), or no
		// repository at all, which the command refuses.
		if _, err := os.Lstat(filepath.Join(dir, "HEAD")); err != nil {
			return nil
		}
		gitDir = dir
	case err != nil:
		return refuse("%v", err)
	case fi.Mode()&fs.ModeSymlink != 0:
		return refuse(".git is a symbolic link")
	case fi.Mode().IsRegular():
		target, err := pointer(gitDir, "gitdir: ")
		if err != nil {
			return refuse("%v", err)
		}
		if gitDir, err = inside(dir, dir, target); err != nil {
			return refuse(".git names the git directory %s, %v", target, err)
		}
	case !fi.IsDir():
		return refuse(".git is neither a directory nor a gitdir: file")
	}
	commonDir := gitDir
	common := filepath.Join(gitDir, "commondir")
	fi, err = os.Lstat(common)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return refuse("%v", err)
	case !fi.Mode().IsRegular():
		return refuse("%s is not a regular file", common)
	default:
		target, err := pointer(common, "")
		if err != nil {
			return refuse("%v", err)
		}
		if commonDir, err = inside(dir, gitDir, target); err != nil {
			return refuse("%s names the common git directory %s, %v", common, target, err)
		}
	}
	for _, d := range []string{gitDir, commonDir} {
		link, err := linkIn(d)
		if err != nil {
			return refuse("%v", err)
		}
		if link != "" {
			return refuse("%s is a symbolic link, which git would follow", link)
		}
	}
	alt := filepath.Join(commonDir, "objects", "info", "alternates")
	if _, err := os.Lstat(alt); err == nil {
		return refuse("%s borrows objects from other repositories", alt)
	}
	return nil
}

// linkIn returns the first symbolic link in git directory gd that git
// would follow to write: one of its entries, one in objects/ (the loose
// objects' directories, pack, info), or one anywhere under refs/ and
// logs/; "" if there is none.
func linkIn(gd string) (string, error) {
	for _, sub := range []string{".", "objects"} {
		ents, err := os.ReadDir(filepath.Join(gd, sub))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		for _, e := range ents {
			if e.Type()&fs.ModeSymlink != 0 {
				return filepath.Join(gd, sub, e.Name()), nil
			}
		}
	}
	for _, sub := range []string{"refs", "logs"} {
		link := ""
		err := filepath.WalkDir(filepath.Join(gd, sub), func(p string, d fs.DirEntry, err error) error {
			switch {
			case errors.Is(err, fs.ErrNotExist):
				return nil
			case err != nil:
				return err
			case d.Type()&fs.ModeSymlink != 0:
				link = p
				return fs.SkipAll
			}
			return nil
		})
		if err != nil || link != "" {
			return link, err
		}
	}
	return "", nil
}

// pointer reads a one-line file that names a directory (.git's "gitdir:
// PATH", commondir's "PATH"), at most maxPointer bytes.
func pointer(file, prefix string) (string, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPointer+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxPointer {
		return "", fmt.Errorf("%s is over %d bytes", file, maxPointer)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	s, ok := strings.CutPrefix(strings.TrimRight(string(line), "\r \t"), prefix)
	if !ok || s == "" {
		return "", fmt.Errorf("%s does not name a directory as git reads it (%q)", file, prefix+"PATH")
	}
	return s, nil
}

// inside resolves target (relative to from, unless absolute) and returns
// it if it is dir or a directory below it, reached through directories
// only; else an error saying why not.
func inside(dir, from, target string) (string, error) {
	if !filepath.IsAbs(target) {
		target = filepath.Join(from, target)
	}
	target = filepath.Clean(target)
	rel, err := filepath.Rel(dir, target)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", errors.New("outside repo")
	}
	exists, stop, err := dirsBelow(dir, rel)
	switch {
	case err != nil:
		return "", fmt.Errorf("reached through %s, %v", stop, err)
	case !exists:
		return "", errors.New("which does not exist")
	}
	return target, nil
}
