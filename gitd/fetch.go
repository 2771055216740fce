package gitd

import (
	"context"
	"fmt"
	"io"

	git "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/names"
)

// MaxChunk is the largest bundle chunk a stream message carries.
const MaxChunk = 1 << 20

// refToSend opens business/project for a fetch and resolves ref, which
// must exist (else NotFound with reason, saying missing).
func (s *Service) refToSend(business, project, ref string, reason errdefs.Reason, missing string) (repo, *git.Repository, string, error) {
	r, err := s.repo(business, project)
	if err != nil {
		return repo{}, nil, "", err
	}
	if !r.exists() {
		return repo{}, nil, "", projectNotFound(business, project)
	}
	gg, err := open(r)
	if err != nil {
		return repo{}, nil, "", err
	}
	commit, err := readRef(gg, ref)
	if err != nil {
		return repo{}, nil, "", err
	}
	if commit == "" {
		return repo{}, nil, "", errdefs.NotFound(reason, "%s/%s %s", business, project, missing)
	}
	return r, gg, commit, nil
}

// WriteMainBundle writes a bundle of business/project's main (one ref,
// refs/heads/main, full history) to w, calling begin with main's commit
// before the first byte.
func (s *Service) WriteMainBundle(ctx context.Context, business, project string, begin func(commit string) error, w io.Writer) error {
	r, _, commit, err := s.refToSend(business, project, MainRef, errdefs.MainNotFound, "has no main")
	if err != nil {
		return err
	}
	if err := begin(commit); err != nil {
		return err
	}
	return s.bundle(ctx, r, w, MainRef)
}

// WriteReviewBundle writes a bundle of task's latest push (one ref,
// refs/work/<task>) to w, thin against have (a commit the reviewer holds,
// "" for none), calling begin with the push's commit before the first byte.
func (s *Service) WriteReviewBundle(ctx context.Context, business, project, task, have string, begin func(commit string) error, w io.Writer) error {
	ref, err := names.WorkRef(task)
	if err != nil {
		return errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err).Wrap(err)
	}
	r, gg, commit, err := s.refToSend(business, project, ref, errdefs.PushNotFound, "task "+task+" has no push yet")
	if err != nil {
		return err
	}
	args := []string{ref}
	if have != "" {
		if !bundle.ValidOID(have) {
			return errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "have %q is not a full object id", have)
		}
		hc, err := object.GetCommit(gg.Storer, plumbing.NewHash(have))
		if err != nil {
			return errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "have %s is not a commit of %s/%s", have, business, project).With("have", have)
		}
		wc, err := object.GetCommit(gg.Storer, plumbing.NewHash(commit))
		if err != nil {
			return err
		}
		// A push that have already contains would make an empty bundle,
		// which git refuses: send it whole instead.
		contained, err := wc.IsAncestor(hc)
		if err != nil {
			return err
		}
		if !contained {
			args = append(args, "^"+have)
		}
	}
	if err := begin(commit); err != nil {
		return err
	}
	return s.bundle(ctx, r, w, args...)
}

func (s *Service) bundle(ctx context.Context, r repo, w io.Writer, revs ...string) error {
	err := s.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "bundle",
		Flags: []string{"create", "--quiet", "--version=2"}, Args: append([]string{"-"}, revs...), Stdout: w})
	if err != nil {
		return fmt.Errorf("bundle %s: %w", r.Path, err)
	}
	return nil
}
