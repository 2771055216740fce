package gitd

import (
	"errors"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
)

// gitd's refusals are *errdefs.Error values made where the cause is known
// (NON_FAST_FORWARD, UNRELATED_HISTORY, BUNDLE_TOO_LARGE, ...). The bundle
// package, which the client shares, keeps its own typed errors; toStatus
// names them here, then hands every error to errdefs.ToGRPC, the one
// mapping to a gRPC status.

// toStatus is the one place where the GitService's errors become statuses.
func toStatus(err error) error {
	return errdefs.ToGRPC(bundleError(err))
}

// bundleError gives the bundle package's typed errors their reasons: a
// malformed header, an object git's fsck refused (its message id in
// metadata "fsck_id"), an unreadable pack, a full disk. Anything else is
// returned as it is.
func bundleError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errdefs.As(err); ok {
		return err
	}
	var fe *bundle.FormatError
	var fsck *bundle.FsckError
	var pe *bundle.PackError
	switch {
	case errors.As(err, &fsck):
		return errdefs.InvalidArgument(errdefs.FsckFailed, "%s", err.Error()).
			With("fsck_id", fsck.ID).With("object", fsck.Object).Wrap(err)
	case errors.As(err, &fe):
		return errdefs.InvalidArgument(errdefs.BundleInvalid, "%s", err.Error()).Wrap(err)
	case errors.As(err, &pe):
		return errdefs.InvalidArgument(errdefs.PackInvalid, "%s", err.Error()).Wrap(err)
	case errors.Is(err, bundle.ErrNoSpace):
		return errdefs.ResourceExhausted(errdefs.DiskFull, "%s", err.Error()).Wrap(err)
	}
	return err
}

// projectNotFound is a business/project whose repository was never added.
func projectNotFound(business, project string) *errdefs.Error {
	return errdefs.NotFound(errdefs.ProjectNotFound, "project %s/%s was never added", business, project).
		With("business", business).With("project", project)
}
