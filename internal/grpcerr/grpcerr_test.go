package grpcerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/bushost/bushost/internal/errdefs"
)

// failing is a health service whose Check and Watch return err as they
// are, as bushost's handlers do; Watch sends one answer first.
type failing struct {
	healthpb.UnimplementedHealthServer
	err error
}

func (f *failing) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if f.err == nil {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return nil, f.err
}

func (f *failing) Watch(_ *healthpb.HealthCheckRequest, s grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if err := s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
		return err
	}
	return f.err
}

// serve serves f on a Unix socket with the server interceptors and returns
// two clients: one dialled with DialOptions, one that sees the raw status.
func serve(t *testing.T, f *failing) (decoded, raw healthpb.HealthClient) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(UnaryServer), grpc.ChainStreamInterceptor(StreamServer))
	healthpb.RegisterHealthServer(srv, f)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	dial := func(opts ...grpc.DialOption) healthpb.HealthClient {
		c, err := grpc.NewClient("unix://"+path, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return healthpb.NewHealthClient(c)
	}
	return dial(DialOptions()...), dial()
}

// calls makes the unary call and the stream of c and returns their errors.
func calls(t *testing.T, c healthpb.HealthClient) (unary, stream error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, unary = c.Check(ctx, &healthpb.HealthCheckRequest{})
	w, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return unary, err
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("the stream's first answer: %v", err)
	}
	_, stream = w.Recv()
	return unary, stream
}

// A handler's plain errdefs error reaches a real client over a real socket
// with its kind, message, reason, metadata and retry hint, from a unary
// call and from a stream: as an *errdefs.Error through DialOptions, and as
// the status with ErrorInfo and RetryInfo a client of any language reads.
func TestHandlerErrorReachesClient(t *testing.T) {
	refusal := fmt.Errorf("push t1: %w", errdefs.ResourceExhausted(errdefs.BundleTooLarge, "bundle is 10 bytes, over the limit of 5").
		With("limit", 5).With("size", 10).Retry(2*time.Second).Wrap(errors.New("the cause stays on the server")))
	decoded, raw := serve(t, &failing{err: refusal})
	for _, c := range []struct {
		what string
		c    healthpb.HealthClient
	}{{"decoded", decoded}, {"raw", raw}} {
		unary, stream := calls(t, c.c)
		for what, err := range map[string]error{"unary": unary, "stream": stream} {
			var e *errdefs.Error
			if c.what == "decoded" {
				var ok bool
				if e, ok = errdefs.As(err); !ok {
					t.Fatalf("%s %s: %T %v is no *errdefs.Error", c.what, what, err, err)
				}
			} else {
				e = rawStatus(t, err)
			}
			if e.Kind != errdefs.KindResourceExhausted || e.Reason != errdefs.BundleTooLarge || e.Message != "bundle is 10 bytes, over the limit of 5" ||
				e.Metadata["limit"] != "5" || e.Metadata["size"] != "10" || e.Metadata["retry_after"] != "2s" || e.RetryAfter != 2*time.Second {
				t.Errorf("%s %s: %+v", c.what, what, e)
			}
			if errdefs.ExitCode(e) != errdefs.ExitLimit {
				t.Errorf("%s %s: exit %d", c.what, what, errdefs.ExitCode(e))
			}
		}
	}
}

// rawStatus reads err as a status the way a client without this package
// does: the code, the message, the bushost ErrorInfo and the RetryInfo.
func rawStatus(t *testing.T, err error) *errdefs.Error {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("%T %v is no status", err, err)
	}
	e := errdefs.New(errdefs.Kind(st.Code()), "", "%s", st.Message())
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() != "bushost.dev" {
				t.Fatalf("ErrorInfo domain %q", d.GetDomain())
			}
			e.Reason, e.Metadata = errdefs.Reason(d.GetReason()), d.GetMetadata()
		case *errdetails.RetryInfo:
			e.RetryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return e
}

// What is no errdefs error maps as it always did: a context error to
// Canceled or DeadlineExceeded, any other error to Internal INTERNAL with
// its text, a status grpc made passes through; a stream that ends well
// still ends with io.EOF through the client interceptor.
func TestOtherErrors(t *testing.T) {
	for _, c := range []struct {
		err    error
		kind   errdefs.Kind
		reason errdefs.Reason
		msg    string
	}{
		{fmt.Errorf("wait: %w", context.Canceled), errdefs.KindCanceled, errdefs.Canceled, "wait: context canceled"},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), errdefs.KindDeadlineExceeded, errdefs.DeadlineReached, "wait: context deadline exceeded"},
		{errors.New("boom"), errdefs.KindInternal, errdefs.InternalError, "boom"},
		{status.Error(codes.PermissionDenied, "no"), errdefs.KindPermissionDenied, "", "no"},
	} {
		decoded, _ := serve(t, &failing{err: c.err})
		unary, stream := calls(t, decoded)
		for what, err := range map[string]error{"unary": unary, "stream": stream} {
			e, ok := errdefs.As(err)
			if !ok || e.Kind != c.kind || e.Reason != c.reason || e.Message != c.msg {
				t.Errorf("%v, %s: got %T %+v", c.err, what, err, e)
			}
		}
	}
	decoded, _ := serve(t, &failing{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := decoded.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	w, err := decoded.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != io.EOF {
		t.Fatalf("end of stream: %v, want io.EOF", err)
	}
}

// A connection that fails before any call (nothing serves the socket) is
// Unavailable without a reason; an error that is no status is UNREACHABLE.
func TestNoServer(t *testing.T) {
	c, err := grpc.NewClient("unix://"+filepath.Join(t.TempDir(), "none.sock"),
		append(DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = healthpb.NewHealthClient(c).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if e, ok := errdefs.As(err); !ok || e.Kind != errdefs.KindUnavailable || e.Reason != "" || errdefs.ExitCode(err) != errdefs.ExitUnreachable {
		t.Fatalf("no server: %T %v", err, err)
	}
	if e := FromStatus(errors.New("dial unix: no such file")); e.Kind != errdefs.KindUnavailable || e.Reason != errdefs.Unreachable {
		t.Fatalf("no status: %+v", e)
	}
	if ToStatus(nil) != nil || FromStatus(nil) != nil || Of(nil) != nil {
		t.Fatal("nil")
	}
}

// TestKindsAreCodes keeps errdefs' kinds equal to gRPC's codes by name and
// number, which ToStatus and FromStatus rely on.
func TestKindsAreCodes(t *testing.T) {
	if int(errdefs.KindUnauthenticated) != int(codes.Unauthenticated) {
		t.Fatalf("the last kind is %d, the last code %d", errdefs.KindUnauthenticated, codes.Unauthenticated)
	}
	for k := errdefs.KindOK; k <= errdefs.KindUnauthenticated; k++ {
		if c := codes.Code(k); c.String() != k.String() || errdefs.Kind(c) != k {
			t.Errorf("kind %s is code %s", k, c)
		}
	}
}

// Of is what the wire carries, without the round trip.
func TestOf(t *testing.T) {
	for _, err := range []error{
		errdefs.NotFound(errdefs.TaskNotFound, "no task t9").With("task", "t9"),
		context.Canceled,
		errors.New("boom"),
		status.Error(codes.ResourceExhausted, "grpc: received message larger than max"),
	} {
		got, want := Of(err), FromStatus(ToStatus(err))
		if got.Kind != want.Kind || got.Reason != want.Reason || got.Message != want.Message {
			t.Errorf("Of(%v) = %v %s %q, the wire says %v %s %q", err, got.Kind, got.Reason, got.Message, want.Kind, want.Reason, want.Message)
		}
	}
}
