package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
)

// The client writes only into the repository it was told: --repo DIR is a
// new repository when DIR is absent or empty, else DIR must itself be the
// top of a work tree or a bare repository. Git's own discovery would walk
// up from a subdirectory into whatever repository holds it and write there
// (objects, refs, even replace its main); that is refused, naming the
// repository git would have found.

// openOrInit opens the repository at dir, or makes a new one there when dir
// is absent or an empty directory.
func openOrInit(ctx context.Context, g *gitcmd.Runner, dir string) (*gitRepo, error) {
	r := &gitRepo{dir: dir}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(dir)
	absent := errors.Is(err, os.ErrNotExist)
	if err != nil && !absent {
		return nil, err
	}
	empty := false
	if !absent {
		if !fi.IsDir() {
			return nil, errdefs.InvalidArgument(errdefs.RepoNotTopLevel, "--repo %s is not a directory", dir).With("repo", dir)
		}
		des, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		empty = len(des) == 0
	}
	if absent || empty {
		if err := g.Run(ctx, gitcmd.Cmd{Sub: "init", Flags: []string{"--quiet"}, Args: []string{abs}}); err != nil {
			return nil, err
		}
		r.created = absent
	} else if err := atTop(ctx, g, dir, abs); err != nil {
		return nil, err
	}
	gitDir, err := g.Line(ctx, gitcmd.Cmd{Dir: dir, Sub: "rev-parse", Flags: []string{"--absolute-git-dir"}}, gitcmd.MaxLine)
	if err != nil {
		return nil, fmt.Errorf("%s is not a git repository: %w", dir, err)
	}
	common, err := g.Line(ctx, gitcmd.Cmd{Dir: dir, Sub: "rev-parse", Flags: []string{"--path-format=absolute", "--git-common-dir"}}, gitcmd.MaxLine)
	if err != nil {
		return nil, err
	}
	r.gitDir, r.objects = gitDir, filepath.Join(common, "objects")
	return r, nil
}

// atTop returns nil if dir (absolute: abs) is the top of a work tree or a
// bare repository, else the refusal naming what git would have used.
func atTop(ctx context.Context, g *gitcmd.Runner, dir, abs string) error {
	want, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return err
	}
	bare, _ := g.Line(ctx, gitcmd.Cmd{Dir: dir, Sub: "rev-parse", Flags: []string{"--is-bare-repository"}}, gitcmd.MaxLine)
	found := ""
	if bare == "true" {
		found, err = g.Line(ctx, gitcmd.Cmd{Dir: dir, Sub: "rev-parse", Flags: []string{"--absolute-git-dir"}}, gitcmd.MaxLine)
	} else {
		found, err = g.Line(ctx, gitcmd.Cmd{Dir: dir, Sub: "rev-parse", Flags: []string{"--show-toplevel"}}, gitcmd.MaxLine)
	}
	if err != nil || found == "" {
		return errdefs.InvalidArgument(errdefs.RepoNotTopLevel,
			"--repo %s is neither empty nor a git repository: give an absent or empty directory, or a repository's top", dir).With("repo", dir)
	}
	if got, err := filepath.EvalSymlinks(found); err == nil && got == want {
		return nil
	}
	return errdefs.InvalidArgument(errdefs.RepoNotTopLevel,
		"--repo %s is not the top of a repository: git would have written into %s; give that repository's top, or an absent or empty directory", dir, found).
		With("repo", dir).With("found", found)
}

// setMain makes refs/heads/main follow commit (the bus host's main, already
// in refs/remotes/bushost/main) only as a fast-forward: a new or unborn main
// is set, a main behind commit moves (a checked-out one by reset --keep,
// which keeps local changes), a main ahead of it (the worker's own commits
// on top) is left as it is, and a main that has diverged (a worker's
// commits on an older main, or its work landed as a merge) is left as it
// is, with a message on warn saying how to rebase.
func (r *gitRepo) setMain(ctx context.Context, g *gitcmd.Runner, commit string, warn io.Writer) error {
	old, err := g.Line(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "rev-parse", Flags: []string{"--verify", "--quiet"}, Args: []string{"refs/heads/main"}}, gitcmd.MaxLine)
	if err != nil {
		old = ""
	}
	if old == commit {
		return nil
	}
	if old != "" {
		// One merge-base says which of the three it is. It reads the
		// commits between the two, from the commit-graph tidy keeps.
		base, err := g.Line(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "merge-base", Args: []string{old, commit}}, gitcmd.MaxLine)
		if err != nil && gitcmd.ExitCode(err) != 1 {
			return err
		}
		switch base {
		case old: // behind: a fast-forward, below
		case commit: // ahead: the worker's commits on the bus host's main
			return nil
		default:
			fmt.Fprintf(warn, "bushost: %s's main (%s) has diverged from the bus host's main %s and was left as it is;\n"+
				"  refs/remotes/bushost/main has the bus host's main: rebase your work onto it (git rebase bushost/main),\n"+
				"  or, if your work landed, reset main to it (git reset --keep bushost/main)\n", r.dir, old, commit)
			return nil
		}
	}
	bare, _ := g.Line(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "rev-parse", Flags: []string{"--is-bare-repository"}}, gitcmd.MaxLine)
	head, _ := g.Line(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "symbolic-ref", Flags: []string{"--quiet"}, Args: []string{"HEAD"}}, gitcmd.MaxLine)
	if bare == "true" || head != "refs/heads/main" {
		return g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "update-ref", Args: []string{"refs/heads/main", commit, cmp.Or(old, string(gitid.Zero))}})
	}
	if old == "" {
		// An unborn main (a new repository): set it and check it out.
		if err := g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "update-ref", Args: []string{"refs/heads/main", commit}}); err != nil {
			return err
		}
		return g.Run(ctx, gitcmd.Cmd{Dir: r.dir, Sub: "reset", Flags: []string{"--hard", "--quiet"}})
	}
	return g.Run(ctx, gitcmd.Cmd{Dir: r.dir, Sub: "reset", Flags: []string{"--keep", "--quiet"}, Args: []string{commit}})
}
