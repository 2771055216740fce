package broker

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/metadata"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/pgtest"
)

// The rules are tested once, against both stores: each test calls eachStore
// and gets a fresh broker on SQLite and on PostgreSQL.

var pgWarn sync.Once

type storeKind struct {
	name string
	dsn  func(t testing.TB) string
}

var storeKinds = []storeKind{
	{"sqlite", func(t testing.TB) string { return filepath.Join(t.TempDir(), "broker.db") }},
	{"postgres", pgSchemaDSN},
}

// pgSchemaDSN makes a schema of its own for the test, so that tests run in
// parallel, and drops it at cleanup.
func pgSchemaDSN(t testing.TB) string {
	t.Helper()
	if !pgtest.Configured() {
		pgWarn.Do(func() {
			fmt.Fprintf(os.Stderr, "\n*** %s is not set: THE POSTGRESQL HALF OF THE BROKER SUITE IS SKIPPED ***\n\n", pgtest.Env)
		})
	}
	return pgtest.SchemaDSN(t, "t", "PostgreSQL store")
}

// env is one broker under test with its server and admin token.
type env struct {
	t     testing.TB
	b     *Broker
	srv   brokerv1.BrokerServiceServer
	admin string
	dsn   string
}

const adminToken = "admin-token-for-tests"

func eachStore(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			fn(t, newEnv(t, k.dsn(t)))
		})
	}
}

func newEnv(t testing.TB, dsn string) *env {
	t.Helper()
	return newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken})
}

// testKey signs what the tests' brokers append, unless a test gives its
// own (two hosts with keys of their own: signing_test.go).
var testKey = func() ed25519.PrivateKey {
	k, _, err := NewSigningKey()
	if err != nil {
		panic(err)
	}
	return k
}()

func withToken(tok string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
}

func (e *env) host() context.Context { return withToken(e.admin) }

// project registers business/project as gitd does when the host adds it.
func (e *env) project(business, project string) {
	e.t.Helper()
	if err := e.b.EnsureProject(context.Background(), business, project); err != nil {
		e.t.Fatalf("EnsureProject: %v", err)
	}
}

func (e *env) task(business, project, task string) {
	e.t.Helper()
	if _, err := e.srv.AddTask(e.host(), &brokerv1.AddTaskRequest{Business: business, Project: project, Task: task}); err != nil {
		e.t.Fatalf("AddTask: %v", err)
	}
}

// actor is a grant holder as the tests use it.
type actor struct {
	ID    string
	Token string
	G     authz.Grant
}

func (a actor) ctx() context.Context { return withToken(a.Token) }

func (e *env) grant(business, project, task, role string, caps ...string) actor {
	e.t.Helper()
	r, err := e.srv.CreateGrant(e.host(), &brokerv1.CreateGrantRequest{Business: business, Project: project, Task: task, Role: role, Capabilities: caps})
	if err != nil {
		e.t.Fatalf("CreateGrant: %v", err)
	}
	g, err := e.b.Authorize(context.Background(), r.Token, caps[0])
	if err != nil {
		e.t.Fatalf("Authorize new grant: %v", err)
	}
	return actor{ID: r.GrantId, Token: r.Token, G: g}
}

// push records a push of commit (made of c) by a, as gitd does: from the
// task's latest recorded push.
func (e *env) push(a actor, c byte) error {
	prev, _, err := e.b.LastPush(context.Background(), a.G.Business, a.G.Project, a.G.Task)
	if err != nil {
		return err
	}
	return e.pushFrom(a, c, prev)
}

// pushFrom records a push of commit (made of c) by a that names previous
// as the commit it fast-forwards.
func (e *env) pushFrom(a actor, c byte, previous string) error {
	return e.b.RecordPush(context.Background(), a.G, authz.Push{
		Business: a.G.Business, Project: a.G.Project, Task: a.G.Task,
		Commit: commit(c), Previous: previous, Ref: "refs/work/" + a.G.Task,
	}, authz.Peer{PID: 42, UID: 1000, GID: 1000})
}

func commit(c byte) string { return strings.Repeat(string("0123456789abcdef"[c%16]), 40) }

// head is the log's last seq.
func (e *env) head() int64 {
	e.t.Helper()
	seq, _, err := e.b.st.read().head(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return seq
}

// refused checks that err has code want and that the log did not grow
// from before.
func (e *env) refused(err error, want errdefs.Kind, before int64, what string) {
	e.t.Helper()
	if err == nil {
		e.t.Fatalf("%s: accepted, want %s", what, want)
	}
	if got := codesOf(err); got != want {
		e.t.Fatalf("%s: got %s (%v), want %s", what, got, err, want)
	}
	if h := e.head(); h != before {
		e.t.Fatalf("%s: refused but the log grew from %d to %d", what, before, h)
	}
}

func (e *env) events(f Filter) []Event {
	e.t.Helper()
	var out []Event
	if err := e.b.Events(context.Background(), f, 0, false, func(ev Event) error { out = append(out, ev); return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) verify() {
	e.t.Helper()
	v, err := e.b.VerifyLog(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	if !v.OK {
		e.t.Fatalf("log does not verify: %+v", v)
	}
}

// codesOf is the code err has, or would have once sent: a domain error of
// the Broker's own methods or a status from the service alike.
func codesOf(err error) errdefs.Kind { return errdefs.Of(err).Kind }
