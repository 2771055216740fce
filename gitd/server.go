package gitd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/sock"
)

// server is the GitService on git.sock. The caller's grant, never the
// request, decides business, project and task; its methods return
// errdefs errors as they are, and the server's interceptors
// (internal/grpcerr) send them.
type server struct {
	gitv1.UnimplementedGitServiceServer
	s *Service
}

// NewServer returns the gRPC GitService backed by s.
func NewServer(s *Service) gitv1.GitServiceServer { return &server{s: s} }

// caller is an authorized call: its grant and, for a session's grant, the
// grant's task, its names parsed once here (zero for the host).
type caller struct {
	authz.Grant
	task names.Task
}

func (sv *server) authorize(ctx context.Context, caps ...string) (caller, error) {
	g, err := sv.s.o.Authority.Authorize(ctx, authz.TokenFromContext(ctx), caps...)
	c := caller{Grant: g}
	if err != nil {
		return c, err
	}
	if len(caps) > 0 {
		if c.task, err = names.ParseTask(g.Business, g.Project, g.Task); err != nil {
			return c, fmt.Errorf("grant scope: %w", err)
		}
		if err := sv.s.o.Authority.CheckPlacement(ctx, g.Business, g.Project); err != nil {
			return c, err
		}
	}
	return c, nil
}

// authorizeHost parses business/project, requires the admin token for a
// call naming them, and that the project is not placed on another host.
func (sv *server) authorizeHost(ctx context.Context, business, project string) (names.Project, error) {
	p, err := names.ParseProject(business, project)
	if err != nil {
		return p, err
	}
	return p, sv.hostOf(ctx, p)
}

// authorizeHostTask is authorizeHost for a call naming a task.
func (sv *server) authorizeHostTask(ctx context.Context, business, project, task string) (names.Task, error) {
	t, err := names.ParseTask(business, project, task)
	if err != nil {
		return t, err
	}
	return t, sv.hostOf(ctx, t.Project())
}

// hostOf requires the admin token, and that p is not placed on another
// host.
func (sv *server) hostOf(ctx context.Context, p names.Project) error {
	if _, err := sv.authorize(ctx); err != nil {
		return err
	}
	return sv.s.o.Authority.CheckPlacement(ctx, p.Business(), p.Name())
}

func (sv *server) PushWorking(stream grpc.ClientStreamingServer[gitv1.PushWorkingRequest, gitv1.PushWorkingResponse]) error {
	ctx := stream.Context()
	// A passed descriptor is taken first, so that it is closed however
	// the call ends (refused grant included).
	var passed *os.File
	offered, offerErr := false, error(nil)
	if !sv.s.skip.FDPassing {
		passed, offered, offerErr = sock.PassedFD(ctx)
		if passed != nil {
			defer passed.Close()
		}
	}
	g, err := sv.authorize(ctx, authz.CapPushWorking)
	if err != nil {
		return err
	}
	rr := newRecvReader(stream, sv.s.o.IdleTimeout)
	defer rr.stop()
	ctx, cancel := rr.bound(ctx, sv.s.o.Limits)
	defer cancel()
	first, err := rr.next()
	if err != nil {
		return err
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return errdefs.InvalidArgument(errdefs.PushProtocol, "the first message of a push must be its header")
	}
	if offered {
		return rr.why(sv.pushPassed(ctx, stream, g, rr, passed, offerErr))
	}
	peer, _ := sock.PeerFromContext(ctx)
	res, err := sv.s.Push(ctx, g.Grant, g.task, peer, hdr.GetSize(), rr)
	if err != nil {
		return rr.why(err)
	}
	return stream.SendAndClose(&gitv1.PushWorkingResponse{Commit: res.Commit, Previous: res.Previous, Ref: res.Ref})
}

func (sv *server) FetchMain(req *gitv1.FetchMainRequest, stream grpc.ServerStreamingServer[gitv1.FetchMainResponse]) error {
	ctx := stream.Context()
	g, err := sv.authorize(ctx, authz.CapPushWorking, authz.CapReviewVerdict)
	if err != nil {
		return err
	}
	return sendBundle(sv, g.Grant, stream, func(begin func(string) error, w io.Writer) error {
		return sv.s.WriteMainBundle(ctx, g.task.Project(), req.GetHave(), begin, w)
	}, func(c string) *gitv1.FetchMainResponse {
		return &gitv1.FetchMainResponse{Msg: &gitv1.FetchMainResponse_Commit{Commit: c}}
	}, func(b []byte) *gitv1.FetchMainResponse {
		return &gitv1.FetchMainResponse{Msg: &gitv1.FetchMainResponse_Chunk{Chunk: b}}
	})
}

