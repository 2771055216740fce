package supervisor

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/safepath"
)

// GoodRef holds the last commit under which every revertable service stayed
// healthy for good_after.
const GoodRef = "refs/supervisor/good"

// attributes is the supervisor's own $GIT_DIR/info/attributes, which git
// reads after (and so above) every in-tree .gitattributes: no attribute of
// the agent's can convert content on the way in or out (text, eol, ident,
// working-tree-encoding) or name a filter, diff or merge driver. The
// supervisor's git config defines no driver either; this makes a committed
// blob byte for byte the file on disk, and a checkout byte for byte the blob.
const attributes = "# Written by the bushost supervisor: no conversion, no driver.\n" +
	"* -text -eol -crlf -ident -filter -diff -merge -working-tree-encoding -export-subst\n"

// Repo is the supervisor's own repository: a git dir outside the workspace,
// writable only by the supervisor's user, whose work tree is the workspace.
// Only the watched trees are ever staged, so a revert never has to touch a
// file outside them (infra/, AGENTS.md stay untracked). The agent may keep a
// git of its own in the workspace; the supervisor never reads it.
// maxPathList bounds a listing of the watched trees' paths read from git
// (some 500,000 paths): a tree the agent filled past it fails the commit
// or revert with GIT_OUTPUT_TOO_LARGE instead of growing the supervisor.
const maxPathList = 64 << 20

type Repo struct {
	dir    string
	gitDir string
	git    *gitcmd.Runner
	watch  []string
	ignore []string
	log    *slog.Logger
	// safeDir is the work tree as git's safe.directory check sees it.
	safeDir string
}

// NewRepo returns the repository whose git dir is gitDir and whose work tree
// is the workspace dir, with the given watched trees (relative, cleaned) and
// ignore patterns (one path component each, see Config.Ignore).
func NewRepo(git *gitcmd.Runner, dir, gitDir string, watch, ignore []string, log *slog.Logger) *Repo {
	safe := dir
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		safe = real
	}
	return &Repo{dir: dir, gitDir: gitDir, git: git, watch: watch, ignore: ignore, log: log, safeDir: safe}
}

// cmd builds a git command on the workspace. The git dir is the
// supervisor's, so its config is too; the -c entries pin what matters
// anyway.
func (r *Repo) cmd(sub string, flags []string, args ...string) gitcmd.Cmd {
	return gitcmd.Cmd{
		Dir: r.dir, GitDir: r.gitDir, Sub: sub, Flags: flags, Args: args,
		Config: []string{
			"safe.directory=" + r.safeDir,
			"safe.directory=" + r.dir,
			"core.worktree=" + r.dir,
			"core.bare=false",
			"core.autocrlf=false",
			"core.safecrlf=false",
			"core.symlinks=true",
			"core.untrackedCache=false",
			"core.excludesFile=/dev/null",
			"submodule.recurse=false",
			"diff.renames=false",
		},
	}
}

