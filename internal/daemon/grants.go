package daemon

import (
	"time"

	"google.golang.org/grpc"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/sock"
)

// grantLimiter bounds the calls in flight of one grant and its `events
// --follow` streams, on both sockets together, so that one token cannot
// take every slot of its uid or socket from the grant's other users and
// from other tasks (sock.GrantSlots: the host's admin token is not
// counted).
type grantLimiter struct {
	calls, follows         *sock.GrantSlots
	maxCalls, maxFollows   int
	callsFull, followsFull func(n int) error
	unary                  grpc.UnaryServerInterceptor
	listTimeout            time.Duration
}

func newGrantLimiter(l limits.Limits, adminToken string) *grantLimiter {
	g := &grantLimiter{
		calls: sock.NewGrantSlots(adminToken), follows: sock.NewGrantSlots(adminToken),
		maxCalls: l.MaxCallsPerGrant, maxFollows: l.MaxStreamsPerGrant, listTimeout: l.ListTimeout,
		callsFull:   full(errdefs.TooManyCallsPerGrant, l.MaxCallsPerGrant, "calls in flight (--max-calls-per-grant)"),
		followsFull: full(errdefs.TooManyFollows, l.MaxStreamsPerGrant, "'events --follow' streams (--max-streams-per-grant)"),
	}
	g.unary = g.calls.Unary(g.maxCalls, g.callsFull)
	return g
}

// full is the refusal of a grant that holds n of its max slots of what.
func full(reason errdefs.Reason, max int, what string) func(n int) error {
	return func(n int) error {
		return errdefs.ResourceExhausted(reason, "this grant already has %d %s (limit %d); end some and retry", n, what, max).
			With("limit", max).Retry(time.Second)
	}
}

func (g *grantLimiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	var release []func()
	defer func() {
		for _, r := range release {
			r()
		}
	}()
	r, err := g.calls.Take(ss.Context(), g.maxCalls, g.callsFull)
	if err != nil {
		return err
	}
	release = append(release, r)
	if info.FullMethod != brokerv1.BrokerService_ListEvents_FullMethodName {
		return h(srv, ss)
	}
	ls := &listStream{ServerStream: ss, g: g, release: &release}
	err = h(srv, ls)
	if ls.refused != nil {
		return ls.refused
	}
	return err
}

// listStream learns from a ListEvents request whether it follows: a
// follow takes one of its grant's follow slots, a listing gets the
// overall deadline --list-timeout.
type listStream struct {
	grpc.ServerStream
	g       *grantLimiter
	release *[]func()
	seen    bool
	refused error
}

func (s *listStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil || s.seen {
		return err
	}
	s.seen = true
	req, ok := m.(*brokerv1.ListEventsRequest)
	if !ok {
		return nil
	}
	if !req.GetFollow() {
		d := s.g.listTimeout
		t := time.AfterFunc(d, func() {
			sock.Cut(s.Context(), errdefs.DeadlineExceeded(errdefs.ListTooLong, "the listing took longer than %s (--list-timeout); list from the last seq you got", d).With("limit", d))
		})
		*s.release = append(*s.release, func() { t.Stop() })
		return nil
	}
	r, err := s.g.follows.Take(s.Context(), s.g.maxFollows, s.g.followsFull)
	if err != nil {
		s.refused = err
		return err
	}
	*s.release = append(*s.release, r)
	return nil
}
