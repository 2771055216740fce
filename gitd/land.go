package gitd

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

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

// LandOptions are a landing's choices: Merge makes a merge commit when
// main moved since the approved commit (else MAIN_MOVED); Force lands a
// push whose earlier landing was refused (LAND_REFUSED otherwise).
type LandOptions struct {
	Merge, Force bool
}

// Defaults of a landing's merge (Options.MergeTimeout, MergeRenameLimit).
const (
	DefaultMergeTimeout = time.Minute
	// DefaultMergeRenameLimit is diff.renameLimit's default: past it, git
	// detects only exact renames, which costs no more than the trees.
	DefaultMergeRenameLimit = 1000
)

// Land puts the task's approved latest push on main and closes the task.
//
// Order: the broker's gate (from the log); main read; the approved
// commit's objects fetched from the task's repository into a quarantine
// of the pool (the pool must hold what main names; the task repository
// may be archived later); the new main (the approved commit when main
// fast-forwards to it, or a merge: mergeCommit). All of that without the
// project's lock, so that a long merge delays no push; the merge has a
// deadline of its own (Options.MergeTimeout), and a merge refused or cut
// by it is recorded (task.land_refused), so that the same push is not
// tried again without a new push or Force. Then, under the project's
// lock: main must still be what the merge was made on (MAIN_MOVED, land
// again, otherwise); the objects leave quarantine; the broker records
// task.landed and task.closed, checking the gate again in the same
// transaction; only then main moves, by one update-ref against its old
// value. A crash between the record and the ref move is repaired by
// Reconcile, which moves main to the last landing's main while main is
// still that landing's old main.
func (s *Service) Land(ctx context.Context, g authz.Grant, peer authz.Peer, scope names.Task, o LandOptions) (LandResult, error) {
	l, ok := s.o.Authority.(authz.Lander)
	if !ok {
		return LandResult{}, fmt.Errorf("this bus host's broker cannot land work")
	}
	business, project, task := scope.Business(), scope.Project().Name(), scope.Name()
	t, err := s.store.task(scope)
	if err != nil {
		return LandResult{}, err
	}
	r := t.pool()
	if !r.exists() {
		return LandResult{}, projectNotFound(scope.Project())
	}
	approved, err := l.LandApproved(ctx, g, business, project, task, o.Force)
	if err != nil {
		return LandResult{}, err
	}
	old, err := r.readRef(MainRef)
	if err != nil {
		return LandResult{}, err
	}
	if old == "" {
		return LandResult{}, errdefs.FailedPrecondition(errdefs.MainNotFound, "project %s/%s has no main", business, project)
	}
	tx, err := r.beginLand()
	if err != nil {
		return LandResult{}, err
	}
	defer tx.Rollback()
	q := tx.q
	if err := t.intoPool(ctx, q, approved); err != nil {
		return LandResult{}, err
	}
	res := LandResult{Commit: approved, MainOld: old}
	ancestor := func(a, b string) bool { ok, err := r.isAncestor(ctx, q, a, b); return ok && err == nil }
	switch {
	case old == approved:
		res.MainNew = old
	case ancestor(approved, old):
		// main already holds the work (a sync brought it): nothing moves.
		res.MainNew = old
	case ancestor(old, approved):
		res.MainNew = approved
	case !o.Merge:
		return LandResult{}, errdefs.Aborted(errdefs.MainMoved, "main moved to %s since %s was made: land with --merge, or rebase onto main, push and get a new approval", old, approved).
			With("main", old).With("commit", approved)
	default:
		// Every check of a merge's result is here, the one place a
		// landing makes new trees.
		res.Merge, err = s.mergeCommit(ctx, r, q, old, approved, scope)
		if err == nil {
			err = r.checkLanding(ctx, q, res.Merge, true)
		}
		if err != nil {
			// A refusal of the merge (a conflict, the deadline, a
			// .gitmodules the merge made) is recorded; a failure of
			// git or of the call is not: the same landing may succeed.
			if _, refused := errdefs.As(err); refused && ctx.Err() == nil {
				s.recordRefusal(ctx, l, g, peer, authz.Landing{Business: business, Project: project, Task: task, Approved: approved, Old: old}, err)
			}
			return LandResult{}, err
		}
		res.MainNew = res.Merge
	}
	// A fast-forward's new main is checked as a push's tree is (a merge
	// was, above): outside the lock, before anything is recorded.
	if res.MainNew != old && res.Merge == "" {
		if err := r.checkLanding(ctx, q, res.MainNew, false); err != nil {
			return LandResult{}, err
		}
	}
	if err := tx.lockProject(ctx); err != nil {
		return LandResult{}, err
	}
	// Only the lock's holder moves main: unmoved now, it stays so until
	// the update-ref below. Read afresh, not through a handle opened
	// before another landing may have moved it.
	if cur, err := r.readRef(MainRef); err != nil {
		return LandResult{}, err
	} else if cur != old {
		return LandResult{}, errdefs.Aborted(errdefs.MainMoved, "main moved to %s while the landing of %s was made on %s: land again", cur, approved, old).
			With("main", cur).With("commit", approved).Retry(time.Second)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), criticalTimeout)
	defer cancel()
	if err := tx.moveIn(); err != nil {
		return LandResult{}, err
	}
	res.Seq, err = l.RecordLanding(cctx, g, authz.Landing{Business: business, Project: project, Task: task,
		Approved: approved, Old: old, New: res.MainNew, Merge: res.Merge}, peer)
	if err != nil {
		return LandResult{}, err
	}
	// The project's cached size grows by what the landing added (reading
	// the whole project again would make the next push's quota check cost
	// as much as the project has tasks). Main moves by UpdateRef after
	// the commit, not by a prepared move: nothing is left to undo.
	if err := tx.Commit(cctx); err != nil {
		return LandResult{}, err
	}
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

