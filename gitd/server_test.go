package gitd

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/testenv"
	"github.com/bushost/bushost/internal/treesnap"
)

// serve starts the GitService of e on a Unix socket and returns a client.
func serve(t *testing.T, e *env) gitv1.GitServiceClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "git.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(grpcerr.UnaryServer), grpc.ChainStreamInterceptor(grpcerr.StreamServer))
	gitv1.RegisterGitServiceServer(srv, NewServer(e.svc))
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return gitv1.NewGitServiceClient(conn)
}

func withToken(tok string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

func pushStream(t *testing.T, c gitv1.GitServiceClient, tok string, b []byte) (*gitv1.PushWorkingResponse, error) {
	t.Helper()
	st, err := c.PushWorking(withToken(tok))
	if err != nil {
		return nil, err
	}
	if err := st.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: int64(len(b))}}}); err != nil {
		return st.CloseAndRecv()
	}
	for off := 0; off < len(b); off += 1000 {
		end := min(off+1000, len(b))
		if err := st.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: b[off:end]}}); err != nil {
			return st.CloseAndRecv()
		}
	}
	return st.CloseAndRecv()
}

// recvBundle collects a fetch stream: the first message's commit and the
// bundle's bytes, checking every chunk's size.
func recvBundle(t *testing.T, recv func() (string, []byte, error)) (string, []byte, error) {
	t.Helper()
	commit, _, err := recv()
	if err != nil {
		return "", nil, err
	}
	var buf bytes.Buffer
	for {
		_, chunk, err := recv()
		if err == io.EOF {
			return commit, buf.Bytes(), nil
		}
		if err != nil {
			return "", nil, err
		}
		if len(chunk) > MaxChunk {
			t.Fatalf("chunk of %d bytes", len(chunk))
		}
		buf.Write(chunk)
	}
}

func TestServerRoundTrip(t *testing.T) {
	e := newEnv(t)
	c := serve(t, e)
	e.auth.grant("worker", e.grant("t1"))
	e.auth.grant("reviewer", authz.Grant{ID: "r", Business: testBusiness, Project: testProject, Task: "t1", Caps: []string{authz.CapReviewVerdict}})
	e.auth.grant("nobody", authz.Grant{ID: "n", Business: testBusiness, Project: testProject, Task: "t1", Caps: []string{authz.CapEventRecord}})

	commit := e.commitFile("a.txt", strings.Repeat("line\n", 1000))
	res, err := pushStream(t, c, "worker", e.bundle("HEAD", "^main"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Commit != commit || res.Ref != "refs/work/t1" {
		t.Fatalf("push = %v", res)
	}

	// FetchMain: the worker and the reviewer may; the bundle holds main.
	for _, tok := range []string{"worker", "reviewer"} {
		st, err := c.FetchMain(withToken(tok), &gitv1.FetchMainRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got, b, err := recvBundle(t, func() (string, []byte, error) {
			m, err := st.Recv()
			return m.GetCommit(), m.GetChunk(), err
		})
		if err != nil {
			t.Fatalf("FetchMain as %s: %v", tok, err)
		}
		h := mustHeader(t, b)
		if got != e.main || len(h.Refs) != 1 || h.Refs[0].Name != MainRef || h.Refs[0].Commit != e.main || len(h.Prerequisites) != 0 {
			t.Fatalf("FetchMain: commit %s, header %+v", got, h)
		}
	}

	// FetchReview, thin against main.
	st, err := c.FetchReview(withToken("reviewer"), &gitv1.FetchReviewRequest{Have: e.main})
	if err != nil {
		t.Fatal(err)
	}
	got, b, err := recvBundle(t, func() (string, []byte, error) {
		m, err := st.Recv()
		return m.GetCommit(), m.GetChunk(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mustHeader(t, b)
	if got != commit || len(h.Refs) != 1 || h.Refs[0].Name != "refs/work/t1" || len(h.Prerequisites) != 1 || h.Prerequisites[0] != e.main {
		t.Fatalf("FetchReview: commit %s, header %+v", got, h)
	}

	// Codes: missing capability, unknown token, admin-only calls.
	cases := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"push without capability", func() error { _, err := pushStream(t, c, "reviewer", e.bundle("HEAD", "^main")); return err }, codes.PermissionDenied},
		{"push with bad token", func() error { _, err := pushStream(t, c, "forged", e.bundle("HEAD", "^main")); return err }, codes.Unauthenticated},
		{"review without capability", func() error {
			st, err := c.FetchReview(withToken("worker"), &gitv1.FetchReviewRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}, codes.PermissionDenied},
		{"main without capability", func() error {
			st, err := c.FetchMain(withToken("nobody"), &gitv1.FetchMainRequest{})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}, codes.PermissionDenied},
		{"add project as worker", func() error {
			_, err := c.AddProject(withToken("worker"), &gitv1.AddProjectRequest{Business: "b", Project: "p", Root: e.root})
			return err
		}, codes.PermissionDenied},
		{"add project hostile name", func() error {
			_, err := c.AddProject(withToken("admin"), &gitv1.AddProjectRequest{Business: "../x", Project: "p", Root: e.root})
			return err
		}, codes.InvalidArgument},
		{"sync unknown project", func() error {
			_, err := c.SyncProject(withToken("admin"), &gitv1.SyncProjectRequest{Business: "nope", Project: "p"})
			return err
		}, codes.NotFound},
		{"review have not a commit", func() error {
			st, err := c.FetchReview(withToken("reviewer"), &gitv1.FetchReviewRequest{Have: "--upload-pack=x"})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		if err := tc.call(); status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}

	add, err := c.AddProject(withToken("admin"), &gitv1.AddProjectRequest{Business: "acme", Project: "other", Root: e.root})
	if err != nil || !add.Created || add.Commit != e.main {
		t.Fatalf("AddProject = %v, %v", add, err)
	}
	if !e.auth.projects["acme/other"] {
		t.Fatal("AddProject did not register the project with the Authority")
	}
}

func mustHeader(t *testing.T, b []byte) *bundle.Header {
	t.Helper()
	h, err := bundle.ReadHeader(bufioReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestServerIdleTimeout: a push that sends its header and then nothing is
// cut after IdleTimeout and leaves nothing behind; so is one that stops
// mid-bundle.
func TestServerIdleTimeout(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.IdleTimeout = 300 * time.Millisecond })
	c := serve(t, e)
	e.auth.grant("worker", e.grant("t1"))
	e.commitFile("a.txt", strings.Repeat("data\n", 5000)+randomText(20000))
	b := e.bundle("HEAD", "^main")
	before := e.snapshot()
	for _, sendBytes := range []int{0, 100, len(b) / 2} {
		st, err := c.PushWorking(withToken("worker"))
		if err != nil {
			t.Fatal(err)
		}
		st.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{}}})
		if sendBytes > 0 {
			st.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: b[:sendBytes]}})
		}
		start := time.Now()
		// Receive without closing the send side: the client just stalls.
		var res gitv1.PushWorkingResponse
		err = st.RecvMsg(&res)
		if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "sent nothing") {
			t.Fatalf("stalled push after %d bytes: %v", sendBytes, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("cut after %v", d)
		}
		// The handler's deferred cleanup runs as it returns; give it a moment.
		waitFor(t, func() bool { return treesnap.Diff(before, e.snapshot()) == "" })
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the condition", cond)
}
