// Package gitd is the git service of the bus host: the repository store (per
// business/project under ReposDir, a pool holding main and one repository
// per task whose alternate is the pool; repository.go), seeding and syncing
// main from a project's root, the ingestion of pushed bundles into
// refs/work/<task>, the bundles handed to workers and reviewers, a
// project's export and import when it moves to another host (move.go),
// and the GitService gRPC server.
//
// Its types, one job each: server (server.go) is the gRPC surface, which
// parses names and authorizes; Service holds the options and the broker
// and runs each operation's steps that ask the broker; store (store.go)
// makes each repo, holds the limits and the memory of tree sizes, and
// keeps, per project, the one *project that owns its lock, task locks,
// quota reservation, cached size and undone counts; a repo reads,
// bundles and imports a repository and moves its refs, and a view reads
// its objects; a write is a transaction with one deferred Rollback
// (writeTx for a push, a landing and a sync, which checks its own push;
// importTx; exportTx); the housekeeper runs housekeeping.
//
// What must hold: nothing reaches a repository before git's fsck passed it
// in quarantine; a task's repository reads only itself and its pool, never
// another task's objects; refs move only through repo.UpdateRef (git's
// lock-file protocol against their old value, refs.go) under the project's
// lock, or for a push under its task's (store.go), and only after the
// broker recorded the push; a refused push leaves no ref, no
// object, no repository and no temp file. Every git process runs through
// internal/gitcmd; go-git only reads.
package gitd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/testhook"
)

// MainRef is the branch every project's work starts from.
const MainRef = "refs/heads/main"

// Options configure a Service.
type Options struct {
	ReposDir  string // <home>/repos
	GitHome   string // private HOME for git processes (gitcmd.New(GitHome))
	Authority authz.Authority
	// Limits bound what a push may send and store (internal/limits). The
	// service reads MaxBundleBytes, IdleTimeout (a push stream that sends
	// nothing this long is cut), PushTimeout and MinPushRate after
	// PushRateGrace (0: none), the object bounds, checked on every pushed
	// pack as it streams in before git reads the object (bundle.Limits),
	// and the quotas, checked before a push's objects leave quarantine.
	// Zero: the defaults, but for PushTimeout and MinPushRate.
	limits.Limits
	// Logger receives the service's log; nil -> slog's default. bushostd
	// passes its own, so --log-level and --log-format hold here too.
	Logger *slog.Logger
	// Committer is "NAME <EMAIL>" of the merge commits `task land --merge`
	// makes; "" -> DefaultCommitter.
	Committer string
	// MergeTimeout bounds the merge of `task land --merge` (0 ->
	// DefaultMergeTimeout); MergeRenameLimit is its merge.renameLimit, the
	// most files among which git looks for inexact renames (0 ->
	// DefaultMergeRenameLimit).
	MergeTimeout     time.Duration
	MergeRenameLimit int
	// Housekeeping queues a repository after each push and landing for
	// the background housekeeping (housekeeping.go) that StartHousekeeping
	// runs; off, only OptimizeProject housekeeps.
	Housekeeping bool
}

// Service runs the operations on the store (a push, a landing, a move...):
// the GitService server (server.go) calls it with names already parsed,
// and it asks the broker (Options.Authority), the store for repos, and
// those for their locks, transactions, reads and ref moves.
type Service struct {
	o   Options
	git *gitcmd.Runner
	log *slog.Logger

	// store makes the repos of ReposDir and keeps what each project's
	// repos share in this process (store.go).
	store *store
	hk    *housekeeper
	// skip is what a test's build turned off (the zero value in service).
	skip testhook.Skips
}

// New checks o and prepares ReposDir. It removes what a killed process may
// have left in the store (quarantine and seeding directories): it must be
// called before the service takes calls, while no other process ingests
// into the same store (bushostd holds its home's lock). It first migrates
// repositories of the one-repository layout (migrate.go).
func New(o Options) (*Service, error) {
	if o.ReposDir == "" {
		return nil, errors.New("gitd: ReposDir is required")
	}
	if o.Authority == nil {
		return nil, errors.New("gitd: Authority is required")
	}
	if o.MaxBundleBytes <= 0 {
		o.MaxBundleBytes = limits.DefaultMaxBundleBytes
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = limits.DefaultIdleTimeout
	}
	o.Objects.Fill()
	o.Quotas.Fill()
	if o.MaxTreeDepth > MaxTreeDepthBound {
		return nil, fmt.Errorf("gitd: MaxTreeDepth %d is over %d", o.MaxTreeDepth, MaxTreeDepthBound)
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
	// A git of ours must not outlive a killed daemon: a repack or ref
	// move left running would race the restarted daemon's Reconcile.
	g = g.WithParentDeath()
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Service{o: o, git: g, log: log.With("service", "gitd"), skip: testhook.Skipped()}
	s.store = &store{dir: dir, git: g, log: s.log, limits: &s.o.Limits, projects: map[string]*project{}}
	s.hk = &housekeeper{s: s, auto: o.Housekeeping, queued: map[string]bool{}, wake: make(chan struct{}, 1)}
	if err := s.store.migrate(context.Background()); err != nil {
		return nil, fmt.Errorf("gitd: migrate the store to a pool and a repository per task: %w", err)
	}
	if err := s.store.cleanStale(); err != nil {
		return nil, fmt.Errorf("gitd: clean stale files: %w", err)
	}
	return s, nil
}

// seedPrefix starts the name of a repository being seeded, beside the
// final one; no valid project or task name starts with '.'.
const seedPrefix = ".seeding-"

// cleanStale removes seeding directories and quarantines left by a killed
// process: in the store (an import's staging), in each business (a
// project's seeding; an export's spool is settleExports'), in the pools
// and in the task repositories.
func (st *store) cleanStale() error {
	if err := removeSeeding(st.dir); err != nil {
		return err
	}
	bs, err := os.ReadDir(st.dir)
	if err != nil {
		return err
	}
	for _, b := range bs {
		if !b.IsDir() {
			continue
		}
		if err := removeSeeding(filepath.Join(st.dir, b.Name())); err != nil {
			return err
		}
	}
	rs, err := st.repos()
	if err != nil {
		return err
	}
	for _, r := range rs {
		if err := removeSeeding(filepath.Join(r.Dir, tasksDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := bundle.CleanStale(r.objects()); err != nil {
			return err
		}
		ts, err := r.tasks()
		if err != nil {
			return err
		}
		for _, t := range ts {
			if err := bundle.CleanStale(t.objects()); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// removeSeeding removes the seeding directories in dir.
func removeSeeding(dir string) error {
	return bundle.RemoveEntries(dir, func(p os.DirEntry) bool {
		// An export's spool stays until settleExports has cancelled it.
		return strings.HasPrefix(p.Name(), seedPrefix) && !strings.HasPrefix(p.Name(), exportSpoolPrefix)
	})
}