func (sv *server) FetchReview(req *gitv1.FetchReviewRequest, stream grpc.ServerStreamingServer[gitv1.FetchReviewResponse]) error {
	return sendPush(sv, stream, authz.CapReviewVerdict, req.GetHave(), req.GetAlsoHave(), func(c string) *gitv1.FetchReviewResponse {
		return &gitv1.FetchReviewResponse{Msg: &gitv1.FetchReviewResponse_Commit{Commit: c}}
	}, func(b []byte) *gitv1.FetchReviewResponse {
		return &gitv1.FetchReviewResponse{Msg: &gitv1.FetchReviewResponse_Chunk{Chunk: b}}
	})
}

// sendPush sends a task's latest push as a bundle (FetchReview,
// FetchWork) to a grant with capability cap whose task is not marked.
func sendPush[R any](sv *server, stream grpc.ServerStreamingServer[R], cap, have string, also []string, commit func(string) *R, chunk func([]byte) *R) error {
	ctx := stream.Context()
	g, err := sv.authorize(ctx, cap)
	if err != nil {
		return err
	}
	if err := sv.s.notMarked(ctx, g.Grant); err != nil {
		return err
	}
	return sendBundle(sv, g.Grant, stream, func(begin func(string) error, w io.Writer) error {
		return sv.s.WriteReviewBundle(ctx, g.task, have, also, begin, w)
	}, commit, chunk)
}

// sendBundle streams the bundle write makes: the message commit makes of
// its commit first, then chunk's of its bytes, each chunk sent only while
// the grant g still holds; a refused grant is the stream's end.
func sendBundle[R any](sv *server, g authz.Grant, stream grpc.ServerStreamingServer[R], write func(begin func(string) error, w io.Writer) error, commit func(string) *R, chunk func([]byte) *R) error {
	still := &grantCheck{ctx: stream.Context(), a: sv.s.o.Authority, g: g}
	w := newChunkWriter(func(b []byte) error {
		if err := still.check(); err != nil {
			return err
		}
		return stream.Send(chunk(b))
	})
	begin := func(c string) error { return stream.Send(commit(c)) }
	if err := write(begin, w); err != nil {
		return still.first(err)
	}
	return still.first(w.Flush())
}

func (sv *server) AddProject(ctx context.Context, req *gitv1.AddProjectRequest) (*gitv1.AddProjectResponse, error) {
	p, err := names.ParseProject(req.GetBusiness(), req.GetProject())
	if err != nil {
		return nil, err
	}
	if _, err := sv.authorize(ctx); err != nil {
		return nil, err
	}
	// A root refused leaves nothing, not even the placement.
	if _, err := checkRoot(req.GetRoot()); err != nil {
		return nil, err
	}
	// The project is placed on this host before its repository is made, so
	// a project another host owns gets no repository here; both steps are
	// idempotent, so a retry after a failure in between completes it.
	if err := sv.s.o.Authority.EnsureProject(ctx, req.GetBusiness(), req.GetProject()); err != nil {
		return nil, err
	}
	commit, created, err := sv.s.AddProject(ctx, p, req.GetRoot())
	if err != nil {
		return nil, err
	}
	return &gitv1.AddProjectResponse{Commit: commit, Created: created}, nil
}

func (sv *server) SyncProject(ctx context.Context, req *gitv1.SyncProjectRequest) (*gitv1.SyncProjectResponse, error) {
	p, err := sv.authorizeHost(ctx, req.GetBusiness(), req.GetProject())
	if err != nil {
		return nil, err
	}
	commit, previous, err := sv.s.SyncProject(ctx, p)
	if err != nil {
		return nil, err
	}
	return &gitv1.SyncProjectResponse{Commit: commit, Previous: previous}, nil
}

func (sv *server) RepairTask(ctx context.Context, req *gitv1.RepairTaskRequest) (*gitv1.RepairTaskResponse, error) {
	t, err := sv.authorizeHostTask(ctx, req.GetBusiness(), req.GetProject(), req.GetTask())
	if err != nil {
		return nil, err
	}
	res, err := sv.s.RepairTask(ctx, t)
	if err != nil {
		return nil, err
	}
	return &gitv1.RepairTaskResponse{Outcome: res.Outcome, Commit: res.Commit, RefCommit: res.RefCommit, Seq: res.Seq}, nil
}

func (sv *server) ArchiveTask(ctx context.Context, req *gitv1.ArchiveTaskRequest) (*gitv1.ArchiveTaskResponse, error) {
	t, err := sv.authorizeHostTask(ctx, req.GetBusiness(), req.GetProject(), req.GetTask())
	if err != nil {
		return nil, err
	}
	res, err := sv.s.ArchiveTask(ctx, t)
	if err != nil {
		return nil, err
	}
	return &gitv1.ArchiveTaskResponse{Removed: res.Removed, Bytes: res.Bytes}, nil
}

