// Package grpcerr carries internal/errdefs' errors over gRPC, in one place
// and both ways. A server whose first interceptors are UnaryServer and
// StreamServer sends whatever error a handler (or an interceptor inside
// them) returns as the status the wire carries: the kind as the status
// code, the message, a google.rpc.ErrorInfo detail (domain bushost.dev,
// the reason, the metadata) and, for a retryable refusal, a
// google.rpc.RetryInfo detail. A client dialled with DialOptions gets
// every call's error back as an *errdefs.Error (FromStatus, the one
// decoder). Handlers return errdefs errors as they are and never convert
// by hand; only what answers before any handler runs (a call refused at
// the tap, a stream refused in the HTTP/2 framer) calls ToStatus itself.
package grpcerr

import (
	"context"
	"errors"
	"io"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/bushost/bushost/internal/errdefs"
)

// DialOptions install the client interceptors. Give them to
// grpc.NewClient before any other interceptor option, so that the caller
// sees an *errdefs.Error whatever the other interceptors return.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(UnaryClient), grpc.WithChainStreamInterceptor(StreamClient)}
}

// UnaryServer is a grpc.UnaryServerInterceptor: the handler's error leaves
// as ToStatus makes it.
func UnaryServer(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	return resp, ToStatus(err)
}

// StreamServer is a grpc.StreamServerInterceptor: the handler's error
// leaves as ToStatus makes it.
func StreamServer(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return ToStatus(h(srv, ss))
}

// UnaryClient is a grpc.UnaryClientInterceptor: a call's error comes back
// as FromStatus reads it.
func UnaryClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return decode(invoker(ctx, method, req, reply, cc, opts...))
}

// StreamClient is a grpc.StreamClientInterceptor: the stream's errors
// (opening it, sending, receiving, its header) come back as FromStatus
// reads them; io.EOF, the end of a stream, stays io.EOF.
func StreamClient(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, decode(err)
	}
	return &clientStream{ClientStream: cs}, nil
}

type clientStream struct{ grpc.ClientStream }

func (s *clientStream) SendMsg(m any) error { return decode(s.ClientStream.SendMsg(m)) }
func (s *clientStream) RecvMsg(m any) error { return decode(s.ClientStream.RecvMsg(m)) }
func (s *clientStream) CloseSend() error    { return decode(s.ClientStream.CloseSend()) }

func (s *clientStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	return md, decode(err)
}

// decode is FromStatus as an error: nil stays nil, io.EOF stays io.EOF.
func decode(err error) error {
	if err == nil || errors.Is(err, io.EOF) {
		return err
	}
	return FromStatus(err)
}

// passThrough returns the status err already is, when it is one and no
// errdefs error or context error: grpc's own (a message over the size
// limit, a stream the transport ended) travel as grpc made them.
func passThrough(err error) (*status.Status, bool) {
	if _, ok := errdefs.As(err); ok || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil, false
	}
	return status.FromError(err)
}

// ToStatus is the one mapping from an error to the status the wire
// carries. An *errdefs.Error keeps its kind (as the code), message, reason
// and metadata, and its retry hint (as RetryInfo and as metadata
// "retry_after"); an error that already is a status passes through; any
// other error is sent as errdefs.Of makes it (a context error Canceled or
// DeadlineExceeded, a fault of the broker's store Unavailable
// STORE_UNAVAILABLE, the rest Internal INTERNAL).
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := passThrough(err); ok {
		return s.Err()
	}
	e := errdefs.Of(err)
	st := status.New(codes.Code(e.Kind), e.Message)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Domain: errdefs.Domain, Reason: string(e.Reason), Metadata: e.WireMetadata()}}
	if e.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	}
	withDetails, derr := st.WithDetails(details...)
	if derr != nil {
		return st.Err()
	}
	return withDetails.Err()
}

// FromStatus is the one decoder of a status error: the code as the kind,
// the message, and the reason, metadata and retry hint of a bushost
// ErrorInfo and RetryInfo. An *errdefs.Error comes back as it is; an error
// that is no status (the connection failed before any call) comes back as
// Unavailable with reason UNREACHABLE. FromStatus(nil) is nil.
func FromStatus(err error) *errdefs.Error {
	if err == nil {
		return nil
	}
	if e, ok := errdefs.As(err); ok {
		return e
	}
	st, ok := status.FromError(err)
	if !ok {
		return errdefs.Unavailable(errdefs.Unreachable, "%s", err.Error()).Wrap(err)
	}
	e := errdefs.New(errdefs.Kind(st.Code()), "", "%s", st.Message()).Wrap(err)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == errdefs.Domain {
				e.Reason = errdefs.Reason(d.GetReason())
				e.Metadata = d.GetMetadata()
			}
		case *errdetails.RetryInfo:
			e.RetryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return e
}

// Of is what a client will be told of err, as an *errdefs.Error: what
// ToStatus sends, read back without the round trip (for a server's logs
// and metrics).
func Of(err error) *errdefs.Error {
	if err == nil {
		return nil
	}
	if _, ok := passThrough(err); ok {
		return FromStatus(err)
	}
	return errdefs.Of(err)
}
