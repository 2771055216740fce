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
	var g caller
	var err error
	if named {
		g, err = sv.authorize(ctx)
	} else {
		g, err = sv.authorize(ctx, authz.CapTaskLand)
	}
	if err != nil {
		return nil, err
	}
	t := g.task
	if !named {
		if g.Host {
			return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "the host names the task: --business, --project and --task")
		}
	} else {
		if t, err = names.ParseTask(req.GetBusiness(), req.GetProject(), req.GetTask()); err != nil {
			return nil, err
		}
		if err := sv.s.o.Authority.CheckPlacement(ctx, t.Business(), t.Project().Name()); err != nil {
			return nil, err
		}
	}
	peer, _ := sock.PeerFromContext(ctx)
	res, err := sv.s.Land(ctx, g.Grant, peer, t, LandOptions{Merge: req.GetMerge(), Force: req.GetForce()})
	if err != nil {
		return nil, err
	}
	return &gitv1.LandTaskResponse{Commit: res.Commit, MainOld: res.MainOld, MainNew: res.MainNew, Merge: res.Merge, Seq: res.Seq}, nil
}

func (sv *server) PublishProject(ctx context.Context, req *gitv1.PublishProjectRequest) (*gitv1.PublishProjectResponse, error) {
	p, err := sv.authorizeHost(ctx, req.GetBusiness(), req.GetProject())
	if err != nil {
		return nil, err
	}
	branch := req.GetBranch()
	if branch == "" {
		branch = DefaultPublishBranch
	}
	commit, previous, err := sv.s.PublishProject(ctx, p, branch, req.GetForce())
	if err != nil {
		return nil, err
	}
	return &gitv1.PublishProjectResponse{Commit: commit, Previous: previous, Branch: branch}, nil
}

// FetchWork gives a worker its task's latest push back (a lost clone), the
// bundle FetchReview sends a reviewer.
func (sv *server) FetchWork(req *gitv1.FetchWorkRequest, stream grpc.ServerStreamingServer[gitv1.FetchWorkResponse]) error {
	return sendPush(sv, stream, authz.CapPushWorking, req.GetHave(), req.GetAlsoHave(), func(c string) *gitv1.FetchWorkResponse {
		return &gitv1.FetchWorkResponse{Msg: &gitv1.FetchWorkResponse_Commit{Commit: c}}
	}, func(b []byte) *gitv1.FetchWorkResponse {
		return &gitv1.FetchWorkResponse{Msg: &gitv1.FetchWorkResponse_Chunk{Chunk: b}}
	})
}