// Ensure makes the workspace, its watched trees and the supervisor's git dir
// if they are missing, refuses a git dir another user could write, and
// writes the repository's attributes. It is idempotent.
func (r *Repo) Ensure(ctx context.Context) error {
	if _, err := os.Lstat(r.gitDir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(r.gitDir), 0o755); err != nil {
			return fmt.Errorf("git_dir: %w", err)
		}
		if err := os.Mkdir(r.gitDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("git_dir: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("git_dir: %w", err)
	}
	if err := checkOwnDir(r.gitDir); err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(r.gitDir, "HEAD")); errors.Is(err, fs.ErrNotExist) {
		c := gitcmd.Cmd{Dir: r.gitDir, Sub: "init", Flags: []string{"-q", "--bare"}, Args: []string{r.gitDir}}
		if err := r.git.Run(ctx, c); err != nil {
			return fmt.Errorf("git_dir: init repository: %w", err)
		}
	} else if err := r.sameWorkspace(ctx); err != nil {
		return err
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	for i, w := range r.watch {
		if err := os.MkdirAll(filepath.Join(r.dir, w), 0o775); err != nil {
			return fmt.Errorf("watch[%d] %s: %w", i, w, err)
		}
	}
	// The repository's own config names the work tree: git takes it from
	// there, not from -c, when the git dir is given explicitly.
	for _, kv := range [][2]string{{"core.bare", "false"}, {"core.worktree", r.dir}, {"core.logAllRefUpdates", "true"}} {
		c := gitcmd.Cmd{Dir: r.gitDir, GitDir: r.gitDir, Sub: "config", Args: []string{kv[0], kv[1]}}
		if err := r.git.Run(ctx, c); err != nil {
			return fmt.Errorf("git_dir: set %s: %w", kv[0], err)
		}
	}
	info := filepath.Join(r.gitDir, "info")
	if err := os.MkdirAll(info, 0o755); err != nil {
		return fmt.Errorf("git_dir: %w", err)
	}
	return writeFileAtomic(filepath.Join(info, "attributes"), []byte(attributes), 0o644)
}

// sameWorkspace refuses a git dir that records (core.worktree) another
// workspace: two supervisors must not share one history, and git itself
// would fail with "fatal: Invalid path" on one whose workspace is gone.
// The record is read from the config file alone, outside any repository.
func (r *Repo) sameWorkspace(ctx context.Context) error {
	cfg := filepath.Join(r.gitDir, "config")
	rec, err := r.git.Line(ctx, gitcmd.Cmd{Dir: "/", Sub: "config", Flags: []string{"--file=" + cfg, "--get"}, Args: []string{"core.worktree"}}, gitcmd.MaxLine)
	if gitcmd.ExitCode(err) == 1 || (err == nil && rec == "") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("git_dir: read its workspace: %w", err)
	}
	if filepath.Clean(rec) == filepath.Clean(r.dir) {
		return nil
	}
	if _, err := os.Stat(rec); err == nil {
		return errdefs.FailedPrecondition(errdefs.GitDirUnsafe,
			"git_dir %s holds the history of another workspace, %s: two workspaces cannot share one git_dir (give %s a git_dir of its own)",
			r.gitDir, rec, r.dir).With("path", r.gitDir)
	}
	return errdefs.FailedPrecondition(errdefs.GitDirUnsafe,
		"git_dir %s holds the history of workspace %s, which no longer exists: give %s a git_dir of its own, or, if the workspace moved there, record it as the supervisor's user: git config --file=%s core.worktree %s",
		r.gitDir, rec, r.dir, cfg, r.dir).With("path", r.gitDir)
}

// checkOwnDir refuses a git dir that is a link, or that belongs to or can be
// written by anyone but this process's user: whoever can write it can make
// the supervisor's git run a program.
func checkOwnDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("git_dir: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return errdefs.FailedPrecondition(errdefs.GitDirUnsafe, "git_dir %s is not a directory (a link is refused)", dir).With("path", dir)
	case st == nil || int(st.Uid) != os.Geteuid():
		return errdefs.FailedPrecondition(errdefs.GitDirUnsafe, "git_dir %s belongs to uid %d, not to the supervisor's uid %d", dir, st.Uid, os.Geteuid()).With("path", dir)
	case fi.Mode().Perm()&0o022 != 0:
		return errdefs.FailedPrecondition(errdefs.GitDirUnsafe, "git_dir %s is writable by group or others (mode %v)", dir, fi.Mode().Perm()).With("path", dir)
	}
	return nil
}

