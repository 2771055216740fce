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
// the housekeeping runs; a sync of main or an archive forgets the figure,
// to be read again.

// checkQuotas returns the bytes the quarantine would add, or the refusal.
func (s *Service) checkQuotas(r repo, q *bundle.Quarantine) (int64, error) {
	n, err := dirBytes(q.Dir)
	if err != nil {
		return 0, err
	}
	used, err := taskBytes(r)
	if err != nil {
		return 0, err
	}
	if used+n > s.o.MaxTaskBytes {
		return 0, errdefs.ResourceExhausted(errdefs.TaskQuota,
			"task %s holds %d bytes in its repository; this push's %d bytes would take it over the limit of %d bytes (bushostd --max-task-bytes)",
			r.Task, used, n, s.o.MaxTaskBytes).With("limit", s.o.MaxTaskBytes).With("used", used).With("size", n)
	}
	proj, err := s.projectBytes(r)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	proj += s.reserved[r.Dir]
	if proj+n > s.o.MaxProjectBytes {
		// The project's usage is every task's: the pusher learns only
		// that its push does not fit, and the host's log has the numbers.
		s.log.Warn("push refused: project quota", "business", r.Business, "project", r.Project, "task", r.Task,
			"used", proj, "size", n, "limit", s.o.MaxProjectBytes)
		return 0, errdefs.ResourceExhausted(errdefs.ProjectQuota,
			"this push's %d bytes would take project %s/%s over its limit of %d bytes (bushostd --max-project-bytes)",
			n, r.Business, r.Project, s.o.MaxProjectBytes).With("limit", s.o.MaxProjectBytes).With("size", n)
	}
	s.reserved[r.Dir] += n
	return n, nil
}

// release drops the reservation checkQuotas made for n bytes, once the
// push is accounted or refused.
func (s *Service) release(r repo, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserved[r.Dir] -= n; s.reserved[r.Dir] <= 0 {
		delete(s.reserved, r.Dir)
	}
}

// account adds an accepted push's bytes to its project's figure: only the
// files Migrate added (one already there is shared).
func (s *Service) account(r repo, n int64, q *bundle.Quarantine) {
	var added int64
	for _, f := range q.Added() {
		if fi, err := os.Stat(f); err == nil {
			added += fi.Size()
		}
	}
	s.mu.Lock()
	if v, ok := s.usage[r.Dir]; ok {
		s.usage[r.Dir] = v + added
	}
	s.mu.Unlock()
}

// forgetUsage drops a repository's cached size after a write that did not
// go through a push (an import).
func (s *Service) forgetUsage(r repo) {
	s.mu.Lock()
	delete(s.usage, r.Dir)
	s.mu.Unlock()
}

// adjustUsage adds delta (a housekeeping run's change to a repository's
// objects) to the project's cached size, if it has one.
func (s *Service) adjustUsage(r repo, delta int64) {
	s.mu.Lock()
	if v, ok := s.usage[r.Dir]; ok {
		s.usage[r.Dir] = max(v+delta, 0)
	}
	s.mu.Unlock()
}

func (s *Service) projectBytes(r repo) (int64, error) {
	s.mu.Lock()
	v, ok := s.usage[r.Dir]
	s.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := dirBytes(r.Dir)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.usage[r.Dir] = v
	s.mu.Unlock()
	return v, nil
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
