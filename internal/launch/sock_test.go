package launch

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/bushost/bushost/internal/errdefs"
)

// TestGrantCalls: a grant's calls past --max-calls-per-grant are refused
// TOO_MANY_CALLS_PER_GRANT while its first ones are in flight; another
// grant's and the host's are not counted against it; a slot is freed when
// its call ends.
func TestGrantCalls(t *testing.T) {
	unary := grantCalls(2, "admin")
	with := func(tok string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
	}
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	blocking := func(context.Context, any) (any, error) {
		entered <- struct{}{}
		<-release
		return nil, nil
	}
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := unary(with("lead"), nil, &grpc.UnaryServerInfo{}, blocking)
			done <- err
		}()
	}
	<-entered
	<-entered
	quick := func(context.Context, any) (any, error) { return nil, nil }
	if _, err := unary(with("lead"), nil, &grpc.UnaryServerInfo{}, quick); errdefs.ReasonOf(err) != errdefs.TooManyCallsPerGrant {
		t.Fatalf("a third call of the grant: %v, want TOO_MANY_CALLS_PER_GRANT", err)
	}
	for _, tok := range []string{"other", "admin"} {
		if _, err := unary(with(tok), nil, &grpc.UnaryServerInfo{}, quick); err != nil {
			t.Errorf("a call of %s: %v", tok, err)
		}
	}
	close(release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if _, err := unary(with("lead"), nil, &grpc.UnaryServerInfo{}, quick); err != nil {
		t.Errorf("the grant's call once the others ended: %v", err)
	}
}
