package gitd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/gitobj"
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

// RefMove is a ref move prepared under <ref>.lock: the old value checked
// and the new one written, not yet fsynced nor in place. Commit puts it in
// place; Abort (deferred by every caller) drops it if Commit did not run.
// A push prepares its move before it migrates its pack, so that the lock
// file's fsync joins the pack's batch, and commits it after the record: a
// rename.
type RefMove struct {
	r          repo
	ref        gitid.ReferenceName
	newID, old gitid.ObjectID
	path, lock string
	byGit      bool // moved by git update-ref at Commit
	synced     bool
	done       bool
}

// PrepareRef prepares the move of ref from old ("" or gitid.Zero: the ref
// must not exist yet) to newID: it takes <ref>.lock, refuses (errRefMoved)
// unless the ref is at old, and writes newID into the lock. The caller
// holds the ref's lock (project.lock, or lockTask for a task's ref).
func (r repo) PrepareRef(ctx context.Context, ref gitid.ReferenceName, newID, old gitid.ObjectID) (*RefMove, error) {
	if err := gitid.CheckReferenceName(string(ref)); err != nil {
		return nil, fmt.Errorf("update-ref: %w", err)
	}
	for _, id := range []gitid.ObjectID{newID, old} {
		if id == "" {
			continue
		}
		if _, err := gitid.ParseObjectID(string(id)); err != nil {
			return nil, fmt.Errorf("update-ref %s: %w", ref, err)
		}
	}
	if newID.IsZero() {
		return nil, fmt.Errorf("update-ref %s: gitd moves refs, it never deletes one", ref)
	}
	if old.IsZero() {
		old = ""
	}
	m := &RefMove{r: r, ref: ref, newID: newID, old: old, path: filepath.Join(r.Path, filepath.FromSlash(string(ref)))}
	m.lock = m.path + ".lock"
	if _, err := os.Stat(filepath.Join(r.Path, "logs", filepath.FromSlash(string(ref)))); err == nil {
		m.byGit = true
		return m, nil
	}
	if err := os.MkdirAll(filepath.Dir(m.path), 0o755); err != nil {
		return nil, err
	}
	f, err := createRefLock(ctx, m.lock)
	if err != nil {
		return nil, fmt.Errorf("update-ref %s: %w", ref, err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(m.lock)
		}
	}()
	cur, err := gitobj.ReadRef(r.Path, string(ref))
	if errors.Is(err, gitobj.ErrSymbolic) {
		m.byGit = true
		return m, nil // the deferred func drops the lock
	}
	if err != nil {
		return nil, err
	}
	if cur != string(old) {
		return nil, fmt.Errorf("update-ref %s: is at %q but expected %q: %w", ref, cur, old, errRefMoved)
	}
	if _, err := f.WriteString(string(newID) + "\n"); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// Pending is the file to fsync before Commit ("" when none): a caller
// that fsyncs it in a batch of its own says so with Synced.
func (m *RefMove) Pending() string {
	if m.byGit || m.done {
		return ""
	}
	return m.lock
}

// Synced says the caller fsynced Pending.
func (m *RefMove) Synced() { m.synced = true }

// Commit puts the new value in place: fsync (unless Synced) and rename.
func (m *RefMove) Commit(ctx context.Context) error {
	if m.done {
		return errors.New("update-ref: move already committed or aborted")
	}
	if m.byGit {
		m.done = true
		return m.r.gitUpdateRef(ctx, m.ref, m.newID, m.old)
	}
	// git update-ref refuses a value it cannot find; so does this. One
	// not found where this looks (an alternate of a repository being
	// seeded, say) is left to git's own lookup.
	if ok, err := m.r.hasObject(plumbing.NewHash(string(m.newID))); err != nil || !ok {
		m.Abort()
		return m.r.gitUpdateRef(ctx, m.ref, m.newID, m.old)
	}
	if !m.synced {
		if err := bundle.Sync(m.lock); err != nil {
			return err
		}
	}
	if err := os.Rename(m.lock, m.path); err != nil {
		return err
	}
	m.done = true
	return nil
}

// Abort drops a move Commit did not put in place.
func (m *RefMove) Abort() {
	if m.done {
		return
	}
	m.done = true
	if !m.byGit {
		os.Remove(m.lock)
	}
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

// gitUpdateRef moves a ref with `git update-ref`: for the refs git must
// move itself (symbolic, or with a reflog).
func (r repo) gitUpdateRef(ctx context.Context, ref gitid.ReferenceName, newID, old gitid.ObjectID) error {
	if old == "" {
		old = gitid.Zero
	}
	return r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "update-ref", Args: []string{string(ref), string(newID), string(old)}})
}
