package gitd

import (
	"context"
	"fmt"
	"strings"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/textsafe"
)

// DefaultPublishBranch is the root's branch `project publish` writes.
const DefaultPublishBranch = "bushost/main"

// maxBranchBytes bounds a branch name.
const maxBranchBytes = 200

// checkBranch accepts a branch name of plain components: letters, digits,
// '.', '_', '-', separated by '/'; no component starts with '.' or ends in
// ".lock", and ".." never appears.
func checkBranch(b string) error {
	bad := func(why string) error {
		return errdefs.InvalidArgument(errdefs.BranchInvalid, "branch %q: %s", clipName(b), why).With("branch", clipName(b))
	}
	if b == "" || len(b) > maxBranchBytes {
		return bad(fmt.Sprintf("must be 1 to %d bytes", maxBranchBytes))
	}
	if strings.Contains(b, "..") {
		return bad("must not contain \"..\"")
	}
	for _, c := range strings.Split(b, "/") {
		if c == "" || c[0] == '.' || c[0] == '-' || strings.HasSuffix(c, ".lock") {
			return bad("each part between '/' is non-empty, starts with no '.' or '-' and does not end in .lock")
		}
		for _, r := range c {
			if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-') {
				return bad("only letters, digits, '.', '_', '-' and '/'")
			}
		}
	}
	return nil
}

func clipName(s string) string { return textsafe.Clip(s, 64) }

// PublishProject writes main to refs/heads/<branch> of the project's root,
// a git repository: main's objects are fetched into the root (no ref of it
// moves by the fetch), then one update-ref against the branch's old value.
// The root's checked-out branch is refused, so its work tree and index are
// never touched. Without force the branch only fast-forwards.
func (s *Service) PublishProject(ctx context.Context, p names.Project, branch string, force bool) (commit, previous string, err error) {
	if branch == "" {
		branch = DefaultPublishBranch
	}
	if err := checkBranch(branch); err != nil {
		return "", "", err
	}
	ref := "refs/heads/" + branch
	r, err := s.store.existingProject(p)
	if err != nil {
		return "", "", err
	}
	unlock, err := r.state().lock(ctx)
	if err != nil {
		return "", "", err
	}
	defer unlock()
	root, err := r.root(ctx)
	if err != nil {
		return "", "", err
	}
	if !isGitRepo(root) {
		return "", "", errdefs.FailedPrecondition(errdefs.RootInvalid, "the root %s is a plain directory, not a git repository: it has no branch to publish to", root).With("root", root)
	}
	gg := r.open()
	main, err := r.readRef(MainRef)
	if err != nil {
		return "", "", err
	}
	// The root's checkout and the host's tools expand what is published:
	// held to the tree bounds as a push and a landing are.
	if _, err := gg.checkResultTree(ctx, main, nil); err != nil {
		return "", "", err
	}
	if head, err := s.git.Line(ctx, gitcmd.Cmd{Dir: root, Sub: "symbolic-ref", Flags: []string{"--quiet"}, Args: []string{"HEAD"}}, gitcmd.MaxLine); err == nil && head == ref {
		return "", "", errdefs.FailedPrecondition(errdefs.BranchCheckedOut, "%s is the branch checked out in %s: publish to another branch (default %s) and merge it there", branch, root, DefaultPublishBranch).
			With("branch", branch).With("root", root)
	}
	previous, _ = s.git.Line(ctx, gitcmd.Cmd{Dir: root, Sub: "rev-parse", Flags: []string{"--verify", "--quiet"}, Args: []string{ref + "^{commit}"}}, gitcmd.MaxLine)
	if previous == main {
		return main, previous, nil
	}
	if err := s.git.Run(ctx, gitcmd.Cmd{Dir: root, Sub: "fetch", Flags: []string{"--quiet", "--no-tags", "--no-write-fetch-head"}, Args: []string{r.Path, MainRef}}); err != nil {
		return "", "", fmt.Errorf("fetch main into %s: %w", root, err)
	}
	if previous != "" && !force {
		err := s.git.Run(ctx, gitcmd.Cmd{Dir: root, Sub: "merge-base", Flags: []string{"--is-ancestor"}, Args: []string{previous, main}})
		if gitcmd.ExitCode(err) == 1 {
			return "", "", errdefs.FailedPrecondition(errdefs.NonFastForward, "non-fast-forward: main (%s) does not descend from %s of %s (%s); give --force to move it anyway", main, branch, root, previous).
				With("commit", main).With("ref", ref).With("current", previous)
		}
		if err != nil {
			return "", "", err
		}
	}
	old := previous
	if old == "" {
		old = string(gitid.Zero)
	}
	// The root is the host's repository, not one of the store: its ref
	// moves here, against its old value, and nowhere else.
	if err := s.git.Run(ctx, gitcmd.Cmd{Dir: root, Sub: "update-ref", Args: []string{ref, main, old}}); err != nil {
		return "", "", err
	}
	return main, previous, nil
}

// landedWorkMissing refuses a sync whose root lacks work landed on main
// (the last landing's main is not in the root's HEAD): syncing would drop
// it. The host publishes main to the root and merges it there first.
func (s *Service) landedWorkMissing(ctx context.Context, r repo, q *bundle.Quarantine, root, next string) error {
	last, err := s.lastLanding(ctx, r.proj)
	if last == nil {
		return err
	}
	in, err := r.isAncestor(ctx, q, last.New, next)
	if err != nil || in {
		return err
	}
	return errdefs.FailedPrecondition(errdefs.MainHasLandedWork,
		"main has landed work that HEAD of %s lacks (task %s, main %s): run 'bushost project publish --business %s --project %s', merge %s in the root, then sync",
		root, last.Task, last.New, r.Business, r.Project, DefaultPublishBranch).
		With("task", last.Task).With("main", last.New).With("root", root)
}
