package integration

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
)

// grantWithID issues a grant (the task added first) and returns its id and
// token.
func grantWithID(t *testing.T, h *Host, business, project, task, role, caps, ttl string) (id, token string) {
	t.Helper()
	h.Must(t, "task", "add", "--business", business, "--project", project, "--task", task)
	args := []string{"--json", "grant", "--business", business, "--project", project, "--task", task, "--role", role, "--cap", caps}
	if ttl != "" {
		args = append(args, "--ttl", ttl)
	}
	var g struct {
		ID    string `json:"grant_id"`
		Token string `json:"token"`
	}
	if err := json.Unmarshal([]byte(h.Must(t, args...)), &g); err != nil || g.ID == "" {
		t.Fatalf("grant --json: %v", err)
	}
	return g.ID, g.Token
}

// follow starts 'bushost events --follow' with token and returns once it
// printed its first event; the channel gets its exit.
func follow(t *testing.T, h *Host, token string) (*exec.Cmd, *strings.Builder, chan error) {
	t.Helper()
	cmd := exec.Command(h.client, "--home", h.Home, "events", "--follow")
	cmd.Env = append(cleanEnv(), "BUS_TOKEN="+token)
	errb := &strings.Builder{}
	cmd.Stderr = errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	br := bufio.NewReader(out)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatalf("events --follow printed nothing: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		io.Copy(io.Discard, br)
		done <- cmd.Wait()
	}()
	return cmd, errb, done
}

func wantEnded(t *testing.T, done chan error, errb *strings.Builder, words ...string) {
	t.Helper()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("events --follow ended with exit 0")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("events --follow still running 30s after its grant ended")
	}
	for _, w := range words {
		if !strings.Contains(errb.String(), w) {
			t.Errorf("events --follow's error does not say %q: %s", w, errb.String())
		}
	}
}

// events --follow ends when its grant is revoked, and when it expires.
func TestFollowEndsWithItsGrant(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	id, tok := grantWithID(t, h, "acme", "web", "t1", "watcher", "event.record", "")
	_, errb, done := follow(t, h, tok)
	h.Must(t, "revoke", id)
	wantEnded(t, done, errb, "PermissionDenied", id, "revoked")

	_, tok2 := grantWithID(t, h, "acme", "web", "t2", "watcher", "event.record", "3s")
	_, errb2, done2 := follow(t, h, tok2)
	wantEnded(t, done2, errb2, "PermissionDenied", "expired")
}

// bigRoot makes a project root whose main carries size random bytes, so
// that its bundle is many chunks.
func bigRoot(t *testing.T, dir string, size int) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	testGit(t, dir, "init", "-q", "-b", "main")
	buf := make([]byte, size)
	rand.Read(buf)
	if err := os.WriteFile(filepath.Join(dir, "blob.bin"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, dir, "add", "blob.bin")
	testGit(t, dir, "commit", "-q", "-m", "big")
}

// slowConn dials a socket with small flow-control windows, so the server
// cannot send far ahead of what the test reads.
func slowConn(t *testing.T, h *Host, token string) (*grpc.ClientConn, metadata.MD) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(h.Home, "git.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, metadata.Pairs("authorization", "Bearer "+token)
}

func reasonOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// A fetch of main or of a review ends with PermissionDenied when its grant
// is revoked while chunks are still to be sent.
func TestFetchEndsAtRevoke(t *testing.T) {
	const size = 12 << 20
	h := startHost(t)
	root := filepath.Join(filepath.Dir(h.Home), "root-big")
	bigRoot(t, root, size)
	h.Must(t, "project", "add", "--business", "acme", "--project", "web", "--root", root)

	recvUntilEnd := func(t *testing.T, recv func() ([]byte, error), revoke func()) (int, error) {
		n := 0
		for i := 0; ; i++ {
			b, err := recv()
			if err != nil {
				return n, err
			}
			n += len(b)
			if i == 1 {
				revoke()
			}
		}
	}
	t.Run("main", func(t *testing.T) {
		id, tok := grantWithID(t, h, "acme", "web", "w1", "coder", "git.push.working", "")
		conn, md := slowConn(t, h, tok)
		ctx := metadata.NewOutgoingContext(t.Context(), md)
		stream, err := gitv1.NewGitServiceClient(conn).FetchMain(ctx, &gitv1.FetchMainRequest{})
		if err != nil {
			t.Fatal(err)
		}
		n, err := recvUntilEnd(t, func() ([]byte, error) {
			m, err := stream.Recv()
			return m.GetChunk(), err
		}, func() { h.Must(t, "revoke", id) })
		if status.Code(err) != codes.PermissionDenied || reasonOf(err) != "GRANT_REVOKED" || !strings.Contains(err.Error(), id) {
			t.Fatalf("fetch main after revoke ended with %v (reason %q), after %d bytes", err, reasonOf(err), n)
		}
		if n >= size {
			t.Fatalf("the whole bundle (%d bytes) was sent after the revoke", n)
		}
	})
	t.Run("review", func(t *testing.T) {
		// A push for the reviewer to fetch: main's big blob plus a commit.
		wtok := filepath.Join(filepath.Dir(h.Home), "tok-w2")
		_, w := grantWithID(t, h, "acme", "web", "w2", "coder", "git.push.working", "")
		os.WriteFile(wtok, []byte(w), 0o600)
		work := filepath.Join(filepath.Dir(h.Home), "work-w2")
		runAs(t, h, wtok, 0, "fetch-main", "--repo", work)
		os.WriteFile(filepath.Join(work, "x.txt"), []byte("x\n"), 0o644)
		testGit(t, work, "add", "x.txt")
		testGit(t, work, "commit", "-q", "-m", "x")
		runAs(t, h, wtok, 0, "push-working", "--repo", work)

		id, tok := grantWithID(t, h, "acme", "web", "w2", "reviewer", "review.verdict", "")
		conn, md := slowConn(t, h, tok)
		ctx := metadata.NewOutgoingContext(t.Context(), md)
		stream, err := gitv1.NewGitServiceClient(conn).FetchReview(ctx, &gitv1.FetchReviewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		n, err := recvUntilEnd(t, func() ([]byte, error) {
			m, err := stream.Recv()
			return m.GetChunk(), err
		}, func() { h.Must(t, "revoke", id) })
		if status.Code(err) != codes.PermissionDenied || reasonOf(err) != "GRANT_REVOKED" {
			t.Fatalf("fetch review after revoke ended with %v (reason %q), after %d bytes", err, reasonOf(err), n)
		}
		if n >= size {
			t.Fatalf("the whole bundle (%d bytes) was sent after the revoke", n)
		}
	})
}

// A push whose grant is revoked while its bundle streams in is refused in
// the transaction that would record it, and leaves no ref, no pack and no
// event.
func TestPushRevokedMidStream(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	id, tok := grantWithID(t, h, "acme", "web", "t1", "coder", "git.push.working", "")
	tokFile := filepath.Join(filepath.Dir(h.Home), "tok-t1")
	os.WriteFile(tokFile, []byte(tok), 0o600)
	work := filepath.Join(filepath.Dir(h.Home), "work")
	runAs(t, h, tokFile, 0, "fetch-main", "--repo", work)
	buf := make([]byte, 4<<20)
	rand.Read(buf)
	os.WriteFile(filepath.Join(work, "blob.bin"), buf, 0o644)
	testGit(t, work, "add", "blob.bin")
	testGit(t, work, "commit", "-q", "-m", "work")
	bundleFile := filepath.Join(filepath.Dir(h.Home), "work.bundle")
	testGit(t, work, "bundle", "create", "-q", bundleFile, "HEAD", "^refs/remotes/bushost/main")
	body, err := os.ReadFile(bundleFile)
	if err != nil {
		t.Fatal(err)
	}
	repo := h.PoolRepo("acme", "web")
	packsBefore := entries(t, filepath.Join(repo, "objects", "pack"))
	eventsBefore := len(brokerEvents(t, h))

	conn, md := slowConn(t, h, tok)
	ctx := metadata.NewOutgoingContext(t.Context(), md)
	stream, err := gitv1.NewGitServiceClient(conn).PushWorking(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: int64(len(body))}}}); err != nil {
		t.Fatal(err)
	}
	half := len(body) / 2
	send := func(b []byte) {
		for off := 0; off < len(b); off += 1 << 20 {
			if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: b[off:min(off+1<<20, len(b))]}}); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
		}
	}
	send(body[:half])
	h.Must(t, "revoke", id)
	send(body[half:])
	_, err = stream.CloseAndRecv()
	if err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("push revoked mid-stream: %v", err)
	}
	if out, _ := exec.Command("git", "--git-dir", repo, "for-each-ref", "refs/work/").Output(); len(out) != 0 {
		t.Fatalf("a ref was left: %s", out)
	}
	if got := entries(t, filepath.Join(repo, "objects", "pack")); strings.Join(got, ",") != strings.Join(packsBefore, ",") {
		t.Fatalf("packs changed: %v -> %v", packsBefore, got)
	}
	evs := brokerEvents(t, h)
	if len(evs) != eventsBefore+1 || evs[len(evs)-1].Type != "grant.revoked" {
		t.Fatalf("events after the refused push: %d -> %d (last %+v)", eventsBefore, len(evs), evs[len(evs)-1])
	}
	if q, _ := filepath.Glob(filepath.Join(repo, "objects", "*incoming-*")); len(q) != 0 {
		t.Fatalf("quarantine left: %v", q)
	}
}
