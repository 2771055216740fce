package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
)

// The git commands: a worker's push and fetch of main, a reviewer's fetch
// of the latest push, and the host's project add and sync. Every git
// process runs through gitcmd; bundles received from the bus host are
// checked the same way the server checks pushes (header parsed here,
// index-pack --strict in quarantine, connectivity) before any ref moves.

// gitBaseRef is where fetch-main records the server's main in a worker's
// repository; push-working bundles against it.
const gitBaseRef = "refs/remotes/bushost/main"

// gitChunk is the largest piece of a bundle sent in one message.
const gitChunk = 1 << 20

func init() {
	register(&command{
		words: "push-working",
		short: "push the work at HEAD to the task",
		usage: "push-working [--repo DIR] [--bundle FILE]",
		help:  "Push the work at DIR's HEAD (a bundle against the main fetched with fetch-main) to the task's refs/work/<task>, or send FILE as is (a regular file goes as its open descriptor, which the bus host reads); prints the commit pushed.",
		setup: runPushWorking,
	})
	register(&command{
		words: "fetch-main",
		short: "fetch the bus host's main",
		usage: "fetch-main --repo DIR",
		help:  "Set DIR's refs/remotes/bushost/main to the bus host's main, and fast-forward main to it (a diverged main is left, with a message); DIR is made if absent or empty, else must be a repository's top.",
		setup: runFetchMain,
	})
	register(&command{
		words: "fetch-review",
		short: "fetch the task's latest push, to review it",
		usage: "fetch-review --repo DIR",
		help:  "Fetch the task's latest push into DIR's refs/review/<task>, checked as the server checks pushes; prints the commit.",
		setup: runFetchReview,
	})
	register(&command{
		words: "fetch-work",
		short: "fetch the task's latest push, to work on",
		usage: "fetch-work --repo DIR",
		help:  "Fetch the task's latest push into DIR's refs/work/<task> (a worker that lost its clone gets its work back); prints the commit.",
		setup: runFetchWork,
	})
	register(&command{
		words: "project add",
		short: "make a project and seed main from a root",
		usage: "project add --business B --project P --root DIR",
		help:  "Host: make the project's repository and seed main from DIR (a git repository's HEAD, or its files as one commit). Idempotent.",
		setup: runProjectAdd,
	})
	register(&command{
		words: "project sync",
		short: "fast-forward main from the project's root",
		usage: "project sync --business B --project P",
		help:  "Host: fast-forward main from the project's root; anything but a fast-forward is refused.",
		setup: runProjectSync,
	})
}

// gitRunner returns a gitcmd runner with a private HOME that is removed by
// the returned func.
func gitRunner() (*gitcmd.Runner, func(), error) {
	home, err := os.MkdirTemp("", "bushost-git-")
	if err != nil {
		return nil, nil, err
	}
	g, err := gitcmd.New(home)
	if err != nil {
		os.RemoveAll(home)
		return nil, nil, err
	}
	return g, func() { os.RemoveAll(home) }, nil
}

// shortLived sets the garbage collector for a command that runs for
// milliseconds: nothing is collected until the heap nears 64 MiB (a push
// streams through fixed buffers, so it stays under that), which saves a
// small push the three or four collections, and their CPU, it would
// otherwise start. A GOGC or GOMEMLIMIT the caller set is kept, and so is
// a long-lived process's own setting (e.longLived: bushost mcp runs many
// commands in one process, for which a one-shot setting is wrong).
func shortLived(e *Env) {
	if !e.longLived && os.Getenv("GOGC") == "" && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(64 << 20)
	}
}

