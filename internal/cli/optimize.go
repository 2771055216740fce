package cli

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
)

func init() {
	register(&command{
		words: "repo optimize",
		short: "housekeep the project's repositories now",
		usage: "repo optimize --business B --project P",
		help: "Host: run housekeeping now on the project's pool and on every task repository (geometric repack, a bitmap and " +
			"commit-graph in the pool, stale temporary files removed; docs/git-service.md, \"Housekeeping\") and print what it did for each.",
		setup: runRepoOptimize,
	})
}

// optimizeTimeout bounds `repo optimize`: a full repack of a large pool
// takes longer than an ordinary call.
const optimizeTimeout = 30 * time.Minute

func runRepoOptimize(fs *pflag.FlagSet) runFunc {
	return hostProjectGit(fs, optimizeTimeout, func(ctx context.Context, e *Env, c gitv1.GitServiceClient, business, project string) error {
		res, err := c.OptimizeProject(ctx, &gitv1.OptimizeProjectRequest{Business: business, Project: project})
		if err != nil {
			return err
		}
		var text strings.Builder
		var repos []map[string]any
		failed := 0
		for _, r := range res.GetRepositories() {
			did := cmp.Or(strings.Join(r.GetActions(), ", "), "nothing needed")
			fmt.Fprintf(&text, "%s: %s (%s); packs %d -> %d, %d ms", r.GetRepository(), r.GetOutcome(), did,
				r.GetPacksBefore(), r.GetPacksAfter(), r.GetDurationMs())
			if r.GetError() != "" {
				failed++
				fmt.Fprintf(&text, ": %s", r.GetError())
			}
			text.WriteString("\n")
			repos = append(repos, map[string]any{"repository": r.GetRepository(), "outcome": r.GetOutcome(),
				"actions": r.GetActions(), "packs_before": r.GetPacksBefore(), "packs_after": r.GetPacksAfter(),
				"duration_ms": r.GetDurationMs(), "error": r.GetError()})
		}
		if err := printOut(e, strings.TrimSuffix(text.String(), "\n"), map[string]any{
			"project": business + "/" + project, "repositories": repos}); err != nil {
			return err
		}
		if failed > 0 {
			return errdefs.Internal(errdefs.HousekeepingFailed, "housekeeping failed on %d of the %d repositories of %s/%s (see above); bushostd's log has the details",
				failed, len(res.GetRepositories()), business, project).With("failed", failed)
		}
		return nil
	})
}
