package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/testenv"
)

// The home's files have the modes docs/architecture.md gives them.
func TestDaemonHomeModes(t *testing.T) {
	h := startHost(t)
	want := map[string]os.FileMode{
		"":            0o700 | os.ModeDir,
		"git.sock":    0o660 | os.ModeSocket,
		"broker.sock": 0o660 | os.ModeSocket,
		"admin.token": 0o600,
		"repos":       0o700 | os.ModeDir,
	}
	for name, mode := range want {
		fi, err := os.Stat(filepath.Join(h.Home, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModeType | os.ModePerm); got != mode {
			t.Errorf("%s: mode %v, want %v", name, got, mode)
		}
	}
	if _, err := os.Stat(filepath.Join(h.Home, "broker.db")); err != nil {
		t.Errorf("embedded broker store missing: %v", err)
	}
	// The token survives a restart unchanged.
	tok, _ := os.ReadFile(filepath.Join(h.Home, "admin.token"))
	h.Restart(t)
	tok2, _ := os.ReadFile(filepath.Join(h.Home, "admin.token"))
	if string(tok) != string(tok2) || len(strings.TrimSpace(string(tok))) != 64 {
		t.Fatalf("admin token changed or malformed across restart: %q -> %q", tok, tok2)
	}
}

// A second bushostd on the same home refuses to start, names the first, and
// the first keeps serving.
func TestSecondDaemonOnSameHomeRefused(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	out, err := exec.Command(bin(t, "bushostd"), "serve", "--home", h.Home).CombinedOutput()
	if err == nil {
		t.Fatalf("second bushostd started:\n%s", out)
	}
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v", err)
	}
	if want := fmt.Sprintf("bushostd pid %d", h.PID()); !strings.Contains(string(out), want) {
		t.Fatalf("refusal does not name the first daemon (%q):\n%s", want, out)
	}
	// The first still answers on both sockets.
	h.Must(t, "task", "add", "--business", "acme", "--project", "web", "--task", "t1")
	for _, s := range []string{"git.sock", "broker.sock"} {
		if fi, err := os.Stat(filepath.Join(h.Home, s)); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Fatalf("%s gone after the refused start: %v", s, err)
		}
	}
}

// A home that is a file, an admin token readable by others: refused with
// the reason, nothing served.
func TestDaemonRefusesUnsafeHome(t *testing.T) {
	base := baseDir(t)
	file := filepath.Join(base, "file")
	os.WriteFile(file, []byte("x"), 0o600)
	out, err := exec.Command(bin(t, "bushostd"), "serve", "--home", file).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a directory") {
		t.Fatalf("home that is a file: %v\n%s", err, out)
	}
	home := filepath.Join(base, "home")
	os.MkdirAll(home, 0o700)
	os.WriteFile(filepath.Join(home, "admin.token"), []byte(strings.Repeat("a", 64)), 0o644)
	out, err = exec.Command(bin(t, "bushostd"), "serve", "--home", home).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "readable by others") {
		t.Fatalf("world-readable token: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(home, "git.sock")); !os.IsNotExist(err) {
		t.Fatal("a socket was left by a refused start")
	}
}

func TestDaemonUsage(t *testing.T) {
	out, err := exec.Command(bin(t, "bushostd"), "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "bushostd serve [--home DIR]") {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	out, err = exec.Command(bin(t, "bushostd"), "serve", "--bogus").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Fatalf("bad flag: %v\n%s", err, out)
	}
}

func dialHome(t testing.TB, home, socket, token string) (*grpc.ClientConn, context.Context) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(home, socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	return conn, ctx
}

func adminTokenOf(t *testing.T, h *Host) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.Home, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// SIGTERM drains: a push in flight finishes and is accepted, calls after the
// signal are refused, and bushostd exits 0 in bounded time.
func TestSigtermDrains(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	tokFile := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	tok, _ := os.ReadFile(tokFile)
	work := filepath.Join(baseDir(t), "work")
	h.Must(t, "--token-file", tokFile, "fetch-main", "--repo", work)
	os.WriteFile(filepath.Join(work, "a.txt"), []byte("a\n"), 0o644)
	testGit(t, work, "add", "a.txt")
	testGit(t, work, "commit", "-q", "-m", "a")
	bundle := filepath.Join(filepath.Dir(work), "b.bundle")
	testGit(t, work, "bundle", "create", "-q", bundle, "refs/remotes/bushost/main..HEAD")
	data, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}

	conn, ctx := dialHome(t, h.Home, "git.sock", strings.TrimSpace(string(tok)))
	stream, err := gitv1.NewGitServiceClient(conn).PushWorking(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: int64(len(data))}}}); err != nil {
		t.Fatal(err)
	}
	half := len(data) / 2
	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: data[:half]}}); err != nil {
		t.Fatal(err)
	}
	// The push is in flight (its quarantine made): now ask the daemon to
	// stop, and go on once it says it drains.
	testenv.WaitFor(t, 20*time.Second, "the push's quarantine", func() bool { return found(filepath.Join(h.Home, "repos"), bundlePrefix) })
	start := time.Now()
	var stopErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); stopErr = h.Stop(t) }()
	testenv.WaitFor(t, 20*time.Second, "bushostd to say it drains", func() bool {
		b, _ := os.ReadFile(h.Log)
		return strings.Contains(string(b), "msg=draining")
	})

	// A new call on a new connection is not served.
	bconn, bctx := dialHome(t, h.Home, "broker.sock", adminTokenOf(t, h))
	cctx, cancel := context.WithTimeout(bctx, 2*time.Second)
	_, err = brokerv1.NewBrokerServiceClient(bconn).VerifyLog(cctx, &brokerv1.VerifyLogRequest{})
	cancel()
	if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
		t.Fatalf("call during drain: %v, want Unavailable", err)
	}

	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: data[half:]}}); err != nil {
		t.Fatalf("push in flight cut by the drain: %v", err)
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		t.Fatalf("push in flight refused during drain: %v", err)
	}
	head := testGit(t, work, "rev-parse", "HEAD")
	if resp.Commit != head {
		t.Fatalf("pushed %s, want %s", resp.Commit, head)
	}
	wg.Wait()
	if stopErr != nil {
		t.Fatalf("bushostd did not exit 0 after SIGTERM: %v", stopErr)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("drain took %v", d)
	}
	// The push stands after the restart.
	h.Restart(t)
	repo := h.TaskRepo("acme", "web", "t1")
	if got := testGit(t, repo, "rev-parse", "refs/work/t1"); got != head {
		t.Fatalf("refs/work/t1 = %s, want %s", got, head)
	}
}