func runPushWorking(fs *pflag.FlagSet) runFunc {
	repo := fs.String("repo", ".", "the worker's repository")
	file := fs.String("bundle", "", "send this bundle file as is instead of bundling HEAD")
	return func(ctx context.Context, e *Env, args []string) (err error) {
		shortLived(e)
		// A refusal of an object over its limit is completed with the
		// object's id and path, which only this repository knows.
		var base, head string
		defer func() {
			if err != nil && head != "" {
				err = nameTooLarge(ctx, err, *repo, base, head)
			}
		}()
		// The connection comes first: its context (cctx, carrying the
		// token) is for the calls only, and nothing local is started for a
		// bus host that is not there.
		c, cctx, fds, closeConn, err := e.gitClientFD(ctx)
		if err != nil {
			return err
		}
		defer closeConn()
		var body io.Reader
		var header []byte // sent before body
		var size int64
		var wait func() error
		warnNow := func() {}
		if *file != "" {
			f, err := os.Open(*file)
			if err != nil {
				return err
			}
			defer f.Close()
			if res, done, err := pushPassed(cctx, c, fds, f); done {
				if err != nil {
					return err
				}
				return printOut(e, res.GetCommit(), map[string]any{"commit": res.GetCommit(), "previous": res.GetPrevious(), "ref": res.GetRef()})
			}
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			body, size = f, fi.Size()
		} else {
			// git would say only that it could not start ("fork/exec
			// /usr/bin/git: no such file or directory") in a directory
			// that is not there.
			if fi, err := os.Stat(*repo); errors.Is(err, os.ErrNotExist) {
				return usagef("--repo %s: no such directory", *repo)
			} else if err == nil && !fi.IsDir() {
				return usagef("--repo %s: not a directory", *repo)
			}
			g, done, err := gitRunner()
			if err != nil {
				return err
			}
			defer done()
			// pack-objects starts now, beside the cat-file below that names
			// what it packs, so that its start (git's, the repository's
			// config, the pack indexes) is not paid after it; it reads the
			// two commits from revs once they are known. The pack follows
			// the bundle's header (sent first, so that the bus host starts
			// index-pack while pack-objects still works) as git writes it.
			// The goroutine has its own context and is joined before
			// return; a return before revs is written closes it, and
			// pack-objects, given no commit, is cancelled.
			bctx, cancel := context.WithCancel(ctx)
			revs, revsW := io.Pipe()
			pr, pw := io.Pipe()
			errc := make(chan error, 1)
			go func() {
				pc := &packCount{w: pw}
				err := g.Run(bctx, gitcmd.Cmd{Dir: *repo, Sub: "pack-objects", Flags: []string{"--revs", "--thin", "--stdout", "--delta-base-offset", "-q"},
					Stdin: revs, Stdout: pc})
				if pc.empty {
					err = errEmptyPack
				}
				// A pack-objects that never started (or is gone) reads no
				// revs: a write still to come fails instead of blocking.
				revs.CloseWithError(cmp.Or(err, io.ErrClosedPipe))
				pw.CloseWithError(err)
				errc <- err
			}()
			var bundled error
			joined := false
			wait = func() error {
				if !joined {
					bundled, joined = <-errc, true
				}
				return bundled
			}
			defer func() {
				cancel()
				revsW.Close()
				pr.Close()
				wait()
			}()
			body = pr
			// Git finds the repository --repo is in and reads HEAD and the
			// recorded main, as it would for any other command.
			head, base, err = pushHeads(ctx, g, *repo)
			if err != nil {
				return err
			}
			if base == "" {
				if base, err = pushBase(ctx, cctx, g, c, *repo); err != nil {
					return err
				}
			}
			if base == head {
				return errdefs.FailedPrecondition(errdefs.NothingToPush, "HEAD is main's commit %s: commit your work, then push", head).With("commit", head)
			}
			// Its one prerequisite is base: all the pack leaves out is in
			// base's history, which the bus host holds.
			header = bundleHeader(base, head)
			if _, err := io.WriteString(revsW, head+"\n^"+base+"\n"); err != nil {
				return fmt.Errorf("bundle HEAD: %w", cmp.Or(wait(), err))
			}
			revsW.Close()
			// Whether the working tree has changes this push leaves out is
			// found beside the push (its warning printed at the end).
			uncommitted := make(chan int, 1)
			go func() { uncommitted <- countUncommitted(ctx, g, *repo) }()
			warned := false
			defer func() {
				if !warned {
					warnUncommitted(e, *repo, <-uncommitted)
				}
			}()
			warnNow = func() {
				warned = true
				warnUncommitted(e, *repo, <-uncommitted)
			}
		}
		// A push this end gives up on is cancelled, never half-closed: the
		// bus host must not take what was sent as the whole bundle.
		sctx, scancel := context.WithCancel(cctx)
		defer scancel()
		stream, err := c.PushWorking(sctx)
		if err != nil {
			return err
		}
		if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: size}}}); err != nil {
			_, rerr := stream.CloseAndRecv()
			return cmp.Or(rerr, err)
		}
		if header != nil {
			if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: header}}); err != nil {
				_, serr := stream.CloseAndRecv()
				return cmp.Or(serr, err)
			}
		}
		if err, rerr := sendChunks(body, func(b []byte) error {
			return stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: b}})
		}); err != nil {
			// The server ended the call; its status says why.
			_, serr := stream.CloseAndRecv()
			return cmp.Or(serr, err)
		} else if rerr != nil {
			scancel()
			if errors.Is(rerr, errEmptyPack) {
				return nothingNew(head, base)
			}
			return fmt.Errorf("read bundle: %w", rerr)
		}
		if wait != nil {
			if err := wait(); errors.Is(err, errEmptyPack) {
				scancel()
				return nothingNew(head, base)
			} else if err != nil {
				scancel()
				return fmt.Errorf("bundle HEAD: %w", err)
			}
		}
		res, err := stream.CloseAndRecv()
		if err != nil {
			return err
		}
		warnNow()
		return printOut(e, res.GetCommit(), map[string]any{"commit": res.GetCommit(), "previous": res.GetPrevious(), "ref": res.GetRef()})
	}
}

