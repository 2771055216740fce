package gitd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/gitobj"
	"github.com/bushost/bushost/internal/names"
)

// The store's layout (docs/git-service.md, "Layout"):
//
//	<ReposDir>/<business>/<project>/pool.git          main and what landed
//	<ReposDir>/<business>/<project>/tasks/<task>.git  refs/work/<task>; its
//	                                                   objects' alternate is the pool
//	<ReposDir>/<business>/<project>.flock             the project's lock
//
// A task's repository sees the pool and itself, never another task: every
// read of a push, a fetch and a have goes through a repo, which reads only
// its own objects and its pool's; every ref move goes through
// repo.UpdateRef.

const (
	poolName = "pool.git"
	tasksDir = "tasks"
	// poolAlternate is a task repository's objects/info/alternates: relative
	// to its objects directory, so that a project directory can be renamed
	// whole (the migration builds one aside).
	poolAlternate = "../../../" + poolName + "/objects"
)

// repo is one bare repository of the store, its names validated: a
// project's pool (Task == "") or one task's repository. It is the one type
// through which gitd reads (go-git, bounded) and writes (gitcmd) a
// repository.
type repo struct {
	Business, Project, Task string
	Dir                     string // the project's directory
	Path                    string // the bare repository
	LockPath                string // the project's flock, beside Dir
	git                     *gitcmd.Runner
	// proj and task are the names above as validated where the call
	// entered (task is zero for a pool): a repo is made only from them.
	proj names.Project
	task names.Task
	st   *store
}

// state is what r's project shares in this process (store.go).
func (r repo) state() *project { return r.st.state(r.Dir, r.LockPath) }

func (r repo) isPool() bool { return r.Task == "" }

// pool is the pool of r's project (r itself for the pool).
func (r repo) pool() repo {
	p := r
	p.Task, p.task, p.Path = "", names.Task{}, filepath.Join(r.Dir, poolName)
	return p
}

func (r repo) objects() string { return filepath.Join(r.Path, "objects") }

func (r repo) exists() bool {
	fi, err := os.Stat(filepath.Join(r.Path, "objects"))
	return err == nil && fi.IsDir()
}

// visible lists the object directories r may read, its own first: a task
// sees its own (once it exists) and the pool's, the pool only its own.
func (r repo) visible() []string {
	if r.isPool() {
		return []string{r.objects()}
	}
	if r.exists() {
		return []string{r.objects(), r.pool().objects()}
	}
	return []string{r.pool().objects()}
}

// gitDir is the repository a git command reading r's objects runs in: r
// once it exists, else its pool (whose objects are all r sees then).
func (r repo) gitDir() string {
	if r.isPool() || r.exists() {
		return r.Path
	}
	return r.pool().Path
}

// quarantine makes a quarantine whose reads see only what r may see and
// whose Migrate links into r's objects (made by ensure before it).
func (r repo) quarantine() (*bundle.Quarantine, error) {
	parent := r.pool().objects()
	if r.exists() {
		parent = r.objects()
	}
	// A task's own objects directory names the pool as its alternate, so
	// one directory is all the environment lists.
	return bundle.NewQuarantineFor(parent, r.objects(), r.visible()[0])
}

// UpdateRef is the one door through which gitd moves a ref: ref from old
// to new ("" or gitid.Zero: the ref must not exist yet), refused when the
// ref is not at old. It moves it by git's lock-file protocol (refs.go:
// PrepareRef, then Commit, which a push splits around its record); a
// symbolic ref or one with a reflog by `git update-ref`. The caller holds
// the ref's lock (r.state().lock, or lockTask for a task's ref).
func (r repo) UpdateRef(ctx context.Context, ref gitid.ReferenceName, newID, old gitid.ObjectID) error {
	m, err := r.PrepareRef(ctx, ref, newID, old)
	if err != nil {
		return err
	}
	defer m.Abort()
	return m.Commit(ctx)
}

// ensure makes a task's repository on its first push: a bare repository
// whose objects' alternate is the pool, built beside its final path and
// renamed into place, not yet fsynced (the caller syncs its parent: Push,
// with its pack, in one batch of fsyncs). made says it did. The caller
// holds the task's lock (or the project's).
func (r repo) ensure() (made bool, err error) {
	if r.isPool() || r.exists() {
		return false, nil
	}
	dir := filepath.Dir(r.Path)
	var tmp string
	// A refused first push to another task (dropNew) may remove the
	// tasks directory between the two calls: make it again.
	for try := 0; try < 3; try++ {
		if err = os.MkdirAll(dir, 0o700); err != nil {
			return false, err
		}
		if tmp, err = os.MkdirTemp(dir, seedPrefix+r.Task+"-"); !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	if err := initTask(tmp); err != nil {
		return false, err
	}
	return true, os.Rename(tmp, r.Path)
}

// dropNew removes a task repository ensure just made for a push that was
// then refused, unless something else already entered it (another push's
// quarantine): a refused first push leaves no repository behind. The
// caller holds the task's lock (or the project's).
func (r repo) dropNew() error {
	ents, err := os.ReadDir(r.objects())
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if e.Name() != "info" && e.Name() != "pack" {
			return nil
		}
	}
	if packs, _ := os.ReadDir(filepath.Join(r.objects(), "pack")); len(packs) > 0 {
		return nil
	}
	if err := os.RemoveAll(r.Path); err != nil {
		return err
	}
	// The tasks directory goes too when it held only this one.
	os.Remove(filepath.Dir(r.Path))
	return nil
}

