package gitd

import (
	"context"
	"fmt"
	"io"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
)

// MaxChunk is the largest bundle chunk a stream message carries.
const MaxChunk = 1 << 20

// refToSend opens r (a pool or a task's repository) for a fetch and
// resolves ref, which must exist (else NotFound with reason, saying
// missing).
func (r repo) refToSend(ref string, reason errdefs.Reason, missing string) (*view, string, error) {
	if !r.pool().exists() {
		return nil, "", projectNotFound(r.proj)
	}
	gg := r.open()
	commit, err := r.readRef(ref)
	if err != nil {
		return nil, "", err
	}
	if commit == "" {
		return nil, "", errdefs.NotFound(reason, "%s/%s %s", r.Business, r.Project, missing)
	}
	return gg, commit, nil
}

// WriteMainBundle writes a bundle of business/project's main (one ref,
// refs/heads/main, full history) to w, calling begin with main's commit
// before the first byte.
func (s *Service) WriteMainBundle(ctx context.Context, p names.Project, have string, begin func(commit string) error, w io.Writer) error {
	r, err := s.store.project(p)
	if err != nil {
		return err
	}
	gg, commit, err := r.refToSend(MainRef, errdefs.MainNotFound, "has no main")
	if err != nil {
		return err
	}
	if err := begin(commit); err != nil {
		return err
	}
	if have == commit {
		return nil // the client has main: the commit says so, no bundle
	}
	args := []string{MainRef}
	if have != "" && gitid.Valid(have) {
		// An older main of the client's: only what main gained since.
		// Anything else is sent whole, without a word about why.
		if a := gg.alsoHaves([]string{have}, commit); len(a) == 1 {
			o := &objectReader{repo: gg, limit: alsoHaveWalk}
			if ok, err := o.isAncestor(have, commit); err == nil && ok {
				args = append(args, a...)
			}
		}
	}
	return r.bundle(ctx, w, args...)
}

// MaxAlsoHave bounds the earlier pushes a fetch of a task's push may name
// beside its have.
const MaxAlsoHave = 32

// alsoHaveWalk bounds the commits read to learn whether the push is in an
// also-have's history (a have that holds it would make an empty bundle):
// an also-have that does not settle it within the bound is not used.
const alsoHaveWalk = 64

// WriteReviewBundle writes a bundle of task's latest push (one ref,
// refs/work/<task>) to w, thin against have (a commit the reviewer holds,
// "" for none) and against those of also (earlier pushes the client holds,
// at most MaxAlsoHave) the task's repository holds, calling begin with the
// push's commit before the first byte.
func (s *Service) WriteReviewBundle(ctx context.Context, t names.Task, have string, also []string, begin func(commit string) error, w io.Writer) error {
	if len(also) > MaxAlsoHave {
		return errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "%d also-haves; at most %d", len(also), MaxAlsoHave).With("limit", MaxAlsoHave)
	}
	for _, a := range also {
		if !gitid.Valid(a) {
			return errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "also-have %q is not a full object id", a)
		}
	}
	ref := t.WorkRef()
	r, err := s.store.task(t)
	if err != nil {
		return err
	}
	// The task's repository and the pool are all the fetch sees: a have
	// naming another task's commit is answered as one naming nothing.
	gg, commit, err := r.refToSend(ref, errdefs.PushNotFound, "task "+t.Name()+" has no push yet")
	if err != nil {
		return err
	}
	args := []string{ref}
	if have != "" {
		if !gitid.Valid(have) {
			return errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "have %q is not a full object id", have)
		}
		use, err := gg.haveFits(ctx, have)
		if err != nil {
			return err
		}
		if use {
			// A push that have already contains would make an empty
			// bundle, which git refuses: send it whole instead.
			contained, err := gg.contains(ctx, have, commit)
			if err != nil {
				return err
			}
			if !contained {
				args = append(args, "^"+have)
			}
		}
	}
	args = append(args, gg.alsoHaves(also, commit)...)
	if err := begin(commit); err != nil {
		return err
	}
	return r.bundle(ctx, w, args...)
}

