// Package gitd is the git service of the bus host: the repository store (one
// bare repository per business/project under ReposDir), seeding and syncing
// main from a project's root, the ingestion of pushed bundles into
// refs/work/<task>, the bundles handed to workers and reviewers, and the
// GitService gRPC server.
//
// What must hold: nothing reaches a repository before git's fsck passed it
// in quarantine; refs move only with `git update-ref` against their old
// value under the repository's lock, and only after the broker recorded the
// push; a refused push leaves no ref, no object and no temp file. Every git
// process runs through internal/gitcmd; go-git only reads.
package gitd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/gofrs/flock"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/safepath"
)

// Defaults for zero Options fields.
const (
	DefaultMaxBundleBytes  = 256 << 20
	DefaultIdleTimeout     = 30 * time.Second
	DefaultMaxObjectBytes  = 100 << 20
	DefaultMaxCommitBytes  = 1 << 20
	DefaultMaxTreeBytes    = 16 << 20
	DefaultMaxPackObjects  = 1 << 20
	DefaultMaxTaskBytes    = 1 << 30
	DefaultMaxProjectBytes = 10 << 30
)

// MainRef is the branch every project's work starts from.
const MainRef = "refs/heads/main"

// Options configure a Service.
type Options struct {
	ReposDir       string        // <home>/repos
	GitHome        string        // private HOME for git processes (gitcmd.New(GitHome))
	MaxBundleBytes int64         // 0 -> 256 MiB
	IdleTimeout    time.Duration // a push stream that sends nothing this long is cut; 0 -> 30s
	PushTimeout    time.Duration // a whole push ends within it; 0 -> none
	MinPushRate    int64         // bytes/s a push must average once PushRateGrace old; 0 -> none
	PushRateGrace  time.Duration
	Authority      authz.Authority
	// Committer is "NAME <EMAIL>" of the merge commits `task land --merge`
	// makes; "" -> DefaultCommitter.
	Committer string

	// Object bounds, checked on every pushed pack as it streams in, before
	// git reads the object (see bundle.Limits). 0 -> the defaults.
	MaxObjectBytes int64 // a blob; 100 MiB
	MaxCommitBytes int64 // a commit or a tag; 1 MiB
	MaxTreeBytes   int64 // a tree; 16 MiB
	MaxPackObjects int64 // the objects of one pushed pack; 1,048,576
	// NoObjectChecks turns the streaming object checks off: for the
	// benchmark that measures their cost, never in service.
	NoObjectChecks bool

	// Quotas on what pushes may store: a task's accepted packs (1 GiB), a
	// project's repository (10 GiB). A push past one is refused before its
	// objects leave quarantine. 0 -> the defaults.
	MaxTaskBytes    int64
	MaxProjectBytes int64
	// SkipBeyondGit turns off the beyond-git walk (beyondgit.go). Only the
	// benchmark sets it, to measure what the walk costs.
	SkipBeyondGit bool
}

// Service owns the repositories under Options.ReposDir.
type Service struct {
	o   Options
	git *gitcmd.Runner
	log *slog.Logger

	mu    sync.Mutex
	locks map[string]chan struct{} // per repository, in this process
	// usage caches each repository's object bytes (under its lock), so
	// that a push's project quota check does not walk the objects.
	usage map[string]int64
}

// New checks o and prepares ReposDir. It removes what a killed process may
// have left in the store (quarantine and seeding directories): it must be
// called before the service takes calls, while no other process ingests
// into the same store (bushostd holds its home's lock).
func New(o Options) (*Service, error) {
	if o.ReposDir == "" {
		return nil, errors.New("gitd: ReposDir is required")
	}
	if o.Authority == nil {
		return nil, errors.New("gitd: Authority is required")
	}
	if o.MaxBundleBytes <= 0 {
		o.MaxBundleBytes = DefaultMaxBundleBytes
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	for _, f := range []struct {
		p   *int64
		def int64
	}{
		{&o.MaxObjectBytes, DefaultMaxObjectBytes}, {&o.MaxCommitBytes, DefaultMaxCommitBytes},
		{&o.MaxTreeBytes, DefaultMaxTreeBytes}, {&o.MaxTaskBytes, DefaultMaxTaskBytes},
		{&o.MaxPackObjects, DefaultMaxPackObjects},
		{&o.MaxProjectBytes, DefaultMaxProjectBytes},
	} {
		if *f.p <= 0 {
			*f.p = f.def
		}
	}
	dir, err := filepath.Abs(o.ReposDir)
	if err != nil {
		return nil, fmt.Errorf("gitd: %w", err)
	}
	o.ReposDir = dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("gitd: %w", err)
	}
	g, err := gitcmd.New(o.GitHome)
	if err != nil {
		return nil, fmt.Errorf("gitd: %w", err)
	}
	s := &Service{o: o, git: g, log: slog.Default().With("service", "gitd"), locks: map[string]chan struct{}{}, usage: map[string]int64{}}
	if err := s.cleanStale(); err != nil {
		return nil, fmt.Errorf("gitd: clean stale files: %w", err)
	}
	return s, nil
}