// sendChunks sends what r holds, in pieces of at most gitChunk bytes,
// until it ends; it stops at the first error sending (err) or reading.
func sendChunks(r io.Reader, send func([]byte) error) (err, rerr error) {
	buf := make([]byte, gitChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := send(buf[:n]); err != nil {
				return err, nil
			}
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return nil, nil
		}
		if rerr != nil {
			return nil, rerr
		}
	}
}

// bundleHeader is a version 2 bundle's header for a pack of head's history
// without base's: base its one prerequisite, head the one ref (HEAD).
func bundleHeader(base, head string) []byte {
	return []byte("# v2 git bundle\n-" + base + "\n" + head + " HEAD\n\n")
}

// errEmptyPack is pack-objects' pack of no object: HEAD is in the
// history of the commit the pack leaves out.
var errEmptyPack = errors.New("an empty pack")

// nothingNew refuses a push of a HEAD already in base's history.
func nothingNew(head, base string) error {
	return errdefs.FailedPrecondition(errdefs.NothingToPush, "HEAD %s is in the history of main %s: nothing to push; commit your work, then push", head, base).
		With("commit", head)
}

// packCount passes a pack through to w and notes whether its header says
// it holds no object; it then passes nothing on, and fails the write, so
// that no empty pack is sent.
type packCount struct {
	w     io.Writer
	head  []byte
	empty bool
}

func (p *packCount) Write(b []byte) (int, error) {
	if len(p.head) < 12 {
		n := min(12-len(p.head), len(b))
		p.head = append(p.head, b[:n]...)
		if len(p.head) < 12 {
			return len(b), nil
		}
		if binary.BigEndian.Uint32(p.head[8:12]) == 0 {
			p.empty = true
			return 0, errEmptyPack
		}
		if _, err := p.w.Write(p.head); err != nil {
			return 0, err
		}
		b = b[n:]
		if len(b) == 0 {
			return n, nil
		}
		m, err := p.w.Write(b)
		return n + m, err
	}
	return p.w.Write(b)
}

// pushHeads asks git for the commit HEAD names in the repository repo is
// in and the commit refs/remotes/bushost/main names there ("" when it
// names none): one cat-file for both, which resolves them as every git
// command does (HEAD symbolic or detached, loose refs or packed-refs).
func pushHeads(ctx context.Context, g *gitcmd.Runner, repo string) (head, base string, err error) {
	out, err := g.Output(ctx, gitcmd.Cmd{Dir: repo, Sub: "cat-file", Flags: []string{"--batch-check=%(objectname)"},
		Stdin: strings.NewReader("HEAD^{commit}\n" + gitBaseRef + "^{commit}\n")}, 2*gitcmd.MaxLine)
	lines := strings.Split(string(out), "\n")
	if err == nil && len(lines) >= 2 && gitid.Valid(lines[0]) {
		if gitid.Valid(lines[1]) {
			base = lines[1]
		}
		return lines[0], base, nil
	}
	// git's own words for what HEAD lacks.
	if _, rerr := g.Line(ctx, gitcmd.Cmd{Dir: repo, Sub: "rev-parse", Flags: []string{"--verify"}, Args: []string{"HEAD^{commit}"}}, gitcmd.MaxLine); rerr != nil {
		err = rerr
	}
	if err == nil {
		err = errors.New("git named no commit")
	}
	return "", "", fmt.Errorf("%s has no commit at HEAD: %w", repo, err)
}

