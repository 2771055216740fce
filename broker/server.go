package broker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/sock"
)

// NewServer serves b as BrokerService. Every call resolves its token first;
// a grant's business, project and task come from the grant, never from the
// request. Handlers return errdefs errors as they are; the server's
// interceptors (internal/grpcerr) make them statuses, nowhere else.
func NewServer(b *Broker) brokerv1.BrokerServiceServer {
	return &server{b: b}
}

type server struct {
	brokerv1.UnimplementedBrokerServiceServer
	b *Broker
}

// caller resolves the call's token (see Broker.authorize) and the calling
// process. A halted broker (a log that does not match its checkpoint)
// serves nothing but the host's VerifyLog and LogHead, which go through
// hostCaller.
func (s *server) caller(ctx context.Context, caps ...string) (authz.Grant, string, error) {
	if err := s.b.Halted(); err != nil {
		return authz.Grant{}, "", err
	}
	return s.hostCaller(ctx, caps...)
}

func (s *server) hostCaller(ctx context.Context, caps ...string) (authz.Grant, string, error) {
	g, err := s.b.Authorize(ctx, authz.TokenFromContext(ctx), caps...)
	p, ok := sock.PeerFromContext(ctx)
	return g, PeerString(p, ok), err
}

// serve answers a call: it resolves the caller (see caller; the host when
// caps is empty) and runs do with its grant and process. The answer is
// do's reply, or nil and the error of either.
func serve[R any](ctx context.Context, s *server, caps []string, do func(g authz.Grant, peer string) (*R, error)) (*R, error) {
	g, peer, err := s.caller(ctx, caps...)
	if err != nil {
		return nil, err
	}
	r, err := do(g, peer)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (s *server) AddTask(ctx context.Context, r *brokerv1.AddTaskRequest) (*brokerv1.AddTaskResponse, error) {
	return serve(ctx, s, nil, func(_ authz.Grant, peer string) (*brokerv1.AddTaskResponse, error) {
		created, err := s.b.AddTask(ctx, peer, r.GetBusiness(), r.GetProject(), r.GetTask())
		return &brokerv1.AddTaskResponse{Created: created}, err
	})
}

func (s *server) CreateGrant(ctx context.Context, r *brokerv1.CreateGrantRequest) (*brokerv1.CreateGrantResponse, error) {
	return serve(ctx, s, nil, func(_ authz.Grant, peer string) (*brokerv1.CreateGrantResponse, error) {
		if r.GetTtlSeconds() < 0 || r.GetTtlSeconds() > int64(100*365*24*time.Hour/time.Second) {
			return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "ttl_seconds %d out of range", r.GetTtlSeconds())
		}
		ig, err := s.b.CreateGrant(ctx, peer, GrantRequest{
			Business: r.GetBusiness(), Project: r.GetProject(), Task: r.GetTask(),
			Role: r.GetRole(), Caps: r.GetCapabilities(), TTL: time.Duration(r.GetTtlSeconds()) * time.Second,
			Launch: launchSet(r.GetLaunch()), LaunchedBy: r.GetLaunchedBy(), LaunchBounds: launchBounds(r.GetLaunchBounds()),
		})
		return &brokerv1.CreateGrantResponse{GrantId: ig.ID, Token: ig.Token, ExpiresAt: ig.ExpiresAt.Format(time.RFC3339)}, err
	})
}

func (s *server) RevokeGrant(ctx context.Context, r *brokerv1.RevokeGrantRequest) (*brokerv1.RevokeGrantResponse, error) {
	return serve(ctx, s, nil, func(_ authz.Grant, peer string) (*brokerv1.RevokeGrantResponse, error) {
		return &brokerv1.RevokeGrantResponse{}, s.b.RevokeGrant(ctx, peer, r.GetGrantId())
	})
}

func (s *server) RequestReview(ctx context.Context, _ *brokerv1.RequestReviewRequest) (*brokerv1.RequestReviewResponse, error) {
	return serve(ctx, s, []string{authz.CapReviewRequest, authz.CapPushWorking}, func(g authz.Grant, peer string) (*brokerv1.RequestReviewResponse, error) {
		rv, err := s.b.RequestReview(ctx, g, peer)
		return &brokerv1.RequestReviewResponse{RequestId: rv.RequestID, Commit: rv.Commit, Created: rv.Created}, err
	})
}