// repo is one project's repository, its names validated.
type repo struct {
	Business, Project string
	Path              string // the bare repository
	LockPath          string // the flock file beside it
}

// seedPrefix starts the name of a repository being seeded, beside the
// final one; no valid project name starts with '.'.
const seedPrefix = ".seeding-"

func (s *Service) repo(business, project string) (repo, error) {
	p, err := names.RepoPath(s.o.ReposDir, business, project)
	if err != nil {
		return repo{}, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err).Wrap(err)
	}
	// The business and project directories, as they are opened, must be
	// the daemon's (not links, writable by nobody else).
	for _, d := range []string{filepath.Dir(p), p} {
		if err := safepath.IfExists(d, os.Geteuid(), safepath.Dir); err != nil {
			return repo{}, err
		}
	}
	return repo{
		Business: business, Project: project, Path: p,
		LockPath: filepath.Join(s.o.ReposDir, business, project+".flock"),
	}, nil
}

func (r repo) objects() string { return filepath.Join(r.Path, "objects") }

func (r repo) exists() bool {
	fi, err := os.Stat(filepath.Join(r.Path, "objects"))
	return err == nil && fi.IsDir()
}

// lock takes the repository's lock: first among this process's goroutines,
// then the flock on <project>.flock that other processes (a second host on
// shared storage, a backup) take too.
func (s *Service) lock(ctx context.Context, r repo) (func(), error) {
	s.mu.Lock()
	ch, ok := s.locks[r.Path]
	if !ok {
		ch = make(chan struct{}, 1)
		s.locks[r.Path] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if err := os.MkdirAll(filepath.Dir(r.LockPath), 0o700); err != nil {
		<-ch
		return nil, err
	}
	fl := flock.New(r.LockPath)
	ok, err := fl.TryLockContext(ctx, 10*time.Millisecond)
	if err != nil || !ok {
		<-ch
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("lock %s: %w", r.LockPath, err)
	}
	return func() {
		fl.Unlock()
		<-ch
	}, nil
}

// open returns a go-git handle for reads; one per request, since go-git is
// not goroutine-safe and caches pack indexes.
func open(r repo) (*git.Repository, error) {
	return git.PlainOpenWithOptions(r.Path, &git.PlainOpenOptions{})
}

// readRef returns the commit ref points at, or "" if it does not exist.
func readRef(g *git.Repository, ref string) (string, error) {
	rf, err := g.Reference(plumbing.ReferenceName(ref), true)
	if errors.Is(err, plumbing.ErrReferenceNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", ref, err)
	}
	return rf.Hash().String(), nil
}

// repos lists every repository in the store.
func (s *Service) repos() ([]repo, error) {
	var out []repo
	bs, err := os.ReadDir(s.o.ReposDir)
	if err != nil {
		return nil, err
	}
	for _, b := range bs {
		if !b.IsDir() || names.Check("business", b.Name()) != nil {
			continue
		}
		ps, err := os.ReadDir(filepath.Join(s.o.ReposDir, b.Name()))
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			proj, ok := strings.CutSuffix(p.Name(), ".git")
			if !ok || !p.IsDir() || names.Check("project", proj) != nil {
				continue
			}
			r, err := s.repo(b.Name(), proj)
			if err != nil {
				continue
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// cleanStale removes seeding directories and quarantines left by a killed
// process.
func (s *Service) cleanStale() error {
	bs, err := os.ReadDir(s.o.ReposDir)
	if err != nil {
		return err
	}
	for _, b := range bs {
		if !b.IsDir() {
			continue
		}
		dir := filepath.Join(s.o.ReposDir, b.Name())
		ps, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if strings.HasPrefix(p.Name(), seedPrefix) {
				if err := os.RemoveAll(filepath.Join(dir, p.Name())); err != nil {
					return err
				}
			}
		}
	}
	rs, err := s.repos()
	if err != nil {
		return err
	}
	for _, r := range rs {
		if err := bundle.CleanStale(r.objects()); err != nil {
			return err
		}
	}
	return nil
}