// alsoHaves is the "^have" arguments for those of also that the task's
// repository (or its pool) holds as commits within the commit bound and
// that do not hold commit (which would leave the bundle empty). Any other
// is left out, the same way whether it names another task's commit,
// something else, or nothing: the answer says nothing of them.
func (gg *view) alsoHaves(also []string, commit string) []string {
	var args []string
	seen := map[string]bool{commit: true}
	for _, a := range also {
		if seen[a] {
			continue
		}
		seen[a] = true
		h := plumbing.NewHash(a)
		size, err := gg.EncodedObjectSize(h)
		if err != nil || size > gg.r.st.limits.MaxCommitBytes || size > maxCommitBytes {
			continue
		}
		if obj, err := gg.EncodedObject(plumbing.AnyObject, h); err != nil || obj.Type() != plumbing.CommitObject {
			continue
		}
		if holds, err := heldBy(gg, commit, a, alsoHaveWalk); err != nil || holds {
			continue
		}
		args = append(args, "^"+a)
	}
	return args
}

// heldBy reports whether commit is in a's history, reading at most limit
// commits for each of its two questions. It asks the cheap one first: the
// usual a, an earlier push or main, is in commit's history, which a walk
// down from commit settles in as many steps as commits since a; a commit in
// commit's history other than commit cannot hold it. Only when that fails
// does it walk down from a, whose history (main's, or a push's whole task)
// may be long: asked first, that walk ran into the bound on every history
// longer than it, and the fetch then sent the task's whole history.
func heldBy(gg *view, commit, a string, limit int) (bool, error) {
	if a == commit {
		return true, nil
	}
	if below, err := (&objectReader{repo: gg, limit: limit}).isAncestor(a, commit); err == nil && below {
		return false, nil
	}
	return (&objectReader{repo: gg, limit: limit}).isAncestor(commit, a)
}

// bundle writes a bundle of revs of r to w.
func (r repo) bundle(ctx context.Context, w io.Writer, revs ...string) error {
	err := r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "bundle",
		Flags: []string{"create", "--quiet", "--version=2"}, Args: append([]string{"-"}, revs...), Stdout: w})
	if err != nil {
		return fmt.Errorf("bundle %s: %w", r.Path, err)
	}
	return nil
}

// haveFits checks a reviewer's have, whatever it names, without reading an
// object whole: its size first, from the object's header. A commit within
// --max-commit-bytes is used; a larger one (only the host's seeding can put
// one there: pushes are bounded) is ignored, and the bundle is sent whole,
// so a have costs the daemon no more than any other; anything else is
// refused.
func (gg *view) haveFits(ctx context.Context, have string) (bool, error) {
	r := gg.r
	notCommit := errdefs.InvalidArgument(errdefs.ObjectIDInvalid, "have %s is not a commit of %s/%s", have, r.Business, r.Project).With("have", have)
	h := plumbing.NewHash(have)
	size, err := gg.EncodedObjectSize(h)
	if err != nil {
		return false, notCommit
	}
	if size > r.st.limits.MaxCommitBytes || size > maxCommitBytes {
		typ, err := r.git.Line(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "cat-file", Flags: []string{"-t"}, Args: []string{have}}, gitcmd.MaxLine)
		if err != nil || typ != "commit" {
			return false, notCommit
		}
		r.st.log.Info("have is a commit over --max-commit-bytes; sending the bundle whole", "repo", r.Path, "have", have, "size", size)
		return false, nil
	}
	obj, err := gg.EncodedObject(plumbing.AnyObject, h)
	if err != nil || obj.Type() != plumbing.CommitObject {
		return false, notCommit
	}
	return true, nil
}

// contains reports whether commit is have or one of its ancestors: a
// bounded walk in process (objectReader reads no commit over its bound),
// else git.
func (gg *view) contains(ctx context.Context, have, commit string) (bool, error) {
	ok, err := heldBy(gg, commit, have, walkLimit)
	if err == nil {
		return ok, nil
	}
	return ancestry(gg.r.git.Run(ctx, gitcmd.Cmd{GitDir: gg.r.Path, Sub: "merge-base", Flags: []string{"--is-ancestor"}, Args: []string{commit, have}}))
}