// initTask makes a bare repository at dir whose alternate is the pool two
// levels up (dir is <project>/tasks/<name>). It writes the few files of an
// empty bare repository itself, as `git init --bare --template=` would:
// a push's first call pays for no git process here (make bench measures
// first pushes). Of the directories, it makes only those git needs (objects,
// refs) and those the push writes into (objects/info for the alternate,
// objects/pack, refs/work for the task's ref), not git init's refs/heads
// and refs/tags, which nothing here uses: a directory costs a first push
// an inode and a block, 0.1-0.4 ms of kernel time each on the development
// VM, more with pushes side by side.
func initTask(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"objects", "objects/info", "objects/pack", "refs", "refs/work"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for name, body := range map[string]string{
		"HEAD":                    "ref: refs/heads/main\n",
		"config":                  "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n",
		"objects/info/alternates": poolAlternate + "\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// tasks lists the task repositories of p's project.
func (p repo) tasks() ([]repo, error) {
	ents, err := os.ReadDir(filepath.Join(p.Dir, tasksDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []repo
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".git")
		if !ok || !e.IsDir() {
			continue
		}
		// A directory's name is checked as a request's would be: what
		// is not a task's name is not a task's repository.
		tn, err := p.proj.Task(name)
		if err != nil {
			continue
		}
		t, err := p.st.task(tn)
		if err != nil {
			continue
		}
		out = append(out, t)
	}
	return out, nil
}

// readRef returns the commit ref points at in r itself (not its pool), or
// "" if it does not exist, r included. It reads the ref afresh each time,
// as git does, refusing a value that is not an object id (gitobj.ReadRef,
// which the ref moves read too).
func (r repo) readRef(ref string) (string, error) {
	if !r.exists() {
		return "", nil
	}
	return gitobj.ReadRef(r.Path, ref)
}

// hasObject reports whether r may read h: loose or in a pack of one of the
// object directories it sees (see hasObjectIn).
func (r repo) hasObject(h plumbing.Hash) (bool, error) {
	for _, dir := range r.visible() {
		ok, err := hasObjectIn(dir, h)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// isAncestor reports whether a is an ancestor of b (objects read through q).
func (r repo) isAncestor(ctx context.Context, q *bundle.Quarantine, a, b string) (bool, error) {
	return ancestry(q.Run(ctx, r.git, gitcmd.Cmd{GitDir: r.gitDir(), Sub: "merge-base", Flags: []string{"--is-ancestor"}, Args: []string{a, b}}))
}

// ancestry reads the outcome err of `git merge-base --is-ancestor`: exit
// 0 is yes, 1 no, anything else an error.
func ancestry(err error) (bool, error) {
	if gitcmd.ExitCode(err) == 1 {
		return false, nil
	}
	return err == nil, err
}

var errNoMergeBase = errors.New("no merge base")

// mergeBase returns a merge base of a and b, or errNoMergeBase.
func (r repo) mergeBase(ctx context.Context, q *bundle.Quarantine, a, b string) (string, error) {
	out, err := r.git.Line(ctx, gitcmd.Cmd{GitDir: r.gitDir(), Sub: "merge-base", Args: []string{a, b}, Env: q.Env()}, gitcmd.MaxLine)
	if err == nil {
		return out, nil
	}
	if gitcmd.ExitCode(err) == 1 {
		return "", errNoMergeBase
	}
	return "", err
}

// refs lists r's refs (ref -> commit); none for a repository not made.
// maxRefList bounds a listing of a repository's refs read from git: a
// pool holds main, a task's repository its work ref, an old layout's
// repository one per task (64 MiB is over 200,000 of them).
const maxRefList = 64 << 20

func (r repo) refs(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	if !r.exists() {
		return out, nil
	}
	raw, err := r.git.Output(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "for-each-ref", Flags: []string{"--format=%(objectname) %(refname)"}}, maxRefList)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if oid, ref, ok := strings.Cut(line, " "); ok {
			out[ref] = oid
		}
	}
	return out, nil
}

// gitHasCommit asks git whether r (with its pool) holds commit: the last
// word before a task is marked for repair. go-git lists a repository's
// packs when it opens them, and a repack still running (housekeeping's,
// or one a killed daemon left running) can move an object between two
// packs under it; git looks again.
func (r repo) gitHasCommit(ctx context.Context, commit string) bool {
	return r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{commit + "^{commit}"}}) == nil
}
