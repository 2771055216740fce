package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"sync"
	"time"

	"google.golang.org/grpc"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/sock"
)

// grantLimiter bounds the calls in flight of one grant and its `events
// --follow` streams, on both sockets together, so that one token cannot
// take every slot of its uid or socket from the grant's other users and
// from other tasks. A grant has exactly one token, so it is counted by its
// token's hash: that costs no store lookup before the call is admitted,
// and a call with an unknown token, counted the same way, is refused by
// the service right after. The host's admin token is not counted.
type grantLimiter struct {
	maxCalls, maxFollows int
	listTimeout          time.Duration
	admin                [sha256.Size]byte

	mu      sync.Mutex
	calls   map[[sha256.Size]byte]int
	follows map[[sha256.Size]byte]int
}

func newGrantLimiter(l limits.Limits, adminToken string) *grantLimiter {
	return &grantLimiter{
		maxCalls: l.MaxCallsPerGrant, maxFollows: l.MaxStreamsPerGrant, listTimeout: l.ListTimeout,
		admin: sha256.Sum256([]byte(adminToken)),
		calls: map[[sha256.Size]byte]int{}, follows: map[[sha256.Size]byte]int{},
	}
}

// key returns the token's counter key; ok is false for no token and for
// the admin token.
func (g *grantLimiter) key(ctx context.Context) (k [sha256.Size]byte, ok bool) {
	tok := authz.TokenFromContext(ctx)
	if tok == "" {
		return k, false
	}
	k = sha256.Sum256([]byte(tok))
	return k, subtle.ConstantTimeCompare(k[:], g.admin[:]) != 1
}

func (g *grantLimiter) acquire(m map[[sha256.Size]byte]int, k [sha256.Size]byte, max int, reason errdefs.Reason, what string) (func(), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m[k] >= max {
		return nil, errdefs.ResourceExhausted(reason, "this grant already has %d %s (limit %d); end some and retry", m[k], what, max).
			With("limit", max).Retry(time.Second)
	}
	m[k]++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if m[k]--; m[k] <= 0 {
			delete(m, k)
		}
	}, nil
}

func (g *grantLimiter) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	k, ok := g.key(ctx)
	if !ok {
		return h(ctx, req)
	}
	release, err := g.acquire(g.calls, k, g.maxCalls, errdefs.TooManyCallsPerGrant, "calls in flight (--max-calls-per-grant)")
	if err != nil {
		return nil, err
	}
	defer release()
	return h(ctx, req)
}

func (g *grantLimiter) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	var release []func()
	defer func() {
		for _, r := range release {
			r()
		}
	}()
	k, counted := g.key(ss.Context())
	if counted {
		r, err := g.acquire(g.calls, k, g.maxCalls, errdefs.TooManyCallsPerGrant, "calls in flight (--max-calls-per-grant)")
		if err != nil {
			return err
		}
		release = append(release, r)
	}
	if info.FullMethod != brokerv1.BrokerService_ListEvents_FullMethodName {
		return h(srv, ss)
	}
	ls := &listStream{ServerStream: ss, g: g, key: k, counted: counted, release: &release}
	err := h(srv, ls)
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
	key     [sha256.Size]byte
	counted bool
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
	if !s.counted {
		return nil
	}
	r, err := s.g.acquire(s.g.follows, s.key, s.g.maxFollows, errdefs.TooManyFollows, "'events --follow' streams (--max-streams-per-grant)")
	if err != nil {
		s.refused = err
		return err
	}
	*s.release = append(*s.release, r)
	return nil
}
