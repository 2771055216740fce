package gitd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
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

// Quotas on what a push may store. Both are checked under the
// repository's lock, after index-pack and before Migrate, so a refused push
// leaves nothing; both count bytes on disk (packs and their indexes).
//
// A task's bytes are the total of its accepted packs, kept in a ledger file
// per task under <repo>/bushost-quota/ (a task has no repository of its own
// yet). It is written after the broker recorded the push: a crash between
// the two undercounts that one push.
//
// A project's bytes are its repository's objects, read from disk once and
// then kept up to date in memory by the pushes; a sync of main forgets
// the figure, to be read again.

// quotaDir holds the task ledgers inside a repository.
const quotaDir = "bushost-quota"

// checkQuotas returns the bytes the quarantine would add, or the refusal.
func (s *Service) checkQuotas(r repo, task string, q *bundle.Quarantine) (int64, error) {
	n, err := dirBytes(q.Dir)
	if err != nil {
		return 0, err
	}
	used, err := taskBytes(r, task)
	if err != nil {
		return 0, err
	}
	if used+n > s.o.MaxTaskBytes {
		return 0, errdefs.ResourceExhausted(errdefs.TaskQuota,
			"task %s holds %d bytes of accepted packs; this push's %d bytes would take it over the limit of %d bytes (bushostd --max-task-bytes)",
			task, used, n, s.o.MaxTaskBytes).With("limit", s.o.MaxTaskBytes).With("used", used).With("size", n)
	}
	proj, err := s.projectBytes(r)
	if err != nil {
		return 0, err
	}
	if proj+n > s.o.MaxProjectBytes {
		return 0, errdefs.ResourceExhausted(errdefs.ProjectQuota,
			"project %s/%s holds %d bytes of objects; this push's %d bytes would take it over the limit of %d bytes (bushostd --max-project-bytes)",
			r.Business, r.Project, proj, n, s.o.MaxProjectBytes).With("limit", s.o.MaxProjectBytes).With("used", proj).With("size", n)
	}
	return n, nil
}

// account adds an accepted push's bytes to its task and project. The
// project counts only the files Migrate added (one already there is
// shared).
func (s *Service) account(r repo, task string, n int64, q *bundle.Quarantine) {
	used, err := taskBytes(r, task)
	if err == nil {
		err = setTaskBytes(r, task, used+n)
	}
	if err != nil {
		s.log.Error("task quota ledger not updated", "repo", r.Path, "task", task, "err", err)
	}
	var added int64
	for _, f := range q.Added() {
		if fi, err := os.Stat(f); err == nil {
			added += fi.Size()
		}
	}
	s.mu.Lock()
	if v, ok := s.usage[r.Path]; ok {
		s.usage[r.Path] = v + added
	}
	s.mu.Unlock()
}

// forgetUsage drops a repository's cached size after a write that did not
// go through a push (a sync of main).
func (s *Service) forgetUsage(r repo) {
	s.mu.Lock()
	delete(s.usage, r.Path)
	s.mu.Unlock()
}

func (s *Service) projectBytes(r repo) (int64, error) {
	s.mu.Lock()
	v, ok := s.usage[r.Path]
	s.mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := dirBytes(r.objects())
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	s.usage[r.Path] = v
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

func taskBytes(r repo, task string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(r.Path, quotaDir, task))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("task quota ledger %s: %w", filepath.Join(r.Path, quotaDir, task), err)
	}
	return n, nil
}

// setTaskBytes replaces a task's ledger whole (write, then rename).
func setTaskBytes(r repo, task string, n int64) error {
	dir := filepath.Join(r.Path, quotaDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return err
	}
	_, err = tmp.WriteString(strconv.FormatInt(n, 10) + "\n")
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, task))
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
