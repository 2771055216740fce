package gitd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
)

// indexPackConfig bounds index-pack's memory by the object limits (docs/
// git-service.md, "Objects and quotas", has the measurements). A whole blob
// over gitcmd's core.bigFileThreshold (16m) is streamed, never held; a
// delta is resolved with its base and its result in memory, once per
// thread, so one thread keeps the peak near twice --max-object-bytes; the
// cache of delta bases adds at most its limit.
var indexPackConfig = []string{"pack.threads=1", "core.deltaBaseCacheLimit=32m"}

// Quotas on what a push may store. Both are checked under the task's lock,
// after index-pack and before Migrate, so a refused push leaves nothing;
// both count bytes on disk (packs, their indexes, loose objects). Pushes to
// other tasks of the project check side by side: a push past the check
// reserves its bytes in the project's figure until it is accounted (or
// refused), so two of them never both fit in room for one.
//
// A task's bytes are its repository's objects (tasks/<task>.git/objects):
// what it pushed that the pool did not hold. A project's bytes are its
// directory's objects (the pool and every task repository), read from disk
// once and then kept up to date in memory by the pushes, the landings and
// the housekeeping runs (store.go); an import or an archive forgets the
// figure, to be read again.

// reserve checks the quotas and reserves the quarantined pack's bytes in
// the project's figure until the push is accounted (Commit) or rolled
// back.
func (tx *writeTx) reserve() error {
	r, o := tx.r, tx.r.st.limits
	n, err := dirBytes(tx.q.Dir)
	if err != nil {
		return err
	}
	used, err := taskBytes(r)
	if err != nil {
		return err
	}
	if used+n > o.MaxTaskBytes {
		return errdefs.ResourceExhausted(errdefs.TaskQuota,
			"task %s holds %d bytes in its repository; this push's %d bytes would take it over the limit of %d bytes (bushostd --max-task-bytes)",
			r.Task, used, n, o.MaxTaskBytes).With("limit", o.MaxTaskBytes).With("used", used).With("size", n)
	}
	proj, ok, err := r.state().reserve(n, o.MaxProjectBytes)
	if err != nil {
		return err
	}
	if !ok {
		// The project's usage is every task's: the pusher learns only
		// that its push does not fit, and the host's log has the numbers.
		r.st.log.Warn("push refused: project quota", "business", r.Business, "project", r.Project, "task", r.Task,
			"used", proj, "size", n, "limit", o.MaxProjectBytes)
		return errdefs.ResourceExhausted(errdefs.ProjectQuota,
			"this push's %d bytes would take project %s/%s over its limit of %d bytes (bushostd --max-project-bytes)",
			n, r.Business, r.Project, o.MaxProjectBytes).With("limit", o.MaxProjectBytes).With("size", n)
	}
	tx.reserved = n
	return nil
}

// addedBytes is what q's Migrate added to the repository: only the files
// it added (one already there is shared).
func addedBytes(q *bundle.Quarantine) int64 {
	var added int64
	for _, f := range q.Added() {
		if fi, err := os.Stat(f); err == nil {
			added += fi.Size()
		}
	}
	return added
}

// dirBytes sums the sizes of the regular files under dir, skipping
// quarantines (pushes in flight) and git's temporary files.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if p != dir && strings.HasPrefix(d.Name(), bundle.QuarantinePrefix) {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || strings.HasPrefix(d.Name(), "tmp_") {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		n += fi.Size()
		return nil
	})
	return n, err
}

// taskBytes is the size of a task repository's objects (0 before its
// first push).
func taskBytes(r repo) (int64, error) {
	if !r.exists() {
		return 0, nil
	}
	return dirBytes(r.objects())
}