// pushBase returns the commit a repository fetch-main did not make is
// bundled against: the bus host's main itself, when repo has it.
func pushBase(ctx, cctx context.Context, g *gitcmd.Runner, c gitv1.GitServiceClient, repo string) (string, error) {
	main, err := serverMain(cctx, c)
	if err != nil {
		return "", err
	}
	if err := g.Run(ctx, gitcmd.Cmd{Dir: repo, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{main + "^{commit}"}}); err != nil {
		return "", errdefs.FailedPrecondition(errdefs.NoBase,
			"%s lacks the bus host's main %s, which a push is bundled against: run 'bushost fetch-main --repo %s', then rebase your work onto its main", repo, main, repo).
			With("main", main)
	}
	return main, nil
}

// serverMain asks the bus host for main's commit: the first message of a
// FetchMain stream, which is then dropped.
func serverMain(ctx context.Context, c gitv1.GitServiceClient) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.FetchMain(ctx, &gitv1.FetchMainRequest{})
	if err != nil {
		return "", err
	}
	first, err := stream.Recv()
	if err != nil {
		return "", err
	}
	return first.GetCommit(), nil
}

// maxStatusBytes bounds the `git status` listing read to count changes.
const maxStatusBytes = 16 << 20

// countUncommitted counts the working tree's changes that a push of HEAD
// leaves out, as `git status` lists them (0 when it cannot say, or the
// repository is bare).
func countUncommitted(ctx context.Context, g *gitcmd.Runner, repo string) int {
	out, err := g.Output(ctx, gitcmd.Cmd{Dir: repo, Sub: "status", Flags: []string{"--porcelain", "-z", "--no-renames"}}, maxStatusBytes)
	if errdefs.ReasonOf(err) == errdefs.GitOutputTooLarge {
		// At least as many as the whole entries read: enough to warn.
		out = out[:bytes.LastIndexByte(out, 0)+1]
	} else if err != nil {
		return 0
	}
	// Each entry ends in a NUL (no renames: one path each).
	return bytes.Count(out, []byte{0})
}

// warnUncommitted says on stderr when the working tree has n changes that
// a push of HEAD leaves out.
func warnUncommitted(e *Env, repo string, n int) {
	if n == 0 {
		return
	}
	fmt.Fprintf(e.Stderr, "bushost push-working: warning: %s has %d uncommitted change(s), not in this push (commit them to push them; 'git status' lists them)\n", repo, n)
}

// gitRepo is a local repository the client writes fetched objects into.
type gitRepo struct {
	dir, gitDir, objects string
	created              bool
}

// baseOf is the commit refs/remotes/bushost/main names in the repository
// dir itself (its top or, bare, its git directory; never a repository
// above it), "" when it has none or git cannot say. One rev-parse says
// where dir is and what the ref names.
func baseOf(ctx context.Context, g *gitcmd.Runner, dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return ""
	}
	out, _ := g.Output(ctx, gitcmd.Cmd{Dir: dir, Sub: "rev-parse", Flags: []string{"--absolute-git-dir", "--is-inside-work-tree", "--show-prefix", "--verify", "--quiet"},
		Args: []string{gitBaseRef}}, 4*gitcmd.MaxLine)
	// The git directory, whether dir is in a work tree, dir's path below
	// its top, the id the ref names (which the repository may lack: the
	// bus host then sends nothing, and the fetch says to remove the ref).
	f := strings.Split(string(out), "\n")
	if len(f) < 4 || !gitid.Valid(f[3]) {
		return ""
	}
	gitDir, _ := filepath.EvalSymlinks(f[0])
	if f[1] == "true" && f[2] == "" || f[1] == "false" && gitDir == abs {
		return f[3]
	}
	return ""
}

