package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/metrics"
	"github.com/bushost/bushost/internal/sock"
)

// pushStream plays a client's push to the interceptor from memory: a
// header and one chunk, the shape of an incremental push.
type pushStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*gitv1.PushWorkingRequest
	i    int
}

func (s *pushStream) Context() context.Context { return s.ctx }
func (s *pushStream) SendMsg(any) error        { return nil }
func (s *pushStream) RecvMsg(m any) error {
	if s.i == len(s.msgs) {
		return io.EOF
	}
	proto.Merge(m.(*gitv1.PushWorkingRequest), s.msgs[s.i])
	s.i++
	return nil
}

// BenchmarkObserveCall is what the per-call log line and the metrics add
// to one push on the server: the interceptor around a handler that reads
// the push's messages, notes its grant and answers. Compare with the
// incremental push's hundreds of milliseconds (BenchmarkGitPushObserved
// in integration/ measures it end to end, with the machine's noise).
func BenchmarkObserveCall(b *testing.B) {
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devnull.Close()
	ob := newObserver("git", slog.New(slog.NewJSONHandler(devnull, nil)), newDrainState())
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: sock.AuthInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity},
		Peer:           authz.Peer{PID: 4242, UID: 1000, GID: 1000},
	}})
	info := &grpc.StreamServerInfo{FullMethod: gitv1.GitService_PushWorking_FullMethodName, IsClientStream: true}
	chunk := make([]byte, 4<<10)
	handler := func(_ any, ss grpc.ServerStream) error {
		for {
			var m gitv1.PushWorkingRequest
			if err := ss.RecvMsg(&m); err == io.EOF {
				break
			} else if err != nil {
				return err
			}
		}
		metrics.NoteGrant(ss.Context(), "g-0123456789abcdef", "t1")
		return ss.SendMsg(&gitv1.PushWorkingResponse{Commit: "0123456789abcdef0123456789abcdef01234567"})
	}
	push := func(b *testing.B, call func(ss grpc.ServerStream) error) {
		b.ReportAllocs()
		for b.Loop() {
			ss := &pushStream{ctx: ctx, msgs: []*gitv1.PushWorkingRequest{
				{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: int64(len(chunk))}}},
				{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: chunk}},
			}}
			if err := call(ss); err != nil {
				b.Fatal(err)
			}
		}
	}
	// The difference between the two is the interceptor's cost.
	b.Run("bare", func(b *testing.B) {
		push(b, func(ss grpc.ServerStream) error { return handler(nil, ss) })
	})
	b.Run("observed", func(b *testing.B) {
		push(b, func(ss grpc.ServerStream) error { return ob.stream(nil, ss, info, handler) })
	})
}

func TestLoggerFlags(t *testing.T) {
	for _, tc := range []struct {
		format, level string
		ok            bool
	}{
		{"text", "info", true},
		{"json", "debug", true},
		{"", "", true},
		{"json", "WARN", true},
		{"xml", "info", false},
		{"json", "loud", false},
	} {
		_, err := cmdline.Logger(io.Discard, tc.format, tc.level)
		if (err == nil) != tc.ok {
			t.Errorf("--log-format %q --log-level %q: %v, want ok=%v", tc.format, tc.level, err, tc.ok)
		}
	}
}
