package gitd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/safepath"
)

// rootKey is the repository config entry that remembers the project's root
// for SyncProject.
const rootKey = "bushost.root"

// AddProject makes business/project's repository and seeds main from root:
// a git repository's HEAD, or a plain directory's files as one commit. It
// is idempotent: a project that exists keeps its main and created is false.
// The project's directory (its pool, with main) appears whole or not at
// all: it is built beside its final path and renamed into place under the
// project's lock.
func (s *Service) AddProject(ctx context.Context, p names.Project, root string) (commit string, created bool, err error) {
	r, err := s.store.project(p)
	if err != nil {
		return "", false, err
	}
	root, err = checkRoot(root)
	if err != nil {
		return "", false, err
	}
	unlock, err := r.state().lock(ctx)
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if r.exists() {
		commit, err := r.readRef(MainRef)
		if err != nil {
			return "", false, err
		}
		if commit == "" {
			return "", false, fmt.Errorf("repository %s has no main", r.Path)
		}
		return commit, false, nil
	}
	dir := filepath.Dir(r.Dir)
	tmpDir, err := os.MkdirTemp(dir, seedPrefix+p.Name()+"-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, poolName)
	if err := s.git.Run(ctx, gitcmd.Cmd{Sub: "init", Flags: []string{"--bare", "--quiet"}, Args: []string{tmp}}); err != nil {
		return "", false, err
	}
	if isGitRepo(root) {
		err = s.git.Run(ctx, gitcmd.Cmd{GitDir: tmp, Sub: "fetch",
			Flags: []string{"--quiet", "--no-tags", "--no-write-fetch-head"},
			Args:  []string{root, "+HEAD:" + MainRef}})
		if err != nil {
			return "", false, errdefs.InvalidArgument(errdefs.RootInvalid, "fetch HEAD of %s: %v", root, err).With("root", root)
		}
	} else {
		c, _, err := commitDir(ctx, s.git, dir, root, "", []string{"GIT_OBJECT_DIRECTORY=" + filepath.Join(tmp, "objects")}, "Seed main from "+root)
		if err != nil {
			return "", false, err
		}
		seeded := repo{Path: tmp, git: s.git}
		if err := seeded.UpdateRef(ctx, MainRef, gitid.ObjectID(c), gitid.Zero); err != nil {
			return "", false, err
		}
	}
	if err := s.git.Run(ctx, gitcmd.Cmd{GitDir: tmp, Sub: "config", Args: []string{rootKey, root}}); err != nil {
		return "", false, err
	}
	commit, err = s.git.Line(ctx, gitcmd.Cmd{GitDir: tmp, Sub: "rev-parse", Flags: []string{"--verify"}, Args: []string{MainRef + "^{commit}"}}, gitcmd.MaxLine)
	if err != nil {
		return "", false, errdefs.InvalidArgument(errdefs.RootInvalid, "%s has no commit at HEAD: %v", root, err).With("root", root)
	}
	if err := os.Rename(tmpDir, r.Dir); err != nil {
		return "", false, err
	}
	if err := bundle.Sync(dir); err != nil {
		return "", false, err
	}
	return commit, true, nil
}

// SyncProject fast-forwards main from the project's root and refuses
// anything else. A plain-directory root becomes a new commit on top of main
// when its files changed.
func (s *Service) SyncProject(ctx context.Context, p names.Project) (commit, previous string, err error) {
	business, project := p.Business(), p.Name()
	r, err := s.store.existingProject(p)
	if err != nil {
		return "", "", err
	}
	tx, err := r.beginLand()
	if err != nil {
		return "", "", err
	}
	defer tx.Rollback()
	if err := tx.lockProject(ctx); err != nil {
		return "", "", err
	}
	// main moves without a record in the log: while the project moves
	// (its export names the main it carries), under the lock the export
	// holds, the store refuses it.
	if m, ok := s.o.Authority.(authz.Mover); ok {
		if err := m.NotMoving(ctx, business, project); err != nil {
			return "", "", err
		}
	}
	root, err := r.root(ctx)
	if err != nil {
		return "", "", err
	}
	old, err := r.readRef(MainRef)
	if err != nil {
		return "", "", err
	}
	q := tx.q
	var next string
	if isGitRepo(root) {
		next, err = s.git.Line(ctx, gitcmd.Cmd{Dir: root, Sub: "rev-parse", Flags: []string{"--verify"}, Args: []string{"HEAD^{commit}"}}, gitcmd.MaxLine)
		if err != nil {
			return "", "", errdefs.InvalidArgument(errdefs.RootInvalid, "%s has no commit at HEAD: %v", root, err).With("root", root)
		}
		if next == old {
			return old, old, nil
		}
		err = q.Run(ctx, s.git, gitcmd.Cmd{GitDir: r.Path, Sub: "fetch",
			Flags: []string{"--quiet", "--no-tags", "--no-write-fetch-head"}, Args: []string{root, "HEAD"}})
		if err != nil {
			return "", "", fmt.Errorf("fetch HEAD of %s: %w", root, err)
		}
		if err := q.Run(ctx, s.git, gitcmd.Cmd{GitDir: r.Path, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{next}}); err != nil {
			return "", "", errdefs.Aborted(errdefs.RefChanged, "HEAD of %s moved during the sync; run it again", root).With("root", root)
		}
		ok, err := r.isAncestor(ctx, q, old, next)
		if err != nil {
			return "", "", err
		}
		if !ok {
			if err := s.landedWorkMissing(ctx, r, q, root, next); err != nil {
				return "", "", err
			}
			return "", "", errdefs.FailedPrecondition(errdefs.NonFastForward, "non-fast-forward: HEAD of %s (%s) does not descend from main (%s); main only moves forward", root, next, old).
				With("commit", next).With("ref", MainRef).With("current", old)
		}
	} else {
		var same bool
		next, same, err = commitDir(ctx, s.git, filepath.Dir(r.Dir), root, old, q.Env(), "Sync main from "+root)
		if err != nil {
			return "", "", err
		}
		if same {
			return old, old, nil
		}
	}
	if err := tx.moveIn(); err != nil {
		return "", "", err
	}
	if err := r.UpdateRef(ctx, MainRef, gitid.ObjectID(next), gitid.ObjectID(old)); err != nil {
		return "", "", err
	}
	// Commit adds what the sync brought to the project's cached size, as
	// a landing's does.
	if err := tx.Commit(ctx); err != nil {
		return "", "", err
	}
	return next, old, nil
}

// commitDir commits the files of root (a plain directory) with parent (or
// none) through a scratch git directory made beside the repositories, with
// env saying where the objects go. same is true when root's tree equals the
// parent's, and then no commit is made.
func commitDir(ctx context.Context, g *gitcmd.Runner, dir, root, parent string, env []string, msg string) (commit string, same bool, err error) {
	scratch, err := os.MkdirTemp(dir, seedPrefix+"scratch-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(scratch)
	if err := g.Run(ctx, gitcmd.Cmd{Sub: "init", Flags: []string{"--bare", "--quiet"}, Args: []string{scratch}}); err != nil {
		return "", false, err
	}
	// A git dir whose config says it is not bare, given explicitly, takes
	// the working directory (root) as its work tree; root gets no .git.
	if err := g.Run(ctx, gitcmd.Cmd{GitDir: scratch, Sub: "config", Args: []string{"core.bare", "false"}}); err != nil {
		return "", false, err
	}
	env = append(env, "GIT_INDEX_FILE="+filepath.Join(scratch, "seed-index"))
	if err := g.Run(ctx, gitcmd.Cmd{Dir: root, GitDir: scratch, Sub: "add", Flags: []string{"--all", "--force"}, Env: env}); err != nil {
		return "", false, fmt.Errorf("add files of %s: %w", root, err)
	}
	tree, err := g.Line(ctx, gitcmd.Cmd{Dir: root, GitDir: scratch, Sub: "write-tree", Env: env}, gitcmd.MaxLine)
	if err != nil {
		return "", false, err
	}
	flags := []string{"-m" + msg}
	if parent != "" {
		ptree, err := g.Line(ctx, gitcmd.Cmd{GitDir: scratch, Sub: "rev-parse", Flags: []string{"--verify"}, Args: []string{parent + "^{tree}"}, Env: env}, gitcmd.MaxLine)
		if err != nil {
			return "", false, err
		}
		if ptree == tree {
			return parent, true, nil
		}
		flags = append(flags, "-p"+parent)
	}
	env = append(env, "GIT_AUTHOR_NAME=bushost", "GIT_AUTHOR_EMAIL=bushost@localhost",
		"GIT_COMMITTER_NAME=bushost", "GIT_COMMITTER_EMAIL=bushost@localhost")
	commit, err = g.Line(ctx, gitcmd.Cmd{GitDir: scratch, Sub: "commit-tree", Flags: flags, Args: []string{tree}, Env: env}, gitcmd.MaxLine)
	if err != nil {
		return "", false, err
	}
	return commit, false, nil
}

// root is r's root, as AddProject recorded it, checked again.
func (r repo) root(ctx context.Context) (string, error) {
	root, err := r.git.Line(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "config", Flags: []string{"--get"}, Args: []string{rootKey}}, gitcmd.MaxLine)
	if err != nil {
		return "", fmt.Errorf("repository %s does not know its root: %w", r.Path, err)
	}
	return checkRoot(root)
}

// checkRoot requires an absolute path to an existing directory. A daemon
// running as root, which git then reads and (publish) writes there by
// path, takes only a root reached through no link and whose every
// directory, itself included, is root's and writable by no one else
// (internal/safepath): no other user can swap it for another tree under
// git's feet.
func checkRoot(root string) (string, error) {
	if root == "" || !filepath.IsAbs(root) {
		return "", errdefs.InvalidArgument(errdefs.RootInvalid, "root %q must be an absolute path", root)
	}
	root = filepath.Clean(root)
	if os.Geteuid() == 0 {
		h, err := safepath.OpenDir(root, 0)
		var refused *safepath.Error
		if errors.As(err, &refused) {
			return "", err
		}
		h.Close()
	}
	fi, err := os.Stat(root)
	if err != nil || !fi.IsDir() {
		return "", errdefs.InvalidArgument(errdefs.RootInvalid, "root %s is not a directory", root).With("root", root)
	}
	if strings.ContainsAny(root, "\n") {
		return "", errdefs.InvalidArgument(errdefs.RootInvalid, "root %q has a newline", root)
	}
	return root, nil
}

// isGitRepo reports whether root is a git work tree (has .git) or a bare
// repository.
func isGitRepo(root string) bool {
	if _, err := os.Lstat(filepath.Join(root, ".git")); err == nil {
		return true
	}
	h, err1 := os.Stat(filepath.Join(root, "HEAD"))
	o, err2 := os.Stat(filepath.Join(root, "objects"))
	return err1 == nil && err2 == nil && !h.IsDir() && o.IsDir()
}
