package gitd

import (
	"context"

	"google.golang.org/grpc"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/sock"
)

// LandTask lands a task's approved work: the host names the task; a grant
// with task.land lands its own and may name nothing else.
func (sv *server) LandTask(ctx context.Context, req *gitv1.LandTaskRequest) (*gitv1.LandTaskResponse, error) {
	named := req.GetBusiness() != "" || req.GetProject() != "" || req.GetTask() != ""
	var g authz.Grant
	var err error
	if named {
		g, err = sv.authorize(ctx)
	} else {
		g, err = sv.authorize(ctx, authz.CapTaskLand)
	}
	if err != nil {
		return nil, err
	}
	business, project, task := req.GetBusiness(), req.GetProject(), req.GetTask()
	if !named {
		if g.Host {
			return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "the host names the task: --business, --project and --task")
		}
		business, project, task = g.Business, g.Project, g.Task
	} else if err := sv.s.o.Authority.CheckPlacement(ctx, business, project); err != nil {
		return nil, err
	}
	peer, _ := sock.PeerFromContext(ctx)
	res, err := sv.s.Land(ctx, g, peer, business, project, task, LandOptions{Merge: req.GetMerge(), Force: req.GetForce()})
	if err != nil {
		return nil, err
	}
	return &gitv1.LandTaskResponse{Commit: res.Commit, MainOld: res.MainOld, MainNew: res.MainNew, Merge: res.Merge, Seq: res.Seq}, nil
}

func (sv *server) PublishProject(ctx context.Context, req *gitv1.PublishProjectRequest) (*gitv1.PublishProjectResponse, error) {
	if err := names.CheckScope(names.Scope{Business: req.GetBusiness(), Project: req.GetProject()}); err != nil {
		return nil, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err).Wrap(err)
	}
	if err := sv.authorizeHost(ctx, req.GetBusiness(), req.GetProject()); err != nil {
		return nil, err
	}
	branch := req.GetBranch()
	if branch == "" {
		branch = DefaultPublishBranch
	}
	commit, previous, err := sv.s.PublishProject(ctx, req.GetBusiness(), req.GetProject(), branch, req.GetForce())
	if err != nil {
		return nil, err
	}
	return &gitv1.PublishProjectResponse{Commit: commit, Previous: previous, Branch: branch}, nil
}

// FetchWork gives a worker its task's latest push back (a lost clone), the
// bundle FetchReview sends a reviewer.
func (sv *server) FetchWork(req *gitv1.FetchWorkRequest, stream grpc.ServerStreamingServer[gitv1.FetchWorkResponse]) error {
	ctx := stream.Context()
	g, err := sv.authorize(ctx, authz.CapPushWorking)
	if err != nil {
		return err
	}
	if err := sv.s.notMarked(ctx, g); err != nil {
		return err
	}
	still := sv.stillValid(ctx, g)
	w := newChunkWriter(func(b []byte) error {
		if err := still.check(); err != nil {
			return err
		}
		return stream.Send(&gitv1.FetchWorkResponse{Msg: &gitv1.FetchWorkResponse_Chunk{Chunk: b}})
	})
	begin := func(c string) error {
		return stream.Send(&gitv1.FetchWorkResponse{Msg: &gitv1.FetchWorkResponse_Commit{Commit: c}})
	}
	if err := sv.s.WriteReviewBundle(ctx, g.Business, g.Project, g.Task, req.GetHave(), req.GetAlsoHave(), begin, w); err != nil {
		return still.first(err)
	}
	return still.first(w.Flush())
}
