package integration

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
)

// stallingGit is a fake GitService: it sends the first half of a real
// bundle and then nothing, or takes a push's header and then reads
// nothing, until the client goes away. With fail set, every call fails
// with that message instead.
type stallingGit struct {
	gitv1.UnimplementedGitServiceServer
	bundle []byte
	commit string
	fail   string
}

func (s *stallingGit) FetchMain(_ *gitv1.FetchMainRequest, stream grpc.ServerStreamingServer[gitv1.FetchMainResponse]) error {
	if s.fail != "" {
		return status.Error(codes.FailedPrecondition, s.fail)
	}
	stream.Send(&gitv1.FetchMainResponse{Msg: &gitv1.FetchMainResponse_Commit{Commit: s.commit}})
	stream.Send(&gitv1.FetchMainResponse{Msg: &gitv1.FetchMainResponse_Chunk{Chunk: s.bundle[:len(s.bundle)/2]}})
	<-stream.Context().Done()
	return stream.Context().Err()
}

func (s *stallingGit) FetchReview(_ *gitv1.FetchReviewRequest, stream grpc.ServerStreamingServer[gitv1.FetchReviewResponse]) error {
	stream.Send(&gitv1.FetchReviewResponse{Msg: &gitv1.FetchReviewResponse_Commit{Commit: s.commit}})
	stream.Send(&gitv1.FetchReviewResponse{Msg: &gitv1.FetchReviewResponse_Chunk{Chunk: s.bundle[:len(s.bundle)/2]}})
	<-stream.Context().Done()
	return stream.Context().Err()
}

func (s *stallingGit) PushWorking(stream grpc.ClientStreamingServer[gitv1.PushWorkingRequest, gitv1.PushWorkingResponse]) error {
	stream.Recv()
	<-stream.Context().Done()
	return stream.Context().Err()
}

