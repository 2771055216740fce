package gitd

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
)

// DefaultCommitter signs the merge commits of `task land --merge` unless
// `bushostd serve --committer` says otherwise.
const DefaultCommitter = "bushost <bushost@localhost>"

// maxConflictPaths bounds the paths a MERGE_CONFLICT names.
const maxConflictPaths = 100

// maxMergeTreeOutput bounds what merge-tree's answer is read of: its tree
// id, then the conflicting paths, of which a refusal names the first 100.
const maxMergeTreeOutput = 1 << 20

// ParseCommitter splits "NAME <EMAIL>" for git's environment.
func ParseCommitter(s string) (name, email string, err error) {
	name, rest, ok := strings.Cut(s, "<")
	name = strings.TrimSpace(name)
	email, tail, ok2 := strings.Cut(rest, ">")
	if !ok || !ok2 || name == "" || email == "" || strings.TrimSpace(tail) != "" ||
		strings.ContainsAny(s, "\n\r\x00") || strings.ContainsAny(email, "< ") || strings.Contains(name, ">") {
		return "", "", fmt.Errorf("committer %q is not NAME <EMAIL>", s)
	}
	return name, email, nil
}

// LandResult is a landing: the approved commit, main before and after,
// the merge commit made ("" for a fast-forward) and the task.landed event.
type LandResult struct {
	Commit, MainOld, MainNew, Merge string
	Seq                             int64
}

// Land puts the task's approved latest push on main and closes the task.
//
// Order, as a push's: under the project's lock, the broker's gate (from
// the log); the approved commit's objects fetched from the task's
// repository into a quarantine of the pool (the pool must hold what main
// names; the task repository may be archived later); the new main (the approved commit when main fast-forwards to
// it, or a merge made with merge-tree --write-tree into a quarantine);
// the broker records task.landed and task.closed, checking the gate again
// in the same transaction; only then main moves, by one update-ref against
// its old value. A crash between the record and the ref move is repaired by
// Reconcile, which moves main to the last landing's main while main is
// still that landing's old main.
func (s *Service) Land(ctx context.Context, g authz.Grant, peer authz.Peer, business, project, task string, merge bool) (LandResult, error) {
	l, ok := s.o.Authority.(authz.Lander)
	if !ok {
		return LandResult{}, fmt.Errorf("this bus host's broker cannot land work")
	}
	if err := names.CheckScope(names.Scope{Business: business, Project: project, Task: task}); err != nil || task == "" {
		if err == nil {
			err = fmt.Errorf("no task name")
		}
		return LandResult{}, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err)
	}
	t, err := s.task(business, project, task)
	if err != nil {
		return LandResult{}, err
	}
	r := t.pool()
	if !r.exists() {
		return LandResult{}, projectNotFound(business, project)
	}
	unlock, err := s.lock(ctx, r)
	if err != nil {
		return LandResult{}, err
	}
	defer unlock()
	approved, err := l.LandApproved(ctx, g, business, project, task)
	if err != nil {
		return LandResult{}, err
	}
	gg, err := s.open(r)
	if err != nil {
		return LandResult{}, err
	}
	old, err := readRef(gg, MainRef)
	if err != nil {
		return LandResult{}, err
	}
	if old == "" {
		return LandResult{}, errdefs.FailedPrecondition(errdefs.MainNotFound, "project %s/%s has no main", business, project)
	}
	q, err := bundle.NewQuarantine(r.objects())
	if err != nil {
		return LandResult{}, err
	}
	defer q.Remove()
	if err := s.intoPool(ctx, t, q, approved); err != nil {
		return LandResult{}, err
	}
	res := LandResult{Commit: approved, MainOld: old}
	switch {
	case old == approved:
		res.MainNew = old
	case s.ancestor(ctx, r, q, approved, old):
		// main already holds the work (a sync brought it): nothing moves.
		res.MainNew = old
	case s.ancestor(ctx, r, q, old, approved):
		res.MainNew = approved
	case !merge:
		return LandResult{}, errdefs.Aborted(errdefs.MainMoved, "main moved to %s since %s was made: land with --merge, or rebase onto main, push and get a new approval", old, approved).
			With("main", old).With("commit", approved)
	default:
		res.Merge, err = s.mergeCommit(ctx, r, q, old, approved, task)
		if err != nil {
			return LandResult{}, err
		}
		res.MainNew = res.Merge
	}
	if res.MainNew != old {
		if err := s.checkLanding(ctx, r, q, res.MainNew, res.Merge != ""); err != nil {
			return LandResult{}, err
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), criticalTimeout)
	defer cancel()
	if err := q.Migrate(); err != nil {
		s.markUndone(r)
		return LandResult{}, err
	}
	res.Seq, err = l.RecordLanding(cctx, g, authz.Landing{Business: business, Project: project, Task: task,
		Approved: approved, Old: old, New: res.MainNew, Merge: res.Merge}, peer)
	if err != nil {
		if rerr := s.undo(r, q); rerr != nil {
			s.log.Error("remove refused merge", "repo", r.Path, "err", rerr)
		}
		return LandResult{}, err
	}
	// The project's cached size grows by what the landing added (reading
	// the whole project again would make the next push's quota check cost
	// as much as the project has tasks).
	s.account(r, 0, q)
	if res.MainNew == old {
		return res, nil
	}
	crashpoint("land:after-record")
	if err := r.UpdateRef(cctx, MainRef, gitid.ObjectID(res.MainNew), gitid.ObjectID(old)); err != nil {
		s.log.Error("landing recorded but main not moved; Reconcile repairs it at next start", "repo", r.Path, "commit", res.MainNew, "err", err)
		return LandResult{}, fmt.Errorf("landing recorded, but moving main failed (repaired at the next start of bushostd): %w", err)
	}
	s.hk.Notify(r)
	return res, nil
}

