package cli

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/errdefs"
)

// DefaultProgressTimeout ends a transfer (a fetch, a push, a listing) that
// makes no progress this long, unless --timeout says otherwise. A call
// that answers at once (every unary call) gets callTimeout as its
// deadline, or --timeout when given.
const DefaultProgressTimeout = 60 * time.Second

// timeouts returns the interceptors every connection of the client is
// dialled with: no call waits on the bus host without a bound.
func (e *Env) timeouts() []grpc.DialOption {
	unary := callTimeout
	progress := DefaultProgressTimeout
	if e.Timeout > 0 {
		unary, progress = e.Timeout, e.Timeout
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if _, ok := ctx.Deadline(); !ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, unary)
				defer cancel()
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return errdefs.DeadlineExceeded(errdefs.NoAnswer, "the bus host did not answer within %s (--timeout)", unary).
					With("limit", unary)
			}
			return err
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			ctx, cancel := context.WithCancelCause(ctx)
			w := &watchedStream{cancel: cancel, limit: progress, env: e}
			w.timer = time.AfterFunc(progress, w.fire)
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				w.stop()
				cancel(nil)
				return nil, w.why(err)
			}
			w.ClientStream = cs
			context.AfterFunc(ctx, w.stop)
			return w, nil
		}),
	}
}

// watchedStream ends a stream that makes no progress for limit: every
// message sent or received restarts the clock. A follow of the event log
// waits for events as long as it likes, so it is not watched.
type watchedStream struct {
	grpc.ClientStream
	cancel context.CancelCauseFunc
	limit  time.Duration
	env    *Env

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	fired   bool
}

func (w *watchedStream) fire() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	w.fired = true
	w.mu.Unlock()
	w.env.stalled.Store(w.stallError())
	w.cancel(errStalled)
}

func (w *watchedStream) stallError() *errdefs.Error {
	return errdefs.DeadlineExceeded(errdefs.TransferStalled, "the transfer made no progress for %s (--timeout); gave up", w.limit).
		With("limit", w.limit)
}

// failure is the error a command reports: when a stream of the command
// stalled, the stall is the cause, whatever the command failed with next
// (git's "early EOF" on the half bundle, say), so the exit is 3.
func (e *Env) failure(err error) error {
	s := e.stalled.Load()
	if s == nil {
		return err
	}
	if _, ok := errdefs.As(err); ok {
		return err
	}
	return errdefs.DeadlineExceeded(s.Reason, "%s (then: %v)", s.Message, err).With("limit", s.Metadata["limit"])
}

var errStalled = errors.New("no progress")

func (w *watchedStream) progress() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.timer.Reset(w.limit)
	}
}

func (w *watchedStream) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.timer.Stop()
}

// why names the stall when the watchdog ended the stream.
func (w *watchedStream) why(err error) error {
	w.mu.Lock()
	fired := w.fired
	w.mu.Unlock()
	if err == nil || !fired {
		return err
	}
	return w.stallError()
}

func (w *watchedStream) SendMsg(m any) error {
	if r, ok := m.(*brokerv1.ListEventsRequest); ok && r.GetFollow() {
		w.stop()
	}
	err := w.ClientStream.SendMsg(m)
	if err == nil {
		w.progress()
	}
	return w.why(err)
}

func (w *watchedStream) RecvMsg(m any) error {
	err := w.ClientStream.RecvMsg(m)
	if err == nil {
		w.progress()
	}
	return w.why(err)
}

func (w *watchedStream) CloseSend() error { return w.why(w.ClientStream.CloseSend()) }
