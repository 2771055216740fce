package bundle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
)

// QuarantinePrefix starts the name of every quarantine directory made in a
// repository's objects directory; CleanStale removes leftovers by it.
const QuarantinePrefix = "bushost-incoming-"

// Quarantine is a temporary object directory inside a repository's objects
// directory. git writes the incoming pack there, with the repository's
// objects as an alternate, so nothing reaches the repository before it has
// been checked.
type Quarantine struct {
	// Dir is the quarantine object directory.
	Dir string
	// Limits bound the inflated size of each object IndexPack takes in;
	// zero: none.
	Limits Limits
	// IndexConfig adds -c entries to index-pack (its memory settings).
	IndexConfig []string
	// AlsoSync lists directories Migrate fsyncs with its own (a
	// repository made for this push).
	AlsoSync  []string
	objects   string   // where Migrate links the objects
	alternate string   // the object directory reads see besides Dir
	added     []string // files Migrate linked into objects, in order
	dirs      []string // directories Migrate created
	// wb gets IndexPack's pack to the disk as it is written
	// (writeback.go); Migrate and Remove wait for it.
	wb *writeback
}

// NewQuarantine makes a quarantine under objects (a repository's objects
// directory), reading objects and migrating into it.
func NewQuarantine(objects string) (*Quarantine, error) {
	return NewQuarantineFor(objects, objects, objects)
}

// NewQuarantineFor makes a quarantine under parent (an objects directory on
// the same file system as into) whose git processes read alternate besides
// the quarantine (and, through its info/alternates, what it names), and
// whose Migrate links into into (which must exist by then).
func NewQuarantineFor(parent, into, alternate string) (*Quarantine, error) {
	dir, err := os.MkdirTemp(parent, QuarantinePrefix)
	if err != nil {
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "pack"), 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("quarantine: %w", err)
	}
	return &Quarantine{Dir: dir, objects: into, alternate: alternate}, nil
}

// Env is the environment that makes git write into the quarantine and read
// the repository's objects as well.
func (q *Quarantine) Env() []string {
	return []string{
		"GIT_OBJECT_DIRECTORY=" + q.Dir,
		"GIT_ALTERNATE_OBJECT_DIRECTORIES=" + q.alternate,
		"GIT_QUARANTINE_PATH=" + q.Dir,
	}
}

// FsckError is an object that git's fsck refused. ID is git's message id
// (hasDotgit, zeroPaddedFilemode, gitmodulesUrl, ...).
type FsckError struct {
	ID, Object, Detail string
}

func (e *FsckError) Error() string {
	return fmt.Sprintf("fsck refused object %s: %s: %s", e.Object, e.ID, e.Detail)
}

// Classify names the refusal: FSCK_FAILED, git's message id in metadata
// "fsck_id".
func (e *FsckError) Classify() *errdefs.Error {
	return errdefs.InvalidArgument(errdefs.FsckFailed, "%s", e.Error()).With("fsck_id", e.ID).With("object", e.Object)
}

// PackError is a pack that git could not read: truncated, corrupt, or
// missing a base.
type PackError struct{ Msg string }

func (e *PackError) Error() string { return "bad pack: " + e.Msg }

// Classify names the refusal: PACK_INVALID.
func (e *PackError) Classify() *errdefs.Error {
	return errdefs.InvalidArgument(errdefs.PackInvalid, "%s", e.Error())
}

// ErrNoSpace is a disk that filled up while the pack was written
// (DISK_FULL).
var ErrNoSpace error = noSpace{}

type noSpace struct{}

func (noSpace) Error() string { return "no space left on device" }

func (noSpace) Classify() *errdefs.Error {
	return errdefs.ResourceExhausted(errdefs.DiskFull, "no space left on device")
}

