package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/bushost/bushost/internal/gitcmd"
)

// GoodRef holds the last commit under which every revertable service stayed
// healthy for good_after.
const GoodRef = "refs/supervisor/good"

// defaultIgnore keeps dependencies, build output and editor litter out of the
// agent's commits. It is written as the workspace's root .gitignore, which
// the agent cannot change.
const defaultIgnore = `# Written by the bushost supervisor: what never belongs in a commit.
node_modules/
dist/
build/
.cache/
__pycache__/
*.pyc
.venv/
*.log
.env
.DS_Store
*.swp
*~
`

// skipDirs are directories the watcher never descends into: git's own and
// the ignored ones, which can hold more files than inotify has watches.
var skipDirs = map[string]bool{
	".git": true, "node_modules": true, "dist": true, "build": true,
	".cache": true, "__pycache__": true, ".venv": true,
}

// Repo is the workspace repository as the supervisor uses it. Only the
// watched trees are ever staged, so a revert never has to touch a file
// outside them (infra/, AGENTS.md, the root .gitignore stay untracked).
type Repo struct {
	dir    string
	gitDir string
	git    *gitcmd.Runner
	watch  []string
	log    *slog.Logger
	// safeDir is the work tree as git's safe.directory check sees it.
	safeDir string
}

// NewRepo returns the repository of workspace dir with the given watched
// trees (relative, cleaned).
func NewRepo(git *gitcmd.Runner, dir string, watch []string, log *slog.Logger) *Repo {
	safe := dir
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		safe = real
	}
	return &Repo{dir: dir, gitDir: filepath.Join(dir, ".git"), git: git, watch: watch, log: log, safeDir: safe}
}

// cmd builds a git command on the workspace. The -c entries win over the
// agent-writable .git/config: the work tree is always the workspace, the
// repository is never bare, and new files stay group-writable so that the
// agent and the supervisor can both write them.
func (r *Repo) cmd(sub string, flags []string, args ...string) gitcmd.Cmd {
	return gitcmd.Cmd{
		Dir: r.dir, GitDir: r.gitDir, Sub: sub, Flags: flags, Args: args,
		Config: []string{
			"safe.directory=" + r.safeDir,
			"safe.directory=" + r.dir,
			"core.worktree=" + r.dir,
			"core.bare=false",
			"core.sharedRepository=group",
			"core.autocrlf=false",
		},
	}
}

func identityEnv(id Identity) []string {
	return []string{
		"GIT_AUTHOR_NAME=" + id.Name, "GIT_AUTHOR_EMAIL=" + id.Email,
		"GIT_COMMITTER_NAME=" + id.Name, "GIT_COMMITTER_EMAIL=" + id.Email,
	}
}

