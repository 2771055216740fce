package integration

import (
	"context"
	"crypto/rand"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/testenv"
)

// treeState lists every file under dir with its size, for "nothing left
// behind" comparisons.
func treeState(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		lines = append(lines, rel+" "+info.Mode().String()+" "+strconv.FormatInt(info.Size(), 10))
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// A disk that fills up during a push refuses that push cleanly (nothing of
// it left in the repositories), and the next push after space is freed
// succeeds. The home is on a small tmpfs the test mounts (root only).
func TestDiskFullDuringPush(t *testing.T) {
	testenv.NeedRoot(t, "mounting a tmpfs needs root")
	mnt := filepath.Join(baseDir(t), "mnt")
	os.MkdirAll(mnt, 0o755)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m,mode=0755", "tmpfs", mnt).CombinedOutput(); err != nil {
		testenv.Missing(t, "tmpfs", "a push onto a full disk (mount: %v %s)", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })

	h := startHostWith(t, hostOpts{Home: filepath.Join(mnt, "home")})
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	work := filepath.Join(baseDir(t), "work") // the worker's side is not on the small disk
	h.Must(t, "--token-file", worker, "fetch-main", "--repo", work)
	repos := filepath.Join(h.Home, "repos")
	before := treeState(t, repos)

	// 40 MB that git cannot compress: more than the disk has.
	big := make([]byte, 40<<20)
	rand.Read(big)
	os.WriteFile(filepath.Join(work, "big.bin"), big, 0o644)
	testGit(t, work, "add", "big.bin")
	testGit(t, work, "commit", "-q", "-m", "too big for the disk")
	_, errs, code := h.Run(t, nil, "--token-file", worker, "push-working", "--repo", work)
	if code == 0 {
		t.Fatal("push onto a full disk accepted")
	}
	if !strings.Contains(errs, "ResourceExhausted") && !strings.Contains(strings.ToLower(errs), "space") {
		t.Fatalf("refusal does not say the disk is full: %s", errs)
	}
	if after := treeState(t, repos); after != before {
		t.Fatalf("the refused push left files behind:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// Space is back (the big commit dropped): the next push succeeds.
	testGit(t, work, "reset", "-q", "--hard", "HEAD~1")
	os.WriteFile(filepath.Join(work, "small.txt"), []byte("small\n"), 0o644)
	testGit(t, work, "add", "small.txt")
	testGit(t, work, "commit", "-q", "-m", "small")
	commit := h.Must(t, "--token-file", worker, "push-working", "--repo", work)
	if got := testGit(t, h.TaskRepo("acme", "web", "t1"), "rev-parse", "refs/work/t1"); got != commit {
		t.Fatalf("refs/work/t1 = %s, want %s", got, commit)
	}
	h.FsckProject(t, "acme", "web", "--no-dangling")
}

// A push stream that sends its header and then nothing, or stops in the
// middle of the bundle, is cut after the idle timeout and leaves nothing
// behind; the daemon keeps serving others meanwhile.
func TestStalledPushStreamsAreCut(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--idle-timeout", "700ms"}})
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	work := filepath.Join(baseDir(t), "work")
	h.Must(t, "--token-file", worker, "fetch-main", "--repo", work)
	os.WriteFile(filepath.Join(work, "a.txt"), []byte("a\n"), 0o644)
	testGit(t, work, "add", "a.txt")
	testGit(t, work, "commit", "-q", "-m", "a")
	bundle := filepath.Join(filepath.Dir(work), "a.bundle")
	testGit(t, work, "bundle", "create", "-q", bundle, "refs/remotes/bushost/main..HEAD")
	data, _ := os.ReadFile(bundle)
	repos := filepath.Join(h.Home, "repos")
	before := treeState(t, repos)
	tok := strings.TrimSpace(readText(t, worker))

	for _, c := range []struct {
		name string
		send int // bytes of the bundle sent before going quiet
	}{{"header then nothing", 0}, {"mid-bundle", len(data) / 2}} {
		t.Run(c.name, func(t *testing.T) {
			// The stream is never half-closed: only the server's idle
			// timer can end it.
			conn, ctx := dialHome(t, h.Home, "git.sock", tok)
			ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			stream, err := gitv1.NewGitServiceClient(conn).PushWorking(ctx)
			if err != nil {
				t.Fatal(err)
			}
			stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{}}})
			if c.send > 0 {
				stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: data[:c.send]}})
			}
			start := time.Now()
			// Others are served while this stream hangs.
			h.Must(t, "events", "--json")
			var resp gitv1.PushWorkingResponse
			err = stream.RecvMsg(&resp)
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("stalled stream ended with %v, want DeadlineExceeded from the server", err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("cut after %v, want about the 700ms idle timeout", d)
			}
		})
	}
	if after := treeState(t, repos); after != before {
		t.Fatalf("stalled pushes left files behind:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// And a whole push still works.
	h.Must(t, "--token-file", worker, "push-working", "--repo", work)
}

func readText(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Beyond the in-flight limit a caller gets ResourceExhausted at once, and
// the daemon stays responsive to others when the flood ends.
func TestInFlightLimitThroughDaemon(t *testing.T) {
	metricsSock := filepath.Join(baseDir(t), "metrics.sock")
	h := startHostWith(t, hostOpts{Args: []string{"--max-in-flight", "2", "--idle-timeout", "10s", "--metrics-addr", "unix:" + metricsSock}})
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	tok := strings.TrimSpace(readText(t, worker))
	conn, ctx := dialHome(t, h.Home, "git.sock", tok)
	ctx, cancel := context.WithCancel(ctx)
	c := gitv1.NewGitServiceClient(conn)
	// Two pushes that hold their slots.
	for i := 0; i < 2; i++ {
		s, err := c.PushWorking(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{}}})
	}
	testenv.WaitFor(t, 20*time.Second, "the two pushes served at once", func() bool {
		return strings.Contains(scrapeUnix(t, metricsSock), `bushost_calls_in_flight{socket="git"} 2`)
	})
	s, err := c.PushWorking(ctx)
	if err == nil {
		s.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{}}})
		var resp gitv1.PushWorkingResponse
		err = s.RecvMsg(&resp)
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "in flight") {
		t.Fatalf("third call: %v, want ResourceExhausted naming the limit", err)
	}
	// The broker socket has its own limit and still serves.
	bconn, bctx := dialHome(t, h.Home, "broker.sock", adminTokenOf(t, h))
	if _, err := brokerv1.NewBrokerServiceClient(bconn).VerifyLog(bctx, &brokerv1.VerifyLogRequest{}); err != nil {
		t.Fatalf("broker socket starved by the git socket's flood: %v", err)
	}
	cancel()
	// Once the flood ends, calls get through again.
	var errs string
	if !testenv.Poll(10*time.Second, func() bool {
		var code int
		_, errs, code = h.Run(t, nil, "--token-file", worker, "fetch-main", "--repo", filepath.Join(baseDir(t), "w"))
		return code == 0
	}) {
		t.Fatalf("git socket still refusing after the flood: %s", errs)
	}
}
