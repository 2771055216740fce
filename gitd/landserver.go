package gitd

import (
	"context"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
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
		return nil, toStatus(err)
	}
	business, project, task := req.GetBusiness(), req.GetProject(), req.GetTask()
	if !named {
		if g.Host {
			return nil, toStatus(errdefs.InvalidArgument(errdefs.ArgumentInvalid, "the host names the task: --business, --project and --task"))
		}
		business, project, task = g.Business, g.Project, g.Task
	}
	peer, _ := sock.PeerFromContext(ctx)
	res, err := sv.s.Land(ctx, g, peer, business, project, task, req.GetMerge())
	if err != nil {
		return nil, toStatus(err)
	}
	return &gitv1.LandTaskResponse{Commit: res.Commit, MainOld: res.MainOld, MainNew: res.MainNew, Merge: res.Merge, Seq: res.Seq}, nil
}