// Ensure makes the workspace, its watched trees and its repository if they
// are missing, and writes the ignore rules. It is idempotent.
func (r *Repo) Ensure(ctx context.Context) error {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	for i, w := range r.watch {
		if err := os.MkdirAll(filepath.Join(r.dir, w), 0o775); err != nil {
			return fmt.Errorf("watch[%d] %s: %w", i, w, err)
		}
	}
	if _, err := os.Lstat(r.gitDir); errors.Is(err, fs.ErrNotExist) {
		c := r.cmd("init", []string{"-q", "--shared=group"}, r.dir)
		c.GitDir = ""
		if err := r.git.Run(ctx, c); err != nil {
			return fmt.Errorf("workspace: init repository: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	ignore := filepath.Join(r.dir, ".gitignore")
	if _, err := os.Lstat(ignore); errors.Is(err, fs.ErrNotExist) {
		if err := os.WriteFile(ignore, []byte(defaultIgnore), 0o644); err != nil {
			r.log.Warn("cannot write the workspace .gitignore; ignore rules go to .git/info/exclude only", "err", err)
		}
	}
	return r.writeExclude()
}

// writeExclude hides the untracked top-level entries (infra/, AGENTS.md, ...)
// from the agent's own git status and repeats the ignore rules, in case the
// root .gitignore could not be written.
func (r *Repo) writeExclude() error {
	var b strings.Builder
	b.WriteString("# Written by the bushost supervisor: only the watched trees are tracked.\n/*\n")
	tops := map[string]bool{}
	for _, w := range r.watch {
		top := strings.SplitN(w, "/", 2)[0]
		if !tops[top] {
			tops[top] = true
			fmt.Fprintf(&b, "!/%s/\n", top)
		}
	}
	b.WriteString(defaultIgnore)
	info := filepath.Join(r.gitDir, "info")
	if err := os.MkdirAll(info, 0o775); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return writeFileAtomic(filepath.Join(info, "exclude"), []byte(b.String()), 0o664)
}

// writeFileAtomic replaces path with data. The rename replaces a symlink at
// path rather than writing through it.
func writeFileAtomic(path string, data []byte, mode fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Chmod(mode)
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return werr
	}
	return nil
}

// rev resolves rev to a commit id, or "" if it does not exist.
func (r *Repo) rev(ctx context.Context, rev string) (string, error) {
	out, err := r.git.Line(ctx, r.cmd("rev-parse", []string{"--verify", "-q"}, rev+"^{commit}"))
	if err != nil {
		if gitcmd.ExitCode(err) == 1 {
			return "", nil
		}
		return "", err
	}
	return out, nil
}

// Head is the current commit, or "" before the first one.
func (r *Repo) Head(ctx context.Context) (string, error) { return r.rev(ctx, "HEAD") }

// Good is refs/supervisor/good, or "" if no commit was ever good.
func (r *Repo) Good(ctx context.Context) (string, error) { return r.rev(ctx, GoodRef) }

// Tree is the tree id of commit.
func (r *Repo) Tree(ctx context.Context, commit string) (string, error) {
	return r.git.Line(ctx, r.cmd("rev-parse", []string{"--verify", "-q"}, commit+"^{tree}"))
}

// SetGood moves refs/supervisor/good to commit, if it still points at old
// ("" for a ref that must not exist yet).
func (r *Repo) SetGood(ctx context.Context, commit, old string) error {
	if old == "" {
		old = strings.Repeat("0", len(commit))
	}
	if err := r.git.Run(ctx, r.cmd("update-ref", nil, GoodRef, commit, old)); err != nil {
		return fmt.Errorf("move %s: %w", GoodRef, err)
	}
	return nil
}

// stage adds every change under the watched trees to the index and returns
// the paths that differ from HEAD (head "" for an unborn branch).
func (r *Repo) stage(ctx context.Context, head string) ([]string, error) {
	for _, w := range r.watch {
		err := r.git.Run(ctx, r.cmd("add", []string{"-A"}, w))
		// An empty tree that was never committed matches nothing: no change.
		if err != nil && !strings.Contains(err.Error(), "did not match any files") {
			return nil, fmt.Errorf("stage %s: %w", w, err)
		}
	}
	var out []byte
	var err error
	if head == "" {
		out, err = r.git.Output(ctx, r.cmd("ls-files", []string{"--cached", "-z"}))
	} else {
		out, err = r.git.Output(ctx, r.cmd("diff-index", []string{"--cached", "--name-only", "--no-renames", "-z"}, head))
	}
	if err != nil {
		return nil, fmt.Errorf("list staged changes: %w", err)
	}
	var paths []string
	for _, p := range bytes.Split(out, []byte{0}) {
		if len(p) > 0 {
			paths = append(paths, string(p))
		}
	}
	sort.Strings(paths)
	return paths, nil
}

func (r *Repo) commit(ctx context.Context, who Identity, msg string, allowEmpty bool) (string, error) {
	flags := []string{"-q", "--no-verify", "--cleanup=verbatim", "--message=" + msg}
	if allowEmpty {
		flags = append(flags, "--allow-empty")
	}
	c := r.cmd("commit", flags)
	c.Env = identityEnv(who)
	if err := r.git.Run(ctx, c); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return r.Head(ctx)
}

// InitialCommit makes the first commit of the watched trees, authored by
// who, if the branch has none yet. It returns HEAD.
func (r *Repo) InitialCommit(ctx context.Context, who Identity) (string, error) {
	if err := r.sanitizeConfig(ctx); err != nil {
		return "", err
	}
	head, err := r.Head(ctx)
	if err != nil || head != "" {
		return head, err
	}
	if _, err := r.stage(ctx, ""); err != nil {
		return "", err
	}
	return r.commit(ctx, who, "supervisor: initial commit of the watched trees\n", true)
}

// CommitPending commits every change under the watched trees as who. It
// returns "" and no paths when the trees match HEAD, which is how the
// supervisor's own resets end up never committed or restarted on.
func (r *Repo) CommitPending(ctx context.Context, who Identity) (string, []string, error) {
	// First of all: a hostile config must not act even on rev-parse.
	if err := r.sanitizeConfig(ctx); err != nil {
		return "", nil, err
	}
	head, err := r.Head(ctx)
	if err != nil {
		return "", nil, err
	}
	if head == "" {
		return "", nil, errors.New("commit: the workspace has no initial commit")
	}
	paths, err := r.stage(ctx, head)
	if err != nil || len(paths) == 0 {
		return "", nil, err
	}
	commit, err := r.commit(ctx, who, editMessage(paths), false)
	return commit, paths, err
}

func editMessage(paths []string) string {
	var b strings.Builder
	if len(paths) == 1 {
		fmt.Fprintf(&b, "agent: edit %s\n", paths[0])
	} else {
		fmt.Fprintf(&b, "agent: edit %s and %d more\n", paths[0], len(paths)-1)
	}
	b.WriteString("\nRecorded by the supervisor after the debounce.\n\n")
	for i, p := range paths {
		if i == 50 {
			fmt.Fprintf(&b, "... and %d more\n", len(paths)-50)
			break
		}
		fmt.Fprintf(&b, "  %s\n", p)
	}
	return b.String()
}

// Revert records any pending agent edits, then puts the watched trees back to
// good and commits that as sup, even if nothing changed. It returns the
// commit reverted from (pending edits included) and the revert commit, and
// checks that the revert's tree is good's.
func (r *Repo) Revert(ctx context.Context, good string, agent, sup Identity, reason string) (from, commit string, err error) {
	if good == "" {
		return "", "", errors.New("revert: no good commit")
	}
	if _, _, err := r.CommitPending(ctx, agent); err != nil {
		return "", "", fmt.Errorf("revert: record pending edits: %w", err)
	}
	if from, err = r.Head(ctx); err != nil {
		return "", "", fmt.Errorf("revert: %w", err)
	}
	if err := r.sanitizeConfig(ctx); err != nil {
		return from, "", fmt.Errorf("revert: %w", err)
	}
	if err := r.git.Run(ctx, r.cmd("read-tree", []string{"-u", "--reset"}, good)); err != nil {
		return from, "", fmt.Errorf("revert: reset to %s: %w", short(good), err)
	}
	msg := fmt.Sprintf("supervisor: revert to %s\n\n%s\n\nReverted-from: %s\nGood: %s\n", short(good), reason, from, good)
	if commit, err = r.commit(ctx, sup, msg, true); err != nil {
		return from, "", fmt.Errorf("revert: %w", err)
	}
	got, err := r.Tree(ctx, commit)
	if err != nil {
		return from, commit, fmt.Errorf("revert: %w", err)
	}
	want, err := r.Tree(ctx, good)
	if err != nil {
		return from, commit, fmt.Errorf("revert: %w", err)
	}
	if got != want {
		return from, commit, fmt.Errorf("revert: commit %s has tree %s, good %s has %s", short(commit), got, short(good), want)
	}
	return from, commit, nil
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