// fsckLineRE is compiled on first use: the client imports this package and
// should not pay for it at every start.
var fsckLineRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?m)^error: object ([0-9a-f]{40}): ([A-Za-z]+): (.*)$`)
})

// IndexPack runs `git index-pack --stdin --strict --fix-thin` on pack (the
// bytes after a bundle header) with gitDir's repository, writing into the
// quarantine. It returns the pack's name hash. With q.Limits set, every
// entry's inflated size is checked before git reads it (see Limits), and a
// refusal is returned as an *errdefs.Error with reason OBJECT_TOO_LARGE.
// The caller checks its own reader's error first: a reader that failed
// shows here as a short pack.
//
// IndexPack ends when git does (ctx cancelled, git's timeout, git failed):
// if the copy into git is still running then, it closes pack when pack is
// an io.Closer, so that a read blocked on it returns, and waits for the
// copy, so that pack is no longer read when IndexPack returns. A pack that
// is no io.Closer must not block forever (a push stream's reads end at its
// idle timeout).
func (q *Quarantine) IndexPack(ctx context.Context, git *gitcmd.Runner, gitDir string, pack io.Reader) (string, error) {
	// index-pack reads its input 4 KiB at a time: through a default 64 KiB
	// pipe, the sender and git take turns waiting for each other. A larger
	// pipe lets the stream run ahead while git works. Its read end goes to
	// git as is, so no copying goroutine of exec's sits in between.
	pr, pw, err := os.Pipe()
	if err != nil {
		return "", fmt.Errorf("index-pack: %w", err)
	}
	growPipe(pw)
	q.waitWriteback() // an earlier IndexPack's, if any
	q.wb = startWriteback(filepath.Join(q.Dir, "pack"))
	var written string // the pack's name, once index-pack wrote it
	defer func() { q.wb.finish(written) }()
	wb := &pokeWriter{dst: pw, w: q.wb, left: writebackEvery}
	copied := make(chan error, 1)
	go func() {
		var err error
		if q.Limits.Enabled() {
			err = scanPack(pack, wb, q.Limits, func(ids []string) (map[string]string, error) {
				return objectTypes(ctx, git, gitDir, q.alternateEnv(), ids)
			})
		} else {
			_, err = io.Copy(wb, pack)
		}
		// git sees the end of its input: all of a good pack, or the part
		// before a refused entry, which it reports as truncated.
		pw.Close()
		copied <- err
	}()
	out, err := git.Output(ctx, gitcmd.Cmd{
		GitDir: gitDir,
		Sub:    "index-pack",
		Flags:  []string{"--stdin", StrictFlag, "--fix-thin"},
		Config: q.IndexConfig,
		Env:    q.Env(),
		Stdin:  pr,
	}, gitcmd.MaxLine) // "pack\t<id>"
	// With git gone, a copy still running fails its next write (EPIPE); one
	// blocked reading pack is released by closing pack.
	pr.Close()
	var cerr error
	select {
	case cerr = <-copied:
	default:
		if c, ok := pack.(io.Closer); ok {
			c.Close()
		}
		cerr = <-copied
	}
	var pe *PackError
	if _, refused := errdefs.As(cerr); (refused || errors.As(cerr, &pe)) && ctx.Err() == nil {
		// The scanner's refusal says more than the short pack git saw
		// (unless the call ended, and the pack with it).
		return "", cerr
	}
	if err != nil {
		return "", classify(err)
	}
	var we *writeError
	if cerr != nil && !errors.Is(cerr, syscall.EPIPE) && !errors.As(cerr, &we) {
		return "", cerr
	}
	if err := trailingBytes(out); err != nil {
		return "", err
	}
	kind, name, ok := strings.Cut(strings.TrimSpace(string(out)), "\t")
	if !ok || kind != "pack" || !gitid.Valid(name) {
		return "", fmt.Errorf("index-pack: unexpected output %q", out)
	}
	written = name
	return name, nil
}

// alternateEnv makes git read only the quarantine's alternate (and what its
// info/alternates names): the objects the pushing repository may see.
func (q *Quarantine) alternateEnv() []string {
	return []string{"GIT_OBJECT_DIRECTORY=" + q.alternate}
}

// objectTypes asks git for the types of ids among the objects env makes
// visible (the quarantine's alternate, not the quarantine): cat-file
// --batch-check, one process for all of them.
func objectTypes(ctx context.Context, git *gitcmd.Runner, gitDir string, env, ids []string) (map[string]string, error) {
	var in strings.Builder
	for _, id := range ids {
		if !gitid.Valid(id) {
			return nil, fmt.Errorf("object id %q", id)
		}
		in.WriteString(id + "\n")
	}
	out, err := git.Output(ctx, gitcmd.Cmd{GitDir: gitDir, Sub: "cat-file", Env: env,
		Flags: []string{"--batch-check=%(objectname) %(objecttype)"}, Stdin: strings.NewReader(in.String())},
		64*(len(ids)+1)) // "<id> <type>" a line
	if err != nil {
		return nil, err
	}
	types := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		id, typ, ok := strings.Cut(line, " ")
		if ok && typ != "missing" {
			types[id] = typ
		}
	}
	return types, nil
}

func classify(err error) error {
	var ge *gitcmd.Error
	if !errors.As(err, &ge) {
		return err
	}
	if m := fsckLineRE().FindStringSubmatch(ge.Stderr); m != nil {
		return &FsckError{Object: m[1], ID: m[2], Detail: strings.TrimSpace(m[3])}
	}
	if strings.Contains(ge.Stderr, "No space left on device") {
		return fmt.Errorf("%w: %v", ErrNoSpace, err)
	}
	if ge.ExitCode > 0 {
		msg := strings.TrimSpace(ge.Stderr)
		msg = strings.ReplaceAll(msg, "fatal: ", "")
		msg = strings.ReplaceAll(msg, "\n", "; ")
		return &PackError{Msg: msg}
	}
	return err
}

// pipeBytes is the pipe buffer asked for IndexPack's input.
const pipeBytes = 1 << 20

// growPipe asks the kernel for a pipeBytes buffer behind w; if it refuses
// (a lower /proc/sys/fs/pipe-max-size), the default pipe still works.
func growPipe(w *os.File) {
	const fSetPipeSz = 1031 // F_SETPIPE_SZ, Linux
	if rc, err := w.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { syscall.Syscall(syscall.SYS_FCNTL, fd, fSetPipeSz, pipeBytes) })
	}
}

// Run runs a git command that reads objects through the quarantine.
func (q *Quarantine) Run(ctx context.Context, git *gitcmd.Runner, c gitcmd.Cmd) error {
	c.Env = append(c.Env, q.Env()...)
	return git.Run(ctx, c)
}

// Migrate links every object file of the quarantine into the repository's
// objects: packs before their indexes, so no reader sees an index without
// its pack. A file already there is left alone and not counted as added.
// On error it undoes what it added.
func (q *Quarantine) Migrate() error {
	var packs, idx []string
	var loose []string
	err := filepath.WalkDir(q.Dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(q.Dir, p)
		base := filepath.Base(rel)
		switch {
		case strings.HasPrefix(base, "tmp_"):
			return nil
		case strings.HasPrefix(rel, "pack"+string(filepath.Separator)) && strings.HasSuffix(base, ".idx"):
			idx = append(idx, rel)
		case strings.HasPrefix(rel, "pack"+string(filepath.Separator)):
			packs = append(packs, rel)
		case len(filepath.Dir(rel)) == 2:
			loose = append(loose, rel)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	sort.Strings(packs)
	sort.Strings(idx)
	touched := map[string]bool{}
	for _, rel := range append(append(loose, packs...), idx...) {
		dst := filepath.Join(q.objects, rel)
		dir := filepath.Dir(dst)
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				q.Rollback()
				return fmt.Errorf("migrate: %w", err)
			}
			q.dirs = append(q.dirs, dir)
		}
		if err := os.Link(filepath.Join(q.Dir, rel), dst); err != nil {
			if errors.Is(err, os.ErrExist) {
				continue
			}
			q.Rollback()
			return fmt.Errorf("migrate: %w", err)
		}
		q.added = append(q.added, dst)
		touched[dir] = true
	}
	// The links, and the files' contents, must survive a crash once a
	// caller records the push: fsynced all at once, so that the
	// filesystem commits them in one journal transaction rather than one
	// each (index-pack may have been told not to fsync: see SyncAll).
	q.waitWriteback()
	paths := append([]string(nil), q.added...)
	for dir := range touched {
		paths = append(paths, dir)
	}
	if err := SyncAll(append(paths, q.AlsoSync...)); err != nil {
		q.Rollback()
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// SyncAll fsyncs files and directories concurrently. On ext4 (and any
// filesystem with a journal that batches), concurrent fsyncs share one
// journal commit: five fsyncs one after another cost five commits, 2-4
// ms each on the development VM; at once, about one.
func SyncAll(paths []string) error {
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, p := range paths {
		wg.Go(func() { errs[i] = Sync(p) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Added lists the files Migrate put into the repository.
func (q *Quarantine) Added() []string { return q.added }

// Rollback removes what Migrate added: indexes first, then packs, then any
// directory it made.
func (q *Quarantine) Rollback() error {
	var first error
	for i := len(q.added) - 1; i >= 0; i-- {
		if err := os.Remove(q.added[i]); err != nil && first == nil {
			first = err
		}
	}
	for i := len(q.dirs) - 1; i >= 0; i-- {
		if err := os.Remove(q.dirs[i]); err != nil && first == nil {
			first = err
		}
	}
	q.added, q.dirs = nil, nil
	return first
}

// Remove deletes the quarantine directory and everything left in it.
func (q *Quarantine) Remove() error {
	q.waitWriteback()
	return os.RemoveAll(q.Dir)
}

// waitWriteback joins IndexPack's writeback, if any.
func (q *Quarantine) waitWriteback() {
	if q.wb != nil {
		q.wb.wait()
	}
}

// CleanStale removes quarantine directories left in objects by a process
// that died; call it only while no ingestion into that repository runs.
func CleanStale(objects string) error {
	return RemoveEntries(objects, func(e os.DirEntry) bool {
		return e.IsDir() && strings.HasPrefix(e.Name(), QuarantinePrefix)
	})
}

// RemoveEntries removes, with all they hold, the entries of dir that
// match.
func RemoveEntries(dir string, match func(os.DirEntry) bool) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if match(e) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// Sync fsyncs the file or directory at path; a directory's, to make the
// links and renames in it durable.
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