// clientPackLimit is how many packs the client's repository may hold
// before a fetch rolls the small ones together. Each fetch adds a pack, and
// every git command reads each pack's index, so without it a reviewer's
// thousandth fetch would be slower than its tenth (git fetch runs `git
// maintenance run --auto` after each fetch for the same reason).
const clientPackLimit = 16

// clientLooseLimit is about how many loose objects (a worker's own commits
// make three each; bundle.LooseEstimate) the client's repository may hold before a fetch packs
// them and brings its commit-graph up to date. Without the graph, fetch-main
// asking where the worker's main stands against the bus host's reads every
// commit the worker made since main, each a loose object to inflate: 12 ms
// at 600 commits.
const clientLooseLimit = 256

// tidy keeps r cheap to read as fetches add to it, as `git gc --auto` does
// with lower limits: once it holds clientPackLimit packs or about
// clientLooseLimit loose objects, it rolls the small packs and the loose
// objects together (a geometric repack of the repository's own objects)
// and writes the new commits into the commit-graph (a split graph: only
// the commits since the last write, merged into older layers as git
// decides). It is best effort: the fetch is done and its ref moved, so a
// failure here costs only speed, and the next fetch tries again.
func (r *gitRepo) tidy(ctx context.Context, g *gitcmd.Runner) {
	packs, err := filepath.Glob(filepath.Join(r.objects, "pack", "pack-*.pack"))
	if err != nil || len(packs) < clientPackLimit && bundle.LooseEstimate(r.objects) < clientLooseLimit {
		return
	}
	if g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "repack", Flags: []string{"-d", "-q", "-l", "--geometric=2"}}) != nil {
		return
	}
	g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "commit-graph", Flags: []string{"write", "--reachable", "--split", "--no-progress"}})
}

// receive reads a bundle from body and brings its objects into r the
// checked way. It returns the bundle's one ref; the caller moves refs.
func (r *gitRepo) receive(ctx context.Context, g *gitcmd.Runner, body io.Reader) (bundle.Ref, error) {
	br := bufio.NewReaderSize(body, 64<<10)
	h, err := bundle.ReadHeader(br)
	if err != nil {
		return bundle.Ref{}, err
	}
	if len(h.Refs) != 1 {
		return bundle.Ref{}, fmt.Errorf("the bus host sent a bundle with %d refs, not one", len(h.Refs))
	}
	for _, p := range h.Prerequisites {
		if err := g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{p + "^{commit}"}}); err != nil {
			return bundle.Ref{}, fmt.Errorf("the bundle needs commit %s, which %s lacks", p, r.dir)
		}
	}
	q, err := bundle.NewQuarantine(r.objects)
	if err != nil {
		return bundle.Ref{}, err
	}
	defer q.Remove()
	if _, err := q.IndexPack(ctx, g, r.gitDir, br); err != nil {
		return bundle.Ref{}, err
	}
	ref := h.Refs[0]
	typ, err := g.Line(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "cat-file", Flags: []string{"-t"}, Args: []string{ref.Commit}, Env: q.Env()}, gitcmd.MaxLine)
	if err != nil || typ != "commit" {
		return bundle.Ref{}, fmt.Errorf("the bundle's ref %s does not name a commit it carries", ref.Name)
	}
	if err := q.Run(ctx, g, gitcmd.Cmd{GitDir: r.gitDir, Sub: "rev-list", Flags: []string{"--objects", "--quiet", "--not", "--all", "--not"}, Args: []string{ref.Commit}}); err != nil {
		return bundle.Ref{}, fmt.Errorf("the bundle's history is incomplete: %w", err)
	}
	if err := q.Migrate(); err != nil {
		return bundle.Ref{}, err
	}
	return ref, nil
}