// ancestor says whether a is an ancestor of b, reading through q (false
// when git cannot say).
func (s *Service) ancestor(ctx context.Context, r repo, q *bundle.Quarantine, a, b string) bool {
	return q.Run(ctx, s.git, gitcmd.Cmd{GitDir: r.Path, Sub: "merge-base", Flags: []string{"--is-ancestor"}, Args: []string{a, b}}) == nil
}

// intoPool fetches the objects of the task's work (refs/work/<task>, of
// which approved is the tip or an ancestor) that the pool lacks into q, a
// quarantine of the pool: a landing's objects are the pool's before main
// names them. git's local transport runs the task side without q's
// environment, so it reads the task's repository and the pool as usual.
func (s *Service) intoPool(ctx context.Context, t repo, q *bundle.Quarantine, approved string) error {
	if !t.exists() {
		return fmt.Errorf("task %s has no repository", t.Task)
	}
	ref, err := names.WorkRef(t.Task)
	if err != nil {
		return err
	}
	r := t.pool()
	if err := q.Run(ctx, s.git, gitcmd.Cmd{GitDir: r.Path, Sub: "fetch",
		Flags: []string{"--quiet", "--no-tags", "--no-write-fetch-head"}, Args: []string{t.Path, ref}}); err != nil {
		return fmt.Errorf("copy the work of %s into the pool: %w", t.Task, err)
	}
	if err := q.Run(ctx, s.git, gitcmd.Cmd{GitDir: r.Path, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{approved + "^{commit}"}}); err != nil {
		return fmt.Errorf("the approved commit %s is not in the work of %s: %w", approved, t.Task, err)
	}
	return nil
}

// mergeCommit merges approved into main (old) with merge-tree
// --write-tree, writing the tree and the commit into q; conflicting paths
// refuse with MERGE_CONFLICT naming them.
func (s *Service) mergeCommit(ctx context.Context, r repo, q *bundle.Quarantine, old, approved, task string) (string, error) {
	out, err := s.git.Output(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "merge-tree",
		Flags: []string{"--write-tree", "--name-only", "--no-messages", "-z"}, Args: []string{old, approved}, Env: q.Env()}, maxMergeTreeOutput)
	fields := bytes.Split(out, []byte{0})
	// A clean merge prints its tree's id alone: output past the cap is a
	// list of conflicts, cut short (and its last path with it).
	if errdefs.ReasonOf(err) == errdefs.GitOutputTooLarge && len(fields) > 1 {
		fields = fields[:len(fields)-1]
	} else if err != nil && gitcmd.ExitCode(err) != 1 {
		return "", fmt.Errorf("merge main %s with %s: %w", old, approved, err)
	}
	if len(fields) == 0 || !plumbing.IsHash(string(fields[0])) {
		return "", fmt.Errorf("merge main %s with %s: merge-tree printed no tree", old, approved)
	}
	tree := string(fields[0])
	if err != nil {
		var paths []string
		for _, f := range fields[1:] {
			if len(f) > 0 && len(paths) < maxConflictPaths {
				paths = append(paths, string(f))
			}
		}
		return "", errdefs.Aborted(errdefs.MergeConflict, "merging %s into main (%s) conflicts in: %s; rebase onto main, push and get a new approval",
			approved, old, strings.Join(paths, ", ")).
			With("paths", strings.Join(paths, "\n")).With("main", old).With("commit", approved)
	}
	committer := s.o.Committer
	if committer == "" {
		committer = DefaultCommitter
	}
	name, email, err := ParseCommitter(committer)
	if err != nil {
		return "", err
	}
	env := append(q.Env(), "GIT_AUTHOR_NAME="+name, "GIT_AUTHOR_EMAIL="+email, "GIT_COMMITTER_NAME="+name, "GIT_COMMITTER_EMAIL="+email)
	msg := fmt.Sprintf("Land task %s\n\nMerge approved commit %s into main.\n", task, approved)
	return s.git.Line(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "commit-tree",
		Flags: []string{"-p" + old, "-p" + approved, "-m" + msg}, Args: []string{tree}, Env: env}, gitcmd.MaxLine)
}

// reconcileMain moves main to the last landing's new main when main is
// still that landing's old main: the landing was recorded, and bushostd
// stopped before main moved. The caller holds the repository's lock.
func (s *Service) reconcileMain(ctx context.Context, r repo) error {
	l, ok := s.o.Authority.(authz.Lander)
	if !ok {
		return nil
	}
	ls, err := l.Landings(ctx, r.Business, r.Project)
	if err != nil || len(ls) == 0 {
		return err
	}
	last := ls[len(ls)-1]
	gg, err := s.open(r)
	if err != nil {
		return err
	}
	cur, err := readRef(gg, MainRef)
	if err != nil {
		return err
	}
	if cur != last.Old || last.New == last.Old {
		return nil
	}
	if gg.HasEncodedObject(plumbing.NewHash(last.New)) != nil {
		return fmt.Errorf("the log's last landing (task %s) put main at %s, which is not in the repository", last.Task, last.New)
	}
	if err := r.UpdateRef(ctx, MainRef, gitid.ObjectID(last.New), gitid.ObjectID(last.Old)); err != nil {
		return err
	}
	s.log.Info("reconciled main with the last landing", "repo", r.Path, "task", last.Task, "from", last.Old, "to", last.New)
	return nil
}
