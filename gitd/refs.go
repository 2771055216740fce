package gitd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
)

// A ref move is git's lock-file protocol, done here rather than by a `git
// update-ref` process (which cost a push 4-7 ms, a third of the server's
// own work after index-pack): create <ref>.lock with O_EXCL (git's own
// update-ref, pack-refs and gc take the same lock, so a git process and
// gitd never move one ref at once), read the ref's value under it (the
// loose file, else packed-refs) and refuse unless it is the expected old
// one, write the new value, fsync it, rename it over the ref. Nothing of
// git's is left out that this store uses: its repositories keep no reflog
// (bare, core.logAllRefUpdates unset), and a ref that has one, or is
// symbolic, is moved by `git update-ref` as before, which keeps it.
// docs/git-service.md ("Moving a ref") says why this and not an update-ref
// process kept per repository.

// refLockWait bounds how long a move waits for a <ref>.lock another git
// process holds (pack-refs holds one for an unlink; git's own
// core.filesRefLockTimeout is 100 ms). A lock still there after it is
// one a killed process left: the move is refused, and Reconcile removes
// such locks at the next start.
const refLockWait = time.Second

// errRefMoved is a ref move refused because the ref is not at the
// expected old value.
var errRefMoved = errors.New("the ref is not at its expected old value")

// errGitMoves says a ref is one git moves (symbolic, or with a reflog).
var errGitMoves = errors.New("moved by git update-ref")

// moveRef moves ref of r from old ("" or Zero: must not exist) to newID by
// git's lock-file protocol.
func (r repo) moveRef(ctx context.Context, ref gitid.ReferenceName, newID, old gitid.ObjectID) error {
	if old.IsZero() {
		old = ""
	}
	p := filepath.Join(r.Path, filepath.FromSlash(string(ref)))
	if _, err := os.Stat(filepath.Join(r.Path, "logs", filepath.FromSlash(string(ref)))); err == nil {
		return errGitMoves
	}
	// git update-ref refuses a value it cannot find; so does this, leaving
	// anything it does not find where it looks (an alternate of a
	// repository being seeded, say) to git's own lookup.
	if ok, err := r.hasObject(plumbing.NewHash(string(newID))); err != nil || !ok {
		return errGitMoves
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	lock := p + ".lock"
	f, err := createRefLock(ctx, lock)
	if err != nil {
		return fmt.Errorf("update-ref %s: %w", ref, err)
	}
	moved := false
	defer func() {
		if !moved {
			f.Close()
			os.Remove(lock)
		}
	}()
	cur, err := r.refValue(string(ref), p)
	if err != nil {
		return err
	}
	if cur != string(old) {
		return fmt.Errorf("update-ref %s: is at %q but expected %q: %w", ref, cur, old, errRefMoved)
	}
	if _, err := f.WriteString(string(newID) + "\n"); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(lock, p); err != nil {
		return err
	}
	moved = true
	return nil
}

// createRefLock creates lock with O_EXCL, waiting up to refLockWait while
// another process holds it.
func createRefLock(ctx context.Context, lock string) (*os.File, error) {
	deadline := time.Now().Add(refLockWait)
	wait := time.Millisecond
	for {
		f, err := os.OpenFile(lock, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s exists: a git process is moving the ref, or a killed one left the lock (bushostd removes those at start): %w", lock, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// refValue reads ref (loose at path p, else in packed-refs), "" when it
// does not exist.
func (r repo) refValue(ref, p string) (string, error) {
	b, err := os.ReadFile(p)
	if err == nil {
		v := string(bytes.TrimRight(b, "\n"))
		if bytes.HasPrefix(b, []byte("ref:")) {
			return "", errGitMoves
		}
		if !gitid.Valid(v) || v == string(gitid.Zero) {
			return "", fmt.Errorf("ref %s in %s holds %q, not an object id", ref, r.Path, v)
		}
		return v, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	pf, err := os.Open(filepath.Join(r.Path, "packed-refs"))
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
		line := sc.Bytes()
		if len(line) < 42 || line[0] == '#' || line[0] == '^' || line[40] != ' ' {
			continue
		}
		if string(line[41:]) == ref {
			return string(line[:40]), nil
		}
	}
	return "", sc.Err()
}

// gitUpdateRef moves a ref with `git update-ref`: for the refs git must
// move itself (symbolic, or with a reflog).
func (r repo) gitUpdateRef(ctx context.Context, ref gitid.ReferenceName, newID, old gitid.ObjectID) error {
	if old == "" {
		old = gitid.Zero
	}
	return r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "update-ref", Args: []string{string(ref), string(newID), string(old)}})
}