// chunkReader reads a server stream's chunks after its first message.
type chunkReader struct {
	next func() ([]byte, error)
	buf  []byte
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		b, err := c.next()
		if err != nil {
			return 0, err
		}
		c.buf = b
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func runFetchMain(fs *pflag.FlagSet) runFunc {
	dir := fs.String("repo", "", "the repository to update (made if absent)")
	return func(ctx context.Context, e *Env, args []string) error {
		if *dir == "" {
			return usagef("--repo is required")
		}
		c, ctx, closeConn, err := e.gitClient(ctx)
		if err != nil {
			return err
		}
		defer closeConn()
		g, done, err := gitRunner()
		if err != nil {
			return err
		}
		defer done()
		// main as this repository last fetched it: the server then sends
		// only what main gained since, or nothing.
		have := baseOf(ctx, g, *dir)
		stream, err := c.FetchMain(ctx, &gitv1.FetchMainRequest{Have: have})
		if err != nil {
			return err
		}
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		commit := first.GetCommit()
		r, err := openOrInit(ctx, g, *dir)
		if err != nil {
			return err
		}
		// With main unchanged, a bus host that knows the have sends no
		// bundle; one from before it sends main whole, as always.
		var pending []byte
		bundled := true
		if have != "" && commit == have {
			m, err := stream.Recv()
			switch {
			case errors.Is(err, io.EOF):
				bundled = false
			case err != nil:
				return err
			default:
				pending = m.GetChunk()
			}
		}
		if !bundled {
			if err := g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "cat-file", Flags: []string{"-e"}, Args: []string{commit + "^{commit}"}}); err != nil {
				return fmt.Errorf("%s names %s, which %s lacks: remove that ref and run fetch-main again", gitBaseRef, commit, *dir)
			}
		} else {
			ref, err := r.receive(ctx, g, &chunkReader{buf: pending, next: func() ([]byte, error) {
				m, err := stream.Recv()
				return m.GetChunk(), err
			}})
			if err != nil {
				if r.created {
					os.RemoveAll(*dir)
				}
				return fmt.Errorf("fetch main: %w", err)
			}
			if ref.Commit != commit {
				return fmt.Errorf("main moved while it was fetched (%s, then %s); run fetch-main again", commit, ref.Commit)
			}
		}
		if err := g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "update-ref", Args: []string{gitBaseRef, commit}}); err != nil {
			return err
		}
		if err := r.setMain(ctx, g, commit, e.Stderr); err != nil {
			return err
		}
		r.tidy(ctx, g)
		return printOut(e, commit, map[string]any{"commit": commit, "repo": *dir})
	}
}

func runFetchReview(fs *pflag.FlagSet) runFunc {
	open := func(ctx context.Context, c gitv1.GitServiceClient, have string, also []string) (taskPushRecv, error) {
		return taskPushStream(c.FetchReview(ctx, &gitv1.FetchReviewRequest{Have: have, AlsoHave: also}))
	}
	return fetchTaskPush(fs, "review", "the reviewer's repository (made if absent)", "refs/review/", names.ReviewRef, open)
}

func runFetchWork(fs *pflag.FlagSet) runFunc {
	open := func(ctx context.Context, c gitv1.GitServiceClient, have string, also []string) (taskPushRecv, error) {
		return taskPushStream(c.FetchWork(ctx, &gitv1.FetchWorkRequest{Have: have, AlsoHave: also}))
	}
	return fetchTaskPush(fs, "work", "the worker's repository (made if absent)", "refs/work/", names.WorkRef, open)
}

// taskPushRecv returns the next message of a fetch of a task's push: the
// commit (first message) or a chunk.
type taskPushRecv func() (commit string, chunk []byte, err error)

// taskPushStream reads a FetchReview or FetchWork stream as a taskPushRecv.
func taskPushStream[M interface {
	GetCommit() string
	GetChunk() []byte
}](st interface{ Recv() (M, error) }, err error) (taskPushRecv, error) {
	if err != nil {
		return nil, err
	}
	return func() (string, []byte, error) {
		m, err := st.Recv()
		return m.GetCommit(), m.GetChunk(), err
	}, nil
}

// maxAlsoHave is how many earlier pushes a fetch names beside its have:
// the server's bound (gitd.MaxAlsoHave).
const maxAlsoHave = 32