func (s *server) SubmitVerdict(ctx context.Context, r *brokerv1.SubmitVerdictRequest) (*brokerv1.SubmitVerdictResponse, error) {
	return serve(ctx, s, []string{authz.CapReviewVerdict}, func(g authz.Grant, peer string) (*brokerv1.SubmitVerdictResponse, error) {
		var verdict string
		switch r.GetVerdict() {
		case brokerv1.Verdict_VERDICT_APPROVE:
			verdict = Approve
		case brokerv1.Verdict_VERDICT_REJECT:
			verdict = Reject
		default:
			return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "verdict must be approve or reject")
		}
		seq, err := s.b.SubmitVerdict(ctx, g, peer, r.GetRequestId(), r.GetCommit(), verdict, r.GetComment())
		return &brokerv1.SubmitVerdictResponse{Seq: seq}, err
	})
}

func (s *server) CloseTask(ctx context.Context, _ *brokerv1.CloseTaskRequest) (*brokerv1.CloseTaskResponse, error) {
	return serve(ctx, s, []string{authz.CapTaskClose}, func(g authz.Grant, peer string) (*brokerv1.CloseTaskResponse, error) {
		seq, err := s.b.CloseTask(ctx, g, peer)
		return &brokerv1.CloseTaskResponse{Seq: seq}, err
	})
}

func (s *server) ReopenTask(ctx context.Context, r *brokerv1.ReopenTaskRequest) (*brokerv1.ReopenTaskResponse, error) {
	return serve(ctx, s, nil, func(_ authz.Grant, peer string) (*brokerv1.ReopenTaskResponse, error) {
		seq, err := s.b.ReopenTask(ctx, peer, r.GetBusiness(), r.GetProject(), r.GetTask())
		return &brokerv1.ReopenTaskResponse{Seq: seq}, err
	})
}

func (s *server) ListTasks(ctx context.Context, r *brokerv1.ListTasksRequest) (*brokerv1.ListTasksResponse, error) {
	g, err := s.listCaller(ctx)
	if err != nil {
		return nil, err
	}
	ts, err := s.b.ListTasks(ctx, g, r.GetBusiness(), r.GetProject(), r.GetState())
	if err != nil {
		return nil, err
	}
	out := &brokerv1.ListTasksResponse{}
	for _, t := range ts {
		out.Tasks = append(out.Tasks, &brokerv1.TaskInfo{Business: t.Business, Project: t.Project, Task: t.Task, State: t.State,
			LastPushCommit: t.LastPushCommit, LastPushSeq: t.LastPushSeq, LandedSeq: t.LandedSeq})
	}
	return out, nil
}

// listCaller resolves a listing's caller: the host, or any valid grant
// (which then sees its own task only).
func (s *server) listCaller(ctx context.Context) (authz.Grant, error) {
	if err := s.b.Halted(); err != nil {
		return authz.Grant{}, err
	}
	tok := authz.TokenFromContext(ctx)
	g, err := s.b.Authorize(ctx, tok)
	if err != nil {
		g, err = s.b.Authorize(ctx, tok, authz.Capabilities...)
	}
	return g, err
}

