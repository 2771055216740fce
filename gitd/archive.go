package gitd

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// ArchiveResult is what ArchiveTask did.
type ArchiveResult struct {
	Removed bool  // a repository was removed
	Bytes   int64 // the bytes of objects it held
}

// ArchiveTask removes a closed (or landed) task's repository,
// tasks/<task>.git, under the project's lock; the task's events stay in
// the log, and what landed is in the pool (Land copies it there first). An
// open task is refused with TASK_NOT_CLOSED: its worker may still push and
// its reviewer fetch. Archiving twice is no error (Removed is false).
func (s *Service) ArchiveTask(ctx context.Context, t names.Task) (ArchiveResult, error) {
	business, project, task := t.Business(), t.Project().Name(), t.Name()
	r, err := s.store.task(t)
	if err != nil {
		return ArchiveResult{}, err
	}
	if !r.pool().exists() {
		return ArchiveResult{}, projectNotFound(t.Project())
	}
	// No housekeeping run may write into the repository as it goes.
	release, err := r.state().hold(ctx, r.Task)
	if err != nil {
		return ArchiveResult{}, err
	}
	defer release()
	unlock, err := r.state().lock(ctx)
	if err != nil {
		return ArchiveResult{}, err
	}
	defer unlock()
	g := authz.Grant{Business: business, Project: project, Task: task}
	err = s.o.Authority.TaskOpen(ctx, g)
	if err == nil {
		return ArchiveResult{}, errdefs.FailedPrecondition(errdefs.TaskNotClosed,
			"task %s/%s/%s is open: its repository is kept while it may take pushes and reviews; close or land it first", business, project, task).
			With("task", business+"/"+project+"/"+task)
	}
	if e, ok := errdefs.As(err); !ok || e.Reason != errdefs.TaskClosed && e.Reason != errdefs.TaskLanded {
		return ArchiveResult{}, err
	}
	if !r.exists() {
		return ArchiveResult{}, nil
	}
	n, err := taskBytes(r)
	if err != nil {
		return ArchiveResult{}, err
	}
	// Renamed aside first, so that a crash leaves either the repository or
	// a seeding directory cleanStale removes at the next start.
	aside, err := os.MkdirTemp(filepath.Dir(r.Path), seedPrefix+"archive-")
	if err != nil {
		return ArchiveResult{}, err
	}
	if err := os.Rename(r.Path, filepath.Join(aside, "repo.git")); err != nil {
		os.Remove(aside)
		return ArchiveResult{}, err
	}
	if err := bundle.Sync(filepath.Dir(r.Path)); err != nil {
		return ArchiveResult{}, err
	}
	if err := os.RemoveAll(aside); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Error("archive: remove the renamed repository (cleaned at the next start)", "dir", aside, "err", err)
	}
	r.state().forget()
	s.log.Info("archived a task's repository; its events stay in the log", "repo", r.Path, "task", task, "bytes", n)
	return ArchiveResult{Removed: true, Bytes: n}, nil
}