// fakeHome serves srv as git.sock in a new home with a token file, and
// returns the home and the token file.
func fakeHome(t *testing.T, srv gitv1.GitServiceServer) (string, string) {
	t.Helper()
	home := filepath.Join(baseDir(t), "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(home, "git.sock"))
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	gitv1.RegisterGitServiceServer(g, srv)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	tok := filepath.Join(filepath.Dir(home), "token")
	if err := os.WriteFile(tok, []byte("not-checked\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return home, tok
}

// Against a git service that stalls mid-bundle (or stops reading a push),
// fetch-main, fetch-review and push-working end within their --timeout,
// exit 3 naming the stall, and leave nothing: no new repository, no
// incoming objects directory, no change to an existing one.
func TestClientEndsAgainstStallingServer(t *testing.T) {
	base := baseDir(t)
	src := filepath.Join(base, "src")
	os.MkdirAll(src, 0o755)
	testGit(t, src, "init", "-q", "-b", "main")
	// Enough incompressible content that half a bundle is mid-pack.
	noise := make([]byte, 256<<10)
	for i := range noise {
		noise[i] = byte(i*7919 ^ i>>3)
	}
	os.WriteFile(filepath.Join(src, "noise.bin"), noise, 0o644)
	testGit(t, src, "add", ".")
	testGit(t, src, "commit", "-q", "-m", "seed")
	main := testGit(t, src, "rev-parse", "HEAD")
	bundlePath := filepath.Join(base, "main.bundle")
	testGit(t, src, "bundle", "create", "-q", bundlePath, "main")
	data, err := os.ReadFile(bundlePath)
	if err != nil {
		t.Fatal(err)
	}
	// A work repository for push-working and fetch-review: main, then a
	// commit of the worker's.
	work := filepath.Join(base, "work")
	testGit(t, base, "clone", "-q", src, work)
	testGit(t, work, "update-ref", "refs/remotes/bushost/main", main)
	os.WriteFile(filepath.Join(work, "a.txt"), []byte("a\n"), 0o644)
	testGit(t, work, "add", "a.txt")
	testGit(t, work, "commit", "-q", "-m", "work")

	home, tok := fakeHome(t, &stallingGit{bundle: data, commit: main})
	h := &Host{Home: home, client: bin(t, "bushost")}
	const timeout = 2 * time.Second
	for _, c := range []struct {
		name string
		args []string
		repo string
		new  bool // the command would make repo
	}{
		{"fetch-main into a new repository", []string{"fetch-main", "--repo", filepath.Join(base, "fresh")}, filepath.Join(base, "fresh"), true},
		{"fetch-main into an existing one", []string{"fetch-main", "--repo", work}, work, false},
		{"fetch-review", []string{"fetch-review", "--repo", work}, work, false},
		{"push-working", []string{"push-working", "--repo", work}, work, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var before string
			if !c.new {
				before = treeState(t, filepath.Join(c.repo, ".git"))
			}
			start := time.Now()
			out, errs, code := h.Run(t, nil, append([]string{"--token-file", tok, "--timeout", timeout.String()}, c.args...)...)
			took := time.Since(start)
			if code != 3 || !strings.Contains(errs, "no progress") {
				t.Fatalf("exit %d after %s, want 3 naming the stall\n%s%s", code, took, out, errs)
			}
			if took > timeout+15*time.Second {
				t.Fatalf("took %s with --timeout %s", took, timeout)
			}
			if c.new {
				if _, err := os.Stat(c.repo); !os.IsNotExist(err) {
					t.Fatalf("a stalled fetch left %s behind (%v)", c.repo, err)
				}
				return
			}
			if after := treeState(t, filepath.Join(c.repo, ".git")); after != before {
				t.Fatalf("a stalled %s changed the repository:\nbefore:\n%s\nafter:\n%s", c.name, before, after)
			}
		})
	}
}

// Text from the server never reaches the terminal raw: an event whose data
// holds ESC, a C1 CSI, DEL and a bidi override prints them escaped, also
// with --json (as \uXXXX, still valid JSON); a server's error message with
// ESC sequences is printed escaped.
func TestClientEscapesServerText(t *testing.T) {
	h := startHost(t)
	h.AddProject(t, "acme", "web")
	worker := h.Grant(t, "acme", "web", "t1", "worker", "event.record")
	evil := "\x1b]0;owned\x07\x1b[2J csi\u009b31m del\x7f bidi\u202eabc"
	raw, _ := json.Marshal(map[string]string{"note": evil})
	h.Must(t, "--token-file", worker, "event", "record", "--type", "note", "--data", string(raw))
	rawRunes := []rune{0x1b, 0x07, 0x9b, 0x7f, 0x202e}
	noRaw := func(what, s string) {
		t.Helper()
		for _, r := range rawRunes {
			if strings.ContainsRune(s, r) {
				t.Errorf("%s printed %U raw: %q", what, r, s)
			}
		}
	}
	text := h.Must(t, "events")
	noRaw("events", text)
	for _, esc := range []string{`\u001b`, `\u009b`, `\u007f`, `\u202e`} {
		if !strings.Contains(text, esc) {
			t.Errorf("events lacks %s: %q", esc, text)
		}
	}
	js := h.Must(t, "events", "--json")
	noRaw("events --json", js)
	found := false
	for _, line := range strings.Split(js, "\n") {
		var ev struct {
			Data map[string]any `json:"data"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("events --json line %q: %v", line, err)
		}
		if ev.Data["note"] == evil {
			found = true
		}
	}
	if !found {
		t.Fatalf("events --json lost the event's data: %q", js)
	}
	for _, esc := range []string{`\u001b`, `\u009b`, `\u007f`, `\u202e`} {
		if !strings.Contains(js, esc) {
			t.Errorf("events --json lacks %s: %q", esc, js)
		}
	}

	msg := "refused \x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\ \x1b[8mhidden\x1b[0m"
	home, tok := fakeHome(t, &stallingGit{fail: msg})
	fake := &Host{Home: home, client: bin(t, "bushost")}
	out, errs, code := fake.Run(t, nil, "--token-file", tok, "fetch-main", "--repo", filepath.Join(baseDir(t), "r"))
	if code == 0 {
		t.Fatal("the failing server's fetch succeeded")
	}
	noRaw("the error", out+errs)
	if !strings.Contains(errs, `\u001b]8;;http://evil\u001b\click`) {
		t.Errorf("the error: %q, want the escapes shown", errs)
	}
}
