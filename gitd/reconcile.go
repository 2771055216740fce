package gitd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitid"
)

// Reconcile makes every repository agree with the broker's log: for each
// task with a recorded push, refs/work/<task> is set to that push's commit
// (a crash between the record and the ref move leaves the ref behind). It
// also removes git lock files a killed process left, which would block the
// next ref move, and cancels the exports a killed daemon left cut before
// their file was complete (settleExports). Call it at start, before the
// service takes calls.
//
// One repository never takes the host down: a recorded push whose commit
// is not in the repository marks its task (Authority.MarkNeedsRepair; the
// host resolves it with 'bushost task repair'), and a repository that
// cannot be reconciled is reported in the log; the rest are served. Only a
// store that cannot be listed is an error.
func (s *Service) Reconcile(ctx context.Context) error {
	s.settleExports(ctx)
	rs, err := s.store.repos()
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	for _, r := range rs {
		// A project placed on another host sharing the store is that
		// host's to reconcile; this one serves nothing of it.
		if err := s.o.Authority.CheckPlacement(ctx, r.Business, r.Project); errdefs.ReasonOf(err) == errdefs.ProjectOnOtherHost {
			s.log.Info("reconcile: skipped, the project is placed on another host", "business", r.Business, "project", r.Project, "err", err)
			continue
		}
		if err := s.reconcile(ctx, r); err != nil {
			s.log.Error("reconcile: this repository disagrees with the log; the others are served", "repo", r.Path, "business", r.Business, "project", r.Project, "err", err)
		}
	}
	return nil
}

func (s *Service) reconcile(ctx context.Context, r repo) error {
	last, err := s.o.Authority.LastPushes(ctx, r.Business, r.Project)
	if err != nil {
		return err
	}
	unlock, err := r.state().lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if err := removeStaleLocks(r.Path); err != nil {
		return err
	}
	ts, err := r.tasks()
	if err != nil {
		return err
	}
	for _, t := range ts {
		if err := removeStaleLocks(t.Path); err != nil {
			return err
		}
	}
	var errs []error
	if err := s.reconcileMain(ctx, r); err != nil {
		errs = append(errs, fmt.Errorf("main: %w", err))
	}
	for task, commit := range last {
		// The log's task names were checked when they entered it; they
		// are parsed again here as any name the store is built from.
		tn, err := r.proj.Task(task)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ref := tn.WorkRef()
		t, err := s.store.task(tn)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		gg := t.open()
		cur, err := t.readRef(ref)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if cur == commit {
			continue
		}
		if !t.exists() && s.o.Authority.TaskOpen(ctx, authz.Grant{Business: r.Business, Project: r.Project, Task: task}) != nil {
			continue // a closed task whose repository the host archived
		}
		if !t.exists() || gg.HasEncodedObject(plumbing.NewHash(commit)) != nil && !t.gitHasCommit(ctx, commit) {
			why := fmt.Sprintf("the log's latest push %s is not in the repository (%s is at %q)", commit, ref, cur)
			if err := s.o.Authority.MarkNeedsRepair(ctx, r.Business, r.Project, task, why, commit); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s, and marking the task failed: %w", ref, why, err))
				continue
			}
			s.log.Error("task needs repair: calls on it are refused until the host runs 'bushost task repair'", "repo", t.Path, "task", task, "why", why)
			continue
		}
		if err := t.UpdateRef(ctx, gitid.ReferenceName(ref), gitid.ObjectID(commit), gitid.ObjectID(cur)); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("reconciled ref with the last recorded push", "repo", t.Path, "ref", ref, "from", cur, "to", commit)
	}
	return errors.Join(errs...)
}

// removeStaleLocks deletes the *.lock files git leaves when killed while
// moving a ref (refs/**, packed-refs, HEAD, config). The caller holds the
// repository's lock, so no ref move of ours is in flight.
func removeStaleLocks(gitDir string) error {
	for _, name := range []string{"packed-refs.lock", "HEAD.lock", "config.lock"} {
		if err := os.Remove(filepath.Join(gitDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return filepath.WalkDir(filepath.Join(gitDir, "refs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".lock") {
			return os.Remove(p)
		}
		return nil
	})
}