func (s *server) ListProjects(ctx context.Context, r *brokerv1.ListProjectsRequest) (*brokerv1.ListProjectsResponse, error) {
	g, err := s.listCaller(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := s.b.ListProjects(ctx, g, r.GetBusiness())
	if err != nil {
		return nil, err
	}
	out := &brokerv1.ListProjectsResponse{}
	for _, p := range ps {
		out.Projects = append(out.Projects, &brokerv1.ProjectInfo{Business: p.Business, Project: p.Project, Host: p.Host, Here: p.Here, SizeBytes: p.SizeBytes,
			LastPushCommit: p.LastPushCommit, LastPushSeq: p.LastPushSeq, LastPushTask: p.LastPushTask, LastPushTime: p.LastPushTime, Tasks: p.Tasks, Moving: p.Moving})
	}
	return out, nil
}

func (s *server) ListGrants(ctx context.Context, r *brokerv1.ListGrantsRequest) (*brokerv1.ListGrantsResponse, error) {
	g, err := s.listCaller(ctx)
	if err != nil {
		return nil, err
	}
	gs, err := s.b.ListGrants(ctx, g, r.GetBusiness(), r.GetProject(), r.GetTask())
	if err != nil {
		return nil, err
	}
	out := &brokerv1.ListGrantsResponse{}
	for _, gi := range gs {
		out.Grants = append(out.Grants, &brokerv1.GrantInfo{Id: gi.ID, Business: gi.Business, Project: gi.Project, Task: gi.Task, Role: gi.Role,
			Capabilities: gi.Caps, ExpiresAt: gi.ExpiresAt.Format(time.RFC3339), Expired: gi.Expired, RevokedSeq: gi.RevokedSeq,
			Launch: LaunchRoles(gi.Launch), LaunchedBy: gi.LaunchedBy, LaunchDepth: int64(gi.LaunchDepth), LaunchBounds: launchBoundsProto(gi.LaunchBounds)})
	}
	return out, nil
}

// launchSet reads a request's launch set; a role given twice is refused
// by giving it no capabilities.
func launchSet(roles []*brokerv1.LaunchRole) map[string][]string {
	if len(roles) == 0 {
		return nil
	}
	m := map[string][]string{}
	for _, r := range roles {
		if _, dup := m[r.GetRole()]; dup {
			m[r.GetRole()] = nil
			continue
		}
		m[r.GetRole()] = append([]string{}, r.GetCapabilities()...)
	}
	return m
}

// launchBounds reads a request's launch bounds (checked by CreateGrant).
func launchBounds(p *brokerv1.LaunchBounds) bounds.Launch {
	return bounds.Launch{Nets: p.GetNet(), Max: p.GetMax(), Tasks: p.GetTasks(), AllowDomains: p.GetAllowDomains(), AllowHosts: p.GetAllowHosts()}
}

// launchBoundsProto is a grant's launch bounds as the protos carry them,
// nil for none.
func launchBoundsProto(l bounds.Launch) *brokerv1.LaunchBounds {
	if l.IsZero() {
		return nil
	}
	return &brokerv1.LaunchBounds{Net: l.Nets, Max: l.Max, Tasks: l.Tasks, AllowDomains: l.AllowDomains, AllowHosts: l.AllowHosts}
}

// LaunchRoles is a launch set as the protos carry it, roles in order.
func LaunchRoles(m map[string][]string) []*brokerv1.LaunchRole {
	var out []*brokerv1.LaunchRole
	for _, role := range slices.Sorted(maps.Keys(m)) {
		out = append(out, &brokerv1.LaunchRole{Role: role, Capabilities: m[role]})
	}
	return out
}

func (s *server) Whoami(ctx context.Context, _ *brokerv1.WhoamiRequest) (*brokerv1.WhoamiResponse, error) {
	return serve(ctx, s, authz.Capabilities, func(g authz.Grant, _ string) (*brokerv1.WhoamiResponse, error) {
		g, err := s.b.Whoami(ctx, g)
		return &brokerv1.WhoamiResponse{GrantId: g.ID, Business: g.Business, Project: g.Project, Task: g.Task, Role: g.Role,
			Capabilities: g.Caps, Launch: LaunchRoles(g.Launch), LaunchedBy: g.LaunchedBy, LaunchDepth: int64(g.LaunchDepth),
			LaunchBounds: launchBoundsProto(g.LaunchBounds)}, err
	})
}

func (s *server) RecordEvent(ctx context.Context, r *brokerv1.RecordEventRequest) (*brokerv1.RecordEventResponse, error) {
	if r.GetBusiness() != "" || r.GetProject() != "" || r.GetTask() != "" {
		// The host's record of a launched session, on the session's task.
		return serve(ctx, s, nil, func(_ authz.Grant, peer string) (*brokerv1.RecordEventResponse, error) {
			e, err := s.b.RecordSessionEvent(ctx, peer, r.GetBusiness(), r.GetProject(), r.GetTask(), r.GetType(), r.GetData(), r.GetIdempotencyKey())
			return &brokerv1.RecordEventResponse{Event: eventProto(e)}, err
		})
	}
	// Either capability lets the call in; RecordEvent decides which the
	// type needs.
	return serve(ctx, s, []string{authz.CapEventRecord, authz.CapNetworkAudit}, func(g authz.Grant, peer string) (*brokerv1.RecordEventResponse, error) {
		e, err := s.b.RecordEvent(ctx, g, peer, r.GetType(), r.GetData(), r.GetIdempotencyKey())
		return &brokerv1.RecordEventResponse{Event: eventProto(e)}, err
	})
}

func (s *server) RecordEvents(ctx context.Context, r *brokerv1.RecordEventsRequest) (*brokerv1.RecordEventsResponse, error) {
	return serve(ctx, s, []string{authz.CapEventRecord, authz.CapNetworkAudit}, func(g authz.Grant, peer string) (*brokerv1.RecordEventsResponse, error) {
		rs := make([]Record, len(r.GetEvents()))
		for i, e := range r.GetEvents() {
			rs[i] = Record{Type: e.GetType(), Data: e.GetData(), Key: e.GetIdempotencyKey()}
		}
		evs, err := s.b.RecordEvents(ctx, g, peer, rs)
		if err != nil {
			return nil, err
		}
		out := &brokerv1.RecordEventsResponse{Events: make([]*brokerv1.Event, len(evs))}
		for i, e := range evs {
			out.Events[i] = eventProto(e)
		}
		return out, nil
	})
}

func (s *server) ListEvents(r *brokerv1.ListEventsRequest, stream brokerv1.BrokerService_ListEventsServer) error {
	ctx := stream.Context()
	// The host, or any valid grant, which reads its own task's events.
	g, err := s.listCaller(ctx)
	if err != nil {
		return err
	}
	f := Filter{Business: r.GetBusiness(), Project: r.GetProject(), Task: r.GetTask()}
	if !g.Host {
		own := Filter{Business: g.Business, Project: g.Project, Task: g.Task}
		for _, c := range [][2]string{{f.Business, own.Business}, {f.Project, own.Project}, {f.Task, own.Task}} {
			if c[0] != "" && c[0] != c[1] {
				return errdefs.PermissionDenied(errdefs.OtherTask, "grant %s sees only task %s", g.ID, scopeString(own.Business, own.Project, own.Task))
			}
		}
		f = own
		f.Still = func(ctx context.Context) error { return s.b.GrantValid(ctx, g) }
	}
	err = s.b.Events(ctx, f, r.GetAfterSeq(), r.GetFollow(), func(e Event) error {
		return stream.Send(&brokerv1.ListEventsResponse{Event: eventProto(e)})
	})
	if err != nil && ctx.Err() != nil && r.GetFollow() {
		// The follower hung up: that is how a follow ends.
		return nil
	}
	return err
}

// maxHeads bounds the recorded heads one VerifyLog checks.
const maxHeads = 1 << 20

func (s *server) VerifyLog(ctx context.Context, r *brokerv1.VerifyLogRequest) (*brokerv1.VerifyLogResponse, error) {
	if _, _, err := s.hostCaller(ctx); err != nil {
		return nil, err
	}
	if len(r.GetHeads()) > maxHeads {
		return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "%d recorded heads; at most %d", len(r.GetHeads()), maxHeads)
	}
	heads := make([]Head, 0, len(r.GetHeads()))
	for _, h := range r.GetHeads() {
		hd, err := ParseHead(fmt.Sprintf("%d %s", h.GetSeq(), h.GetHash()))
		if err != nil {
			return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "%v", err)
		}
		heads = append(heads, hd)
	}
	v, err := s.b.VerifyLog(ctx, heads...)
	if err != nil {
		return nil, err
	}
	return &brokerv1.VerifyLogResponse{Ok: v.OK, Events: v.Events, FirstBadSeq: v.FirstBadSeq, Reason: v.Reason,
		Differences: v.Differences, HeadSeq: v.HeadSeq, HeadHash: v.HeadHash}, nil
}

func (s *server) LogHead(ctx context.Context, _ *brokerv1.LogHeadRequest) (*brokerv1.LogHeadResponse, error) {
	if _, _, err := s.hostCaller(ctx); err != nil {
		return nil, err
	}
	seq, hash, err := s.b.LogHead(ctx)
	if err != nil {
		return nil, err
	}
	return &brokerv1.LogHeadResponse{Seq: seq, Hash: hash}, nil
}

func eventProto(e Event) *brokerv1.Event {
	return &brokerv1.Event{
		Seq: e.Seq, Business: e.Business, Project: e.Project, Task: e.Task, Type: e.Type,
		Actor: e.Actor, Data: e.Data, Time: e.Time, PrevHash: e.PrevHash, Hash: e.Hash, Peer: e.Peer,
	}
}
