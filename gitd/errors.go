package gitd

import (
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// gitd's refusals are *errdefs.Error values made where the cause is known
// (NON_FAST_FORWARD, UNRELATED_HISTORY, BUNDLE_TOO_LARGE, ...); the bundle
// package's typed errors name their own (errdefs.Classifier). Handlers
// return them as they are: the server's interceptors (internal/grpcerr)
// send them as statuses.

// projectNotFound is a project whose repository was never added.
func projectNotFound(p names.Project) *errdefs.Error {
	business, project := p.Business(), p.Name()
	return errdefs.NotFound(errdefs.ProjectNotFound, "project %s/%s was never added", business, project).
		With("business", business).With("project", project)
}
