package gitd

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/names"
)

// heartbeat is how often a move's stream tells the client it is still at
// work, so that its progress timeout (bushost --timeout, 60 s) does not
// end a long bundling or verification.
const heartbeat = 5 * time.Second

// stepper remembers the step a move is at, and sends it every heartbeat
// through send, serialized with the stream's other sends by mu.
type stepper struct {
	mu   sync.Mutex
	cur  atomic.Value // string
	stop chan struct{}
	done chan struct{}
}

func startStepper(send func(step string) error, mu *sync.Mutex) *stepper {
	st := &stepper{stop: make(chan struct{}), done: make(chan struct{})}
	st.cur.Store("")
	go func() {
		defer close(st.done)
		t := time.NewTicker(heartbeat)
		defer t.Stop()
		for {
			select {
			case <-st.stop:
				return
			case <-t.C:
				mu.Lock()
				err := send(st.cur.Load().(string))
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}
	}()
	return st
}

func (st *stepper) set(step string) { st.cur.Store(step) }

// end stops the heartbeat and waits for it.
func (st *stepper) end() {
	close(st.stop)
	<-st.done
}

func checkProject(business, project string) error {
	if err := names.CheckScope(names.Scope{Business: business, Project: project}); err != nil || project == "" {
		if err == nil {
			err = errors.New("no project name")
		}
		return errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err).Wrap(err)
	}
	return nil
}

func (sv *server) ExportProject(req *gitv1.ExportProjectRequest, stream grpc.ServerStreamingServer[gitv1.ExportProjectResponse]) error {
	ctx := stream.Context()
	if err := checkProject(req.GetBusiness(), req.GetProject()); err != nil {
		return err
	}
	if err := sv.authorizeHost(ctx, req.GetBusiness(), req.GetProject()); err != nil {
		return err
	}
	var mu sync.Mutex
	send := func(m *gitv1.ExportProjectResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(m)
	}
	st := startStepper(func(step string) error {
		return stream.Send(&gitv1.ExportProjectResponse{Msg: &gitv1.ExportProjectResponse_Progress{Progress: &gitv1.MoveProgress{Step: step}}})
	}, &mu)
	stopped := false
	stop := func() {
		if !stopped {
			st.end()
			stopped = true
		}
	}
	defer stop()
	begun := func(ex authz.Export) error {
		return send(&gitv1.ExportProjectResponse{Msg: &gitv1.ExportProjectResponse_Begun{Begun: &gitv1.ExportBegun{
			ExportId: ex.ID, HeadSeq: ex.HeadSeq, HeadHash: ex.HeadHash, Host: ex.Host}}})
	}
	started := false
	w := newChunkWriter(func(b []byte) error {
		if !started {
			// The archive streams: its chunks are the sign of life now.
			stop()
			started = true
		}
		return stream.Send(&gitv1.ExportProjectResponse{Msg: &gitv1.ExportProjectResponse_Chunk{Chunk: b}})
	})
	res, err := sv.s.ExportProject(ctx, req.GetBusiness(), req.GetProject(), st.set, begun, w)
	if err != nil {
		return err
	}
	stop()
	return stream.Send(&gitv1.ExportProjectResponse{Msg: &gitv1.ExportProjectResponse_Done{Done: &gitv1.ExportDone{
		Bytes: res.Bytes, Sha256: res.SHA256, Tasks: int32(res.Tasks), Bundles: int32(res.Bundles), ManifestSha256: res.ManifestSHA256}}})
}

func (sv *server) CancelExport(ctx context.Context, req *gitv1.CancelExportRequest) (*gitv1.CancelExportResponse, error) {
	if err := checkProject(req.GetBusiness(), req.GetProject()); err != nil {
		return nil, err
	}
	if err := sv.authorizeHost(ctx, req.GetBusiness(), req.GetProject()); err != nil {
		return nil, err
	}
	seq, err := sv.s.CancelExport(ctx, req.GetBusiness(), req.GetProject())
	if err != nil {
		return nil, err
	}
	return &gitv1.CancelExportResponse{Cancelled: seq != 0, Seq: seq}, nil
}

// ImportProject is host only, and asks no placement: the project is, by
// definition, placed on another host until the import ends.
func (sv *server) ImportProject(stream grpc.BidiStreamingServer[gitv1.ImportProjectRequest, gitv1.ImportProjectResponse]) error {
	ctx := stream.Context()
	if _, err := sv.authorize(ctx); err != nil {
		return err
	}
	var mu sync.Mutex
	st := startStepper(func(step string) error {
		return stream.Send(&gitv1.ImportProjectResponse{Msg: &gitv1.ImportProjectResponse_Progress{Progress: &gitv1.MoveProgress{Step: step}}})
	}, &mu)
	res, err := sv.s.ImportProject(ctx, &importReader{stream: stream}, st.set)
	st.end()
	if err != nil {
		return err
	}
	return stream.Send(&gitv1.ImportProjectResponse{Msg: &gitv1.ImportProjectResponse_Done{Done: &gitv1.ImportDone{
		Business: res.Business, Project: res.Project, From: res.From, ExportId: res.ExportID, Seq: res.Seq,
		Tasks: int32(res.Tasks), Bundles: int32(res.Bundles)}}})
}

// importReader is an import stream's chunks as one io.Reader.
type importReader struct {
	stream grpc.BidiStreamingServer[gitv1.ImportProjectRequest, gitv1.ImportProjectResponse]
	buf    []byte
}

func (r *importReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		m, err := r.stream.Recv()
		if err != nil {
			return 0, err
		}
		r.buf = m.GetChunk()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

var _ io.Reader = (*importReader)(nil)
