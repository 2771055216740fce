package gitd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/names"
)

// The migration from the one-repository layout (repos/<business>/<project>.git
// holding main and every refs/work/<task>) to the pool and task
// repositories (repository.go). It runs in New, at start, before anything
// is served, one project at a time:
//
//  1. A staging directory repos/<business>/.migrating-<project> is built:
//     pool.git gets main (and the objects it reaches) and the root's
//     config; tasks/<task>.git gets refs/work/<task> (and the objects it
//     reaches that the pool lacks), its alternate the pool.
//  2. The staging directory is renamed to repos/<business>/<project>: the
//     new layout appears whole or not at all.
//  3. The old repository is removed.
//
// A start that finds a staging directory removes it (the migration was cut
// before step 2) and begins again from the old repository; one that finds
// both the new directory and the old repository finishes step 3. Objects
// of the old repository that no ref reaches are not carried over (a push
// cut between its record and its ref move; Reconcile then marks its task
// for 'bushost task repair').

// migratePrefix starts a staging directory; no project name starts with '.'.
const migratePrefix = ".migrating-"

// migrate moves every old-layout repository of the store to the new layout.
func (st *store) migrate(ctx context.Context) error {
	bs, err := os.ReadDir(st.dir)
	if err != nil {
		return err
	}
	for _, b := range bs {
		if !b.IsDir() || names.Check("business", b.Name()) != nil {
			continue
		}
		dir := filepath.Join(st.dir, b.Name())
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), migratePrefix) {
				// Cut before its rename: roll back; the old repository,
				// still there, is migrated again below.
				st.log.Warn("migration: removing a staging directory a cut migration left", "dir", filepath.Join(dir, e.Name()))
				if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
					return err
				}
			}
		}
		for _, e := range ents {
			project, ok := strings.CutSuffix(e.Name(), ".git")
			if !ok || !e.IsDir() {
				continue
			}
			scope, err := names.ParseProject(b.Name(), project)
			if err != nil {
				continue
			}
			if err := st.migrateProject(ctx, scope); err != nil {
				return fmt.Errorf("migrate %s/%s: %w", b.Name(), project, err)
			}
		}
	}
	return nil
}

func (st *store) migrateProject(ctx context.Context, scope names.Project) error {
	business, project := scope.Business(), scope.Name()
	p, err := st.project(scope)
	if err != nil {
		return err
	}
	old := filepath.Join(st.dir, business, project+".git")
	log := st.log.With("business", business, "project", project, "old", old)
	if p.exists() {
		log.Info("migration: the new layout is in place; removing the old repository", "pool", p.Path)
		if err := os.RemoveAll(old); err != nil {
			return err
		}
		return bundle.Sync(filepath.Dir(old))
	}
	log.Info("migration: moving the project's repository to a pool and one repository per task")
	staging := filepath.Join(st.dir, business, migratePrefix+project)
	if err := os.Mkdir(staging, 0o700); err != nil {
		return err
	}
	pool := filepath.Join(staging, poolName)
	if err := st.git.Run(ctx, gitcmd.Cmd{Sub: "init", Flags: []string{"--bare", "--quiet"}, Args: []string{pool}}); err != nil {
		return err
	}
	if root, err := st.git.Line(ctx, gitcmd.Cmd{GitDir: old, Sub: "config", Flags: []string{"--get"}, Args: []string{rootKey}}, gitcmd.MaxLine); err == nil && root != "" {
		if err := st.git.Run(ctx, gitcmd.Cmd{GitDir: pool, Sub: "config", Args: []string{rootKey, root}}); err != nil {
			return err
		}
	}
	fetch := func(gitDir, ref string) error {
		return st.git.Run(ctx, gitcmd.Cmd{GitDir: gitDir, Sub: "fetch",
			Flags: []string{"--quiet", "--no-tags", "--no-write-fetch-head"}, Args: []string{old, ref + ":" + ref}})
	}
	if main, _ := st.git.Line(ctx, gitcmd.Cmd{GitDir: old, Sub: "for-each-ref", Flags: []string{"--format=%(objectname)"}, Args: []string{MainRef}}, gitcmd.MaxLine); main != "" {
		if err := fetch(pool, MainRef); err != nil {
			return err
		}
	}
	out, err := st.git.Line(ctx, gitcmd.Cmd{GitDir: old, Sub: "for-each-ref", Flags: []string{"--format=%(refname)"}, Args: []string{"refs/work/"}}, maxRefList)
	if err != nil {
		return err
	}
	moved := 0
	for _, ref := range strings.Fields(out) {
		task := strings.TrimPrefix(ref, "refs/work/")
		if w, err := names.WorkRef(task); err != nil || w != ref {
			log.Warn("migration: skipping a ref that names no valid task", "ref", ref)
			continue
		}
		dir := filepath.Join(staging, tasksDir, task+".git")
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return err
		}
		if err := initTask(dir); err != nil {
			return err
		}
		if err := fetch(dir, ref); err != nil {
			return err
		}
		moved++
	}
	if err := syncTree(staging); err != nil {
		return err
	}
	crashpoint("migrate:staged")
	if err := os.Rename(staging, p.Dir); err != nil {
		return err
	}
	if err := bundle.Sync(filepath.Dir(p.Dir)); err != nil {
		return err
	}
	crashpoint("migrate:renamed")
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := bundle.Sync(filepath.Dir(old)); err != nil {
		return err
	}
	log.Info("migration: done", "pool", p.Path, "tasks", moved)
	return nil
}

// syncTree fsyncs every file and directory under dir, so that the rename
// that publishes it never exposes a tree a crash could leave incomplete.
func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := bundle.Sync(p); !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})
}