func (sv *server) OptimizeProject(ctx context.Context, req *gitv1.OptimizeProjectRequest) (*gitv1.OptimizeProjectResponse, error) {
	p, err := sv.authorizeHost(ctx, req.GetBusiness(), req.GetProject())
	if err != nil {
		return nil, err
	}
	runs, err := sv.s.OptimizeProject(ctx, p)
	if err != nil {
		return nil, err
	}
	res := &gitv1.OptimizeProjectResponse{}
	for _, r := range runs {
		h := &gitv1.RepositoryHousekeeping{Repository: r.Repository, Outcome: r.Outcome, Actions: r.Actions,
			PacksBefore: int32(r.PacksBefore), PacksAfter: int32(r.PacksAfter), DurationMs: r.Duration.Milliseconds()}
		if r.Err != nil {
			h.Error = r.Err.Error()
		}
		res.Repositories = append(res.Repositories, h)
	}
	return res, nil
}

// grantCheck re-reads a stream's grant before each chunk it sends, and
// remembers the refusal so that the stream ends with it, not with the
// broken pipe git saw when the send stopped.
type grantCheck struct {
	ctx    context.Context
	a      authz.Authority
	g      authz.Grant
	denied error
}

func (c *grantCheck) check() error {
	if c.denied == nil {
		c.denied = c.a.GrantValid(c.ctx, c.g)
	}
	return c.denied
}

// first returns the grant's refusal if there was one, else err.
func (c *grantCheck) first(err error) error {
	if c.denied != nil {
		return c.denied
	}
	return err
}

// recvReader turns a push stream's chunks into an io.Reader, cutting the
// stream when the client sends nothing for idle. Recv runs in its own
// goroutine, since a blocked Recv cannot be interrupted except by the
// handler returning.
type recvReader struct {
	msgs chan recvResult
	done chan struct{}
	idle time.Duration
	buf  []byte
	err  error
	// cut, when set, ends a wait early with its error (bound: the
	// push's deadline or its minimum rate); got counts chunk bytes.
	cut <-chan struct{}
	// cutErr is set before cut is closed.
	cutErr  error
	got     atomic.Int64
	ended   atomic.Bool  // the client half-closed: the whole body is in
	tooLong func() error // the push-timeout error once it passed, else nil
}

type recvResult struct {
	m   *gitv1.PushWorkingRequest
	err error
}

func newRecvReader(stream grpc.ClientStreamingServer[gitv1.PushWorkingRequest, gitv1.PushWorkingResponse], idle time.Duration) *recvReader {
	r := &recvReader{msgs: make(chan recvResult), done: make(chan struct{}), idle: idle}
	go func() {
		for {
			m, err := stream.Recv()
			select {
			case r.msgs <- recvResult{m, err}:
			case <-r.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return r
}

func (r *recvReader) stop() { close(r.done) }

func (r *recvReader) next() (*gitv1.PushWorkingRequest, error) {
	t := time.NewTimer(r.idle)
	defer t.Stop()
	select {
	case res := <-r.msgs:
		if res.err == io.EOF {
			r.ended.Store(true)
		}
		return res.m, res.err
	case <-t.C:
		return nil, errdefs.DeadlineExceeded(errdefs.PushIdle, "the client sent nothing for %s; push cut", r.idle).With("idle", r.idle)
	case <-r.cut:
		return nil, r.cutErr
	}
}

func (r *recvReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		m, err := r.next()
		if err != nil {
			r.err = err
			continue
		}
		if m.GetHeader() != nil {
			r.err = errdefs.InvalidArgument(errdefs.PushProtocol, "a second push header in one stream")
			continue
		}
		r.buf = m.GetChunk()
		r.got.Add(int64(len(r.buf)))
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// chunkWriter sends what git writes in messages of at most MaxChunk bytes,
// batching git's small writes.
type chunkWriter struct {
	*bufio.Writer
}

type sendFunc func([]byte) error

func (f sendFunc) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += MaxChunk {
		end := min(off+MaxChunk, len(p))
		// grpc may hold the message after Send returns (stats handlers):
		// give it its own copy, since the buffer behind p is reused.
		if err := f(append([]byte(nil), p[off:end]...)); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func newChunkWriter(send func([]byte) error) chunkWriter {
	return chunkWriter{bufio.NewWriterSize(sendFunc(send), MaxChunk)}
}

var _ io.Writer = chunkWriter{}
