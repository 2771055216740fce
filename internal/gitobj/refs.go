package gitobj

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/bushost/bushost/internal/gitid"
)

// ErrSymbolic is a ref whose loose file names another ref ("ref: ...").
var ErrSymbolic = errors.New("symbolic ref")

// ReadRef reads the full ref name ref of the git directory gitDir as git
// does: its loose file, else its line of packed-refs; "" when it is in
// neither. A loose ref that is symbolic is ErrSymbolic; a value that is
// not a canonical object id (gitid.Parse), or is the zero id, is an error.
// Hand-written because it must refuse such a value: go-git's dotgit reads
// a ref's content without checking it, and an unreadable one as the zero
// id (plumbing.NewReferenceFromStrings).
func ReadRef(gitDir, ref string) (string, error) {
	b, err := os.ReadFile(filepath.Join(gitDir, filepath.FromSlash(ref)))
	if err == nil {
		if bytes.HasPrefix(b, []byte("ref:")) {
			return "", ErrSymbolic
		}
		return refID(gitDir, ref, string(bytes.TrimRight(b, "\n")))
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	pf, err := os.Open(filepath.Join(gitDir, "packed-refs"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	defer pf.Close()
	sc := bufio.NewScanner(pf)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		// "<id> <name>", "# pack-refs with: ..." or "^<peeled id>".
		line := sc.Bytes()
		if len(line) == 0 || line[0] == '#' || line[0] == '^' {
			continue
		}
		if id, name, ok := bytes.Cut(line, []byte{' '}); ok && string(name) == ref {
			return refID(gitDir, ref, string(id))
		}
	}
	return "", sc.Err()
}

func refID(gitDir, ref, v string) (string, error) {
	if _, err := gitid.ParseObjectID(v); err != nil || gitid.ObjectID(v).IsZero() {
		return "", fmt.Errorf("ref %s in %s holds %q, not an object id", ref, gitDir, v)
	}
	return v, nil
}