// fetchTaskPush fetches the task's latest push, checked as the server
// checks pushes, into DIR's ref that refOf names (refs/review/<task> for a
// reviewer, refs/work/<task> for a worker that lost its clone); the refs
// under prefix are the pushes fetched before.
func fetchTaskPush(fs *pflag.FlagSet, what, repoHelp, prefix string, refOf func(string) (string, error),
	open func(context.Context, gitv1.GitServiceClient, string, []string) (taskPushRecv, error)) runFunc {
	dir := fs.String("repo", "", repoHelp)
	return func(ctx context.Context, e *Env, args []string) error {
		if *dir == "" {
			return usagef("--repo is required")
		}
		g, done, err := gitRunner()
		if err != nil {
			return err
		}
		defer done()
		r, err := openOrInit(ctx, g, *dir)
		if err != nil {
			return err
		}
		have := ""
		for _, ref := range []string{gitBaseRef, "refs/heads/main"} {
			if c, err := g.Line(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "rev-parse", Flags: []string{"--verify", "--quiet"}, Args: []string{ref + "^{commit}"}}, gitcmd.MaxLine); err == nil && c != "" {
				have = c
				break
			}
		}
		// The pushes fetched before (of this task, or of others: the
		// server uses those its task holds) make the bundle carry only
		// what is new since.
		var also []string
		if out, err := g.Output(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "for-each-ref",
			Flags: []string{"--count=" + strconv.Itoa(maxAlsoHave), "--sort=-committerdate", "--format=%(objectname)"}, Args: []string{prefix}}, 64*(maxAlsoHave+1)); err == nil {
			also = strings.Fields(string(out))
		}
		c, ctx, closeConn, err := e.gitClient(ctx)
		if err != nil {
			return err
		}
		defer closeConn()
		recv, err := open(ctx, c, have, also)
		if err != nil {
			return err
		}
		commit, _, err := recv()
		if err != nil {
			return err
		}
		ref, err := r.receive(ctx, g, &chunkReader{next: func() ([]byte, error) {
			_, chunk, err := recv()
			return chunk, err
		}})
		if err != nil {
			return fmt.Errorf("fetch %s: %w", what, err)
		}
		if ref.Commit != commit {
			return fmt.Errorf("the push moved while it was fetched (%s, then %s); run fetch-%s again", commit, ref.Commit, what)
		}
		task, ok := strings.CutPrefix(ref.Name, "refs/work/")
		if !ok {
			return fmt.Errorf("the bus host sent %s, not a task's refs/work/<task>", ref.Name)
		}
		reviewRef, err := refOf(task)
		if err != nil {
			return err
		}
		if err := g.Run(ctx, gitcmd.Cmd{GitDir: r.gitDir, Sub: "update-ref", Args: []string{reviewRef, commit}}); err != nil {
			return err
		}
		r.tidy(ctx, g)
		return printOut(e, commit, map[string]any{"commit": commit, "ref": reviewRef, "task": task})
	}
}

func runProjectAdd(fs *pflag.FlagSet) runFunc {
	business := fs.String("business", "", "business name")
	project := fs.String("project", "", "project name")
	root := fs.String("root", "", "directory on the bus host that seeds main")
	return func(ctx context.Context, e *Env, args []string) error {
		if *business == "" || *project == "" || *root == "" {
			return usagef("--business, --project and --root are required")
		}
		abs, err := filepath.Abs(*root)
		if err != nil {
			return err
		}
		return e.gitCall(ctx, callTimeout, func(ctx context.Context, c gitv1.GitServiceClient) error {
			res, err := c.AddProject(ctx, &gitv1.AddProjectRequest{Business: *business, Project: *project, Root: abs})
			if err != nil {
				return err
			}
			text := res.GetCommit()
			if !res.GetCreated() {
				text += " (project existed; main unchanged)"
			}
			return printOut(e, text, map[string]any{"commit": res.GetCommit(), "created": res.GetCreated()})
		})
	}
}

func runProjectSync(fs *pflag.FlagSet) runFunc {
	return hostProjectGit(fs, callTimeout, func(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project string) error {
		res, err := c.SyncProject(ctx, &gitv1.SyncProjectRequest{Business: business, Project: project})
		if err != nil {
			return err
		}
		return printOut(e, res.GetCommit(), map[string]any{"commit": res.GetCommit(), "previous": res.GetPrevious()})
	})
}