// writeFileAtomic replaces path with data (replaceFileAt in its
// directory). The rename replaces a symlink at path rather than writing
// through it.
func writeFileAtomic(path string, data []byte, mode uint32) error {
	dir, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = replaceFileAt(dir, filepath.Base(path), data, mode)
		unix.Close(dir)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ignored reports whether any component of the slash-separated rel matches
// one of the ignore patterns. A nested ".git" is always ignored.
func ignored(rel string, patterns []string) bool {
	return slices.ContainsFunc(strings.Split(rel, "/"), func(part string) bool { return ignoredName(part, patterns) })
}

func ignoredName(name string, patterns []string) bool {
	return name == ".git" || slices.ContainsFunc(patterns, func(p string) bool {
		ok, _ := path.Match(p, name)
		return ok
	})
}

// pathspecs names tree w and excludes, in git's glob magic, every path one
// of whose components matches an ignore pattern. Nothing else in the tree
// can hide from the supervisor: it adds with --force, so no .gitignore,
// exclude file or core.excludesFile counts.
func (r *Repo) pathspecs(w string) []string {
	base := globEscape(w)
	specs := []string{":(top,literal)" + w}
	for _, p := range append([]string{".git"}, r.ignore...) {
		specs = append(specs,
			":(top,exclude,glob)"+base+"/**/"+p,
			":(top,exclude,glob)"+base+"/**/"+p+"/**")
	}
	return specs
}

func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// rev resolves rev to a commit id, or "" if it does not exist.
func (r *Repo) rev(ctx context.Context, rev string) (string, error) {
	out, err := r.git.Line(ctx, r.cmd("rev-parse", []string{"--verify", "-q"}, rev+"^{commit}"), gitcmd.MaxLine)
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
	return r.git.Line(ctx, r.cmd("rev-parse", []string{"--verify", "-q"}, commit+"^{tree}"), gitcmd.MaxLine)
}

// SetGood moves refs/supervisor/good to commit, if it still points at old
// ("" for a ref that must not exist yet).
func (r *Repo) SetGood(ctx context.Context, commit, old string) error {
	old = cmp.Or(old, strings.Repeat("0", len(commit)))
	if err := r.git.Run(ctx, r.cmd("update-ref", nil, GoodRef, commit, old)); err != nil {
		return fmt.Errorf("move %s: %w", GoodRef, err)
	}
	return nil
}

// stage adds every change under the watched trees to the index and returns
// the paths that differ from HEAD (head "" for an unborn branch). A tree
// holding what git would skip without failing (a directory too deep, or
// one the supervisor cannot read) is refused by name, a *BlockedError,
// before git runs; a "could not open directory" git gives anyway is an
// error too, never a silent skip.
func (r *Repo) stage(ctx context.Context, head string) ([]string, error) {
	nested, problems, err := r.scan(ctx)
	if err != nil {
		return nil, err
	}
	if len(problems) > 0 {
		return nil, &BlockedError{Problems: problems}
	}
	for _, w := range r.watch {
		specs := r.pathspecs(w)
		for _, d := range nested {
			if d == w || strings.HasPrefix(d, w+"/") {
				specs = append(specs, ":(top,exclude,literal)"+d)
			}
		}
		warn := &boundedBuffer{limit: 16 << 10}
		c := r.cmd("add", []string{"-A", "--force"}, specs...)
		c.Stderr = warn
		err = r.git.Run(ctx, c)
		if refused := gitRefused(warn.String()); err != nil && len(refused) > 0 {
			return nil, &BlockedError{Problems: refused}
		}
		// An empty tree that was never committed matches nothing: no change.
		if err != nil && !strings.Contains(err.Error(), "did not match any files") {
			return nil, fmt.Errorf("stage %s: %w", w, err)
		}
		skipped, changed := gitSkipped(warn.String())
		if len(skipped) > 0 {
			return nil, &BlockedError{Problems: skipped}
		}
		if changed {
			return nil, fmt.Errorf("stage %s: a directory went while git staged it (the agent at work): tried again", w)
		}
	}
	list := r.cmd("ls-files", []string{"--cached", "-z"})
	if head != "" {
		list = r.cmd("diff-index", []string{"--cached", "--name-only", "--no-renames", "-z"}, head)
	}
	paths, err := r.paths(ctx, list)
	if err != nil {
		return nil, fmt.Errorf("list staged changes: %w", err)
	}
	slices.Sort(paths)
	return paths, nil
}

// paths runs c, which lists paths (-z), and returns them.
func (r *Repo) paths(ctx context.Context, c gitcmd.Cmd) ([]string, error) {
	out, err := r.git.Output(ctx, c, maxPathList)
	return strings.FieldsFunc(string(out), func(c rune) bool { return c == 0 }), err
}

// BlockedError is a watched tree that cannot be recorded as it is: each
// problem names a path and what to do. Commits wait until it is fixed; a
// revert removes what the good commit does not hold.
type BlockedError struct{ Problems []string }

func (e *BlockedError) Error() string {
	msg := "the watched trees cannot be recorded: " + strings.Join(e.Problems, "; ")
	return msg + " (commits wait until this is fixed; a revert removes it)"
}

// gitSkipped picks from git's stderr the directories it skipped without
// failing ("warning: could not open directory 'x/': ..."); one that was
// gone by then (removed while git walked) is a change, not a skip.
func gitSkipped(stderr string) (skipped []string, changed bool) {
	for _, line := range strings.Split(stderr, "\n") {
		switch {
		case !strings.Contains(line, "could not open directory"):
		case strings.HasSuffix(strings.TrimSpace(line), "No such file or directory"):
			changed = true
		default:
			skipped = append(skipped, "git "+strings.TrimPrefix(strings.TrimSpace(line), "warning: "))
		}
	}
	return skipped, changed
}

// gitRefused picks from git's stderr the paths that fail the whole add:
// those it refuses to record at all ("error: invalid path 'x'": git~1 or
// ".git " under core.protectNTFS, a .gitmodules that is a link) and files
// the supervisor cannot read ("error: unable to index file 'x'": a mode or
// an access ACL the agent set).
func gitRefused(stderr string) (refused []string) {
	for _, line := range strings.Split(stderr, "\n") {
		line = strings.TrimSpace(line)
		if len(refused) >= 10 {
			break
		}
		if p, ok := strings.CutPrefix(line, "error: invalid path "); ok {
			refused = append(refused, fmt.Sprintf("%s is a name git refuses to record: rename or remove it", shortPath(p)))
		} else if p, ok := strings.CutPrefix(line, "error: unable to index file "); ok {
			refused = append(refused, fmt.Sprintf("%s cannot be read by the supervisor: the agent must make it readable to its group again (chmod g+r, setfacl -b)", shortPath(p)))
		}
	}
	return refused
}

// boundedBuffer keeps the first limit bytes written to it.
type boundedBuffer struct {
	buf   bytes.Buffer
	limit int
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string { return b.buf.String() }

func (r *Repo) commit(ctx context.Context, who Identity, msg string, allowEmpty bool) (string, error) {
	flags := []string{"-q", "--no-verify", "--cleanup=verbatim", "--message=" + msg}
	if allowEmpty {
		flags = append(flags, "--allow-empty")
	}
	c := r.cmd("commit", flags)
	c.Env = []string{
		"GIT_AUTHOR_NAME=" + who.Name, "GIT_AUTHOR_EMAIL=" + who.Email,
		"GIT_COMMITTER_NAME=" + who.Name, "GIT_COMMITTER_EMAIL=" + who.Email,
	}
	if err := r.git.Run(ctx, c); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return r.Head(ctx)
}

// InitialCommit makes the first commit of the watched trees, authored by
// who, if the branch has none yet. It returns HEAD, and whether that first
// commit adopted files the supervisor has no history of: the watched trees
// held some, and init did not leave word (seededFile) that they are the
// seed it copied this boot. A tree that cannot be recorded whole is left
// out of the first commit (an empty one), to be committed when it can.
func (r *Repo) InitialCommit(ctx context.Context, who Identity) (head string, adopted bool, err error) {
	head, err = r.Head(ctx)
	if err != nil || head != "" {
		return head, false, err
	}
	seeded := filepath.Join(r.gitDir, seededFile)
	_, serr := os.Lstat(seeded)
	paths, err := r.stage(ctx, "")
	var be *BlockedError
	blocked := errors.As(err, &be)
	if blocked {
		// Nothing half-staged goes into it: the index starts empty.
		r.log.Error("the first commit is empty: the watched trees cannot be recorded yet", "err", err)
		if err = r.git.Run(ctx, r.cmd("read-tree", []string{"--empty"})); err != nil {
			return "", false, fmt.Errorf("empty the index: %w", err)
		}
	}
	if err != nil {
		return "", false, err
	}
	head, err = r.commit(ctx, who, "supervisor: initial commit of the watched trees\n", true)
	if err != nil {
		return "", false, err
	}
	os.Remove(seeded)
	return head, (blocked || len(paths) > 0) && serr != nil, nil
}

// CommitPending commits every change under the watched trees as who. It
// returns "" and no paths when the trees match HEAD, which is how the
// supervisor's own resets end up never committed or restarted on.
func (r *Repo) CommitPending(ctx context.Context, who Identity) (string, []string, error) {
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

// RecordedTrailer is the one trailer of an agent's edit commit. It ends the
// message, so the paragraph of paths above it can never be read as trailers.
const RecordedTrailer = "Recorded-by: bushost-supervisor"

// editMessage lists the changed paths, each quoted the way git quotes a path
// (C-style, in double quotes, when it holds a control character, a quote, a
// backslash or a byte above 0x7f), one per line: no file name can add a
// line, a trailer or an identity to the message.
func editMessage(paths []string) string {
	var b strings.Builder
	// Each quoted path is shortened: the message is one argument of
	// git's command line, which exec takes only up to 128 KiB.
	quote := func(p string) string { return shortPath(QuotePath(p)) }
	if len(paths) == 1 {
		fmt.Fprintf(&b, "agent: edit %s\n", quote(paths[0]))
	} else {
		fmt.Fprintf(&b, "agent: edit %s and %d more\n", quote(paths[0]), len(paths)-1)
	}
	b.WriteString("\nRecorded by the supervisor after the debounce.\n\n")
	for i, p := range paths {
		if i == 50 {
			fmt.Fprintf(&b, "... and %d more\n", len(paths)-50)
			break
		}
		fmt.Fprintf(&b, "  %s\n", quote(p))
	}
	b.WriteString("\n" + RecordedTrailer + "\n")
	return b.String()
}

// QuotePath quotes p as git's quote_c_style does with core.quotePath on:
// unchanged if it needs nothing, else in double quotes with \a \b \t \n
// \v \f \r \" \\ and three-digit octal for other control bytes and every
// byte above 0x7f.
func QuotePath(p string) string {
	// A byte above 0x7f is in a rune above it, or makes an invalid one
	// (utf8.RuneError, above it too).
	if !strings.ContainsFunc(p, func(c rune) bool { return c < 0x20 || c == '"' || c == '\\' || c >= 0x7f }) {
		return p
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		c := p[i]
		// The bytes with a letter escape, and their letters.
		switch j := strings.IndexByte("\a\b\t\n\v\f\r\"\\", c); {
		case j >= 0:
			b.WriteByte('\\')
			b.WriteByte(`abtnvfr"\`[j])
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
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
	_, _, pendingErr := r.CommitPending(ctx, agent)
	if pendingErr != nil {
		// A file the agent made unreadable, or one changing under git,
		// must not keep the trees from going back: the revert goes on,
		// and the log says what history missed.
		r.log.Warn("revert: pending edits could not be recorded; reverting anyway", "err", pendingErr)
	}
	if from, err = r.Head(ctx); err != nil {
		return "", "", fmt.Errorf("revert: %w", err)
	}
	if pendingErr == nil {
		if same, err := r.sameAsGood(ctx, from, good); err != nil {
			return from, "", fmt.Errorf("revert: %w", err)
		} else if same {
			return from, "", ErrNothingToRevert
		}
	}
	if err := r.git.Run(ctx, r.cmd("read-tree", []string{"-u", "--reset"}, good)); err != nil {
		return from, "", fmt.Errorf("revert: reset to %s: %w", short(good), err)
	}
	if _, err := r.removeUntracked(ctx, good, false); err != nil {
		return from, "", fmt.Errorf("revert: %w", err)
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

// ErrNothingToRevert is a revert asked for while the watched trees are
// already the good commit, all recorded and nothing else in them: what
// fails is outside the agent's edits, and a revert would change nothing.
var ErrNothingToRevert = errors.New("nothing to revert: the watched trees are the good commit; the failure is outside the agent's edits")

// sameAsGood reports whether head has good's tree and the watched trees
// hold nothing good does not (no ignored file, no nested repository).
func (r *Repo) sameAsGood(ctx context.Context, head, good string) (bool, error) {
	a, err := r.Tree(ctx, head)
	if err != nil {
		return false, err
	}
	b, err := r.Tree(ctx, good)
	if err != nil || a != b {
		return false, err
	}
	extra, err := r.removeUntracked(ctx, good, true)
	return len(extra) == 0, err
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// removeUntracked makes the watched trees hold exactly the files of commit:
// after read-tree has put the tracked files back, whatever else is there
// (ignored files, a nested repository, an implant) is removed, at any
// depth. The walk goes through descriptors (walkTree), so a link the agent
// plants mid-walk is removed as a link and never followed. With dryRun it
// only lists what it would remove (at most a few).
func (r *Repo) removeUntracked(ctx context.Context, commit string, dryRun bool) ([]string, error) {
	args := append([]string{commit, "--"}, r.watch...)
	names, err := r.paths(ctx, r.cmd("ls-tree", []string{"-r", "-z", "--name-only", "--full-tree"}, args...))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", short(commit), err)
	}
	files, dirs := map[string]bool{}, map[string]bool{}
	for _, name := range names {
		files[name] = true
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	ws, err := unix.Open(r.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the workspace: %w", err)
	}
	defer unix.Close(ws)
	var found, failed []string
	for _, w := range r.watch {
		root, err := safepath.OpenBeneath(ws, w, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return nil, fmt.Errorf("open watched tree %s: %w", w, err)
		}
		err = walkTree(root, walkFuncs{
			visit: func(dirfd int, rel, name string, st *unix.Stat_t, _ int) (bool, error) {
				full := path.Join(w, rel)
				isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
				switch {
				case isDir && dirs[full]:
					return true, nil
				case files[full]:
					// A file of the commit, or a submodule entry git keeps
					// as a directory.
					return false, nil
				}
				if dryRun {
					if len(found) < 10 {
						found = append(found, full)
					}
					return false, nil
				}
				if err := removeAllAt(dirfd, full, name); err != nil {
					r.log.Warn("revert: cannot remove an untracked path", "path", shortPath(full), "err", err)
					failed = append(failed, err.Error())
				}
				return false, nil
			},
			dirErr: func(rel string, err error) error {
				failed = append(failed, fmt.Sprintf("%s: %v", shortPath(path.Join(w, rel)), err))
				return nil
			},
		})
		unix.Close(root)
		if err != nil {
			return nil, fmt.Errorf("walk %s: %w", w, err)
		}
	}
	if len(failed) > 0 {
		return nil, fmt.Errorf("could not remove %d untracked path(s) from the watched trees, first %s", len(failed), shortPath(failed[0]))
	}
	return found, nil
}

// shortPath shortens a path too long to read in a log line or a message,
// keeping its start and its end.
func shortPath(p string) string {
	if len(p) <= 200 {
		return p
	}
	return p[:120] + "/.../" + p[len(p)-60:]
}

// maxFileSize and maxTreeBytes bound what git is asked to read at a
// commit: a sparse file costs the agent nothing whatever its size, and
// git reads every byte of it while the supervisor waits (its health
// answers included). A larger file, or watched trees holding more in all
// (apparent sizes, ignored names left out), block commits by name.
const (
	maxFileSize  = 100 << 20
	maxTreeBytes = 1 << 30
)

// maxTreeEntries bounds the files, links and directories of the watched
// trees (ignored names left out): a hard link costs the agent no inode,
// and git holds an index entry for each name at every commit.
const maxTreeEntries = 100000

// maxNested bounds the repositories in the watched trees that a commit
// leaves out: each is an exclude pathspec on git's command line, and
// thousands are more than exec takes.
const maxNested = 64

// scan walks the watched trees before git stages them. It lists the
// directories that hold a .git and that git does not track yet: git would
// refuse to add them (a repository with no commit fails the whole add) or
// record them as a gitlink; so they are left out of the commit, said
// loudly, and a revert removes them with everything else the good commit
// does not hold. And it lists the problems that keep a tree from being
// recorded whole: a directory more than maxTreeDepth below its tree, one
// the supervisor cannot read (a mode or an ACL the agent set), a file
// larger than maxFileSize, a path past PATH_MAX, more than maxTreeBytes
// of files or maxTreeEntries entries in all, or more than maxNested
// repositories.
// Ignored directories are not entered, as git does not enter them.
func (r *Repo) scan(ctx context.Context) (nested, problems []string, err error) {
	files, err := r.paths(ctx, r.cmd("ls-files", []string{"--cached", "-z"}))
	if err != nil {
		return nil, nil, fmt.Errorf("list tracked files: %w", err)
	}
	tracked := map[string]bool{}
	for _, p := range files {
		for d := path.Dir(p); d != "." && d != "/" && !tracked[d]; d = path.Dir(d) {
			tracked[d] = true
		}
	}
	ws, err := unix.Open(r.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open the workspace: %w", err)
	}
	defer unix.Close(ws)
	const maxProblems = 10
	problem := func(p string) {
		if len(problems) < maxProblems {
			problems = append(problems, p)
		}
	}
	hasGit := func(dirfd int, name string) bool {
		var st unix.Stat_t
		return unix.Fstatat(dirfd, name+"/.git", &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	}
	var total int64
	entries, nestedSeen := 0, 0
	for _, w := range r.watch {
		root, err := safepath.OpenBeneath(ws, w, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			problem(fmt.Sprintf("%s cannot be opened by the supervisor (%v)", w, err))
			continue
		}
		if hasGit(root, ".") && !tracked[w] {
			nestedSeen++
			nested = append(nested, w)
			unix.Close(root)
			continue
		}
		err = walkTree(root, walkFuncs{
			visit: func(dirfd int, rel, name string, st *unix.Stat_t, depth int) (bool, error) {
				if ignoredName(name, r.ignore) {
					return false, nil
				}
				entries++
				full := path.Join(w, rel)
				if len(full) >= unix.PathMax {
					// git reaches each path from the workspace root, and
					// fails the whole add on one it cannot stat.
					problem(fmt.Sprintf("%s is a path longer than %d bytes, which git cannot reach: move it higher or shorten its names", QuotePath(shortPath(full)), unix.PathMax-1))
					return false, nil
				}
				if st.Mode&unix.S_IFMT == unix.S_IFREG {
					total += st.Size
					if st.Size > maxFileSize {
						problem(fmt.Sprintf("%s is %d bytes, more than the %d a file may hold to be recorded: remove it or add its name to ignore", QuotePath(shortPath(full)), st.Size, int64(maxFileSize)))
					}
					return false, nil
				}
				if st.Mode&unix.S_IFMT != unix.S_IFDIR {
					return false, nil
				}
				if depth > maxTreeDepth {
					problem(fmt.Sprintf("%s is more than %d directories below %s: remove it or move it higher", QuotePath(shortPath(full)), maxTreeDepth, w))
					return false, nil
				}
				if !tracked[full] && hasGit(dirfd, name) {
					nestedSeen++
					if nestedSeen <= maxNested {
						nested = append(nested, full)
					}
					return false, nil
				}
				return true, nil
			},
			dirErr: func(rel string, err error) error {
				if errors.Is(err, unix.ENOENT) {
					// Removed while the walk went on: nothing to record.
					return nil
				}
				problem(fmt.Sprintf("%s cannot be read by the supervisor (%v): the agent must make it readable to its group again (chmod g+rx, setfacl -b)", QuotePath(shortPath(path.Join(w, rel))), err))
				return nil
			},
		})
		unix.Close(root)
		if err != nil {
			return nil, nil, fmt.Errorf("walk %s: %w", w, err)
		}
	}
	if nestedSeen > maxNested {
		problem(fmt.Sprintf("the watched trees hold %d repositories (the first %s), more than the %d left out of commits one by one: remove them", nestedSeen, QuotePath(shortPath(nested[0])), maxNested))
	}
	if entries > maxTreeEntries {
		problem(fmt.Sprintf("the watched trees hold %d files and directories, more than the %d entries that are recorded: remove what is not source, or add its name to ignore", entries, maxTreeEntries))
	}
	if total > maxTreeBytes {
		problem(fmt.Sprintf("the watched trees hold %d bytes of files, more than the %d that are recorded: remove what is not source, or add its name to ignore", total, int64(maxTreeBytes)))
	}
	for _, d := range nested {
		r.log.Warn("a nested repository in a watched tree is not recorded; a revert removes it", "dir", QuotePath(d))
	}
	return nested, problems, nil
}