// recordRefusal has the broker record that landing l's merge was refused
// (cause), so that LandApproved refuses the same push until a new one or
// Force. It is kept apart from the call's own refusal: a record that
// fails is logged, and the caller still hears why its merge failed.
func (s *Service) recordRefusal(ctx context.Context, l authz.Lander, g authz.Grant, peer authz.Peer, ld authz.Landing, cause error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), criticalTimeout)
	defer cancel()
	if _, err := l.RecordLandRefusal(cctx, g, ld, string(errdefs.ReasonOf(cause)), peer); err != nil {
		s.log.Warn("a landing's merge was refused, and recording the refusal failed", "business", ld.Business, "project", ld.Project, "task", ld.Task, "commit", ld.Approved, "cause", cause, "err", err)
	}
}

// intoPool fetches the objects of the task's work (refs/work/<task>, of
// which approved is the tip or an ancestor) that the pool lacks into q, a
// quarantine of the pool: a landing's objects are the pool's before main
// names them. git's local transport runs the task side without q's
// environment, so it reads the task's repository and the pool as usual.
func (t repo) intoPool(ctx context.Context, q *bundle.Quarantine, approved string) error {
	if !t.exists() {
		return fmt.Errorf("task %s has no repository", t.Task)
	}
	ref := t.task.WorkRef()
	r := t.pool()
	if err := q.Run(ctx, t.git, gitcmd.Cmd{GitDir: r.Path, Sub: "fetch",
		Flags: []string{"--quiet", "--no-tags", "--no-write-fetch-head"}, Args: []string{t.Path, ref}}); err != nil {
		return fmt.Errorf("copy the work of %s into the pool: %w", t.Task, err)
	}
	if err := q.Run(ctx, t.git, gitcmd.Cmd{GitDir: r.Path, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{approved + "^{commit}"}}); err != nil {
		return fmt.Errorf("the approved commit %s is not in the work of %s: %w", approved, t.Task, err)
	}
	return nil
}

// mergeCommit merges approved into main (old) with merge-tree
// --write-tree, writing the tree and the commit into q; conflicting paths
// refuse with MERGE_CONFLICT naming them.
//
// The merge has a deadline of its own (Options.MergeTimeout: git's rename
// detection over thousands of renamed and edited files runs for minutes)
// and detects inexact renames only up to Options.MergeRenameLimit files;
// past the deadline git is killed and the landing refused MERGE_TIMEOUT.
func (s *Service) mergeCommit(ctx context.Context, r repo, q *bundle.Quarantine, old, approved string, t names.Task) (string, error) {
	timeout, limit := s.o.MergeTimeout, s.o.MergeRenameLimit
	if timeout <= 0 {
		timeout = DefaultMergeTimeout
	}
	if limit <= 0 {
		limit = DefaultMergeRenameLimit
	}
	mctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := s.git.Output(mctx, gitcmd.Cmd{GitDir: r.Path, Sub: "merge-tree",
		Config: []string{"merge.renameLimit=" + strconv.Itoa(limit)},
		Flags:  []string{"--write-tree", "--name-only", "--no-messages", "-z"}, Args: []string{old, approved}, Env: q.Env()}, maxMergeTreeOutput)
	if mctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		return "", errdefs.ResourceExhausted(errdefs.MergeTimeout,
			"merging %s into main (%s) took longer than %s (bushostd --merge-timeout), and was stopped: rebase onto main, push and get a new approval, or land again with --force",
			approved, old, timeout).With("main", old).With("commit", approved).With("limit", timeout)
	}
	fields := bytes.Split(out, []byte{0})
	// A clean merge prints its tree's id alone: output past the cap is a
	// list of conflicts, cut short (and its last path with it).
	if errdefs.ReasonOf(err) == errdefs.GitOutputTooLarge && len(fields) > 1 {
		fields = fields[:len(fields)-1]
	} else if err != nil && gitcmd.ExitCode(err) != 1 {
		return "", fmt.Errorf("merge main %s with %s: %w", old, approved, err)
	}
	if len(fields) == 0 || !gitid.Valid(string(fields[0])) {
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
	msg := fmt.Sprintf("Land task %s\n\nMerge approved commit %s into main.\n", t.Name(), approved)
	return s.git.Line(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "commit-tree",
		Flags: []string{"-p" + old, "-p" + approved, "-m" + msg}, Args: []string{tree}, Env: env}, gitcmd.MaxLine)
}

// lastLanding is the log's last landing of the project; nil when there
// is none, the broker keeps no landings, or (with err) reading them failed.
func (s *Service) lastLanding(ctx context.Context, p names.Project) (*authz.Landing, error) {
	l, ok := s.o.Authority.(authz.Lander)
	if !ok {
		return nil, nil
	}
	ls, err := l.Landings(ctx, p.Business(), p.Name())
	if err != nil || len(ls) == 0 {
		return nil, err
	}
	return &ls[len(ls)-1], nil
}

// reconcileMain moves main to the last landing's new main when main is
// still that landing's old main: the landing was recorded, and bushostd
// stopped before main moved. The caller holds the repository's lock.
func (s *Service) reconcileMain(ctx context.Context, r repo) error {
	last, err := s.lastLanding(ctx, r.proj)
	if last == nil {
		return err
	}
	gg := r.open()
	cur, err := r.readRef(MainRef)
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
