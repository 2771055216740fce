package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/sock"
)

// Pushing a bundle file by passing its descriptor (docs/git-service.md,
// "Pushing a bundle file"): the CLI's push, hostile descriptors from a
// client of our own, and the fallback to the byte stream.

// fdWork makes a project with a worker's clone one commit ahead of main,
// and a bundle file of that commit; it returns the bundle, its commit and a
// push token.
func fdWork(t *testing.T, h *Host, project string) (bundle, commit, tok string) {
	t.Helper()
	root := h.AddProject(t, "b", project)
	dir := filepath.Dir(h.Home)
	work := filepath.Join(dir, "work-"+project)
	testGit(t, dir, "clone", "-q", root, work)
	os.WriteFile(filepath.Join(work, "f.txt"), []byte("work of "+project+"\n"), 0o644)
	testGit(t, work, "add", "f.txt")
	testGit(t, work, "commit", "-q", "-m", "work")
	bundle = bundleFile(t, work, dir, "fd-"+project, "HEAD", "^origin/main")
	return bundle, testGit(t, work, "rev-parse", "HEAD"), h.Grant(t, "b", project, "t", "worker", "git.push.working")
}

// fdPush pushes through a connection of its own, passing f as descriptor
// number seq (0: the number Pass gives). It returns the call's error and
// whether the daemon said it took the file.
func fdPush(t *testing.T, h *Host, tokFile string, f *os.File, seq uint64) (commit string, accepted bool, err error) {
	t.Helper()
	tok, rerr := os.ReadFile(tokFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	d := &sock.FDDialer{Path: filepath.Join(h.Home, "git.sock")}
	conn, cerr := grpc.NewClient("unix://"+d.Path, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(d.Dial))
	if cerr != nil {
		t.Fatal(cerr)
	}
	defer conn.Close()
	n := d.Pass(f)
	if seq == 0 {
		seq = n
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+strings.TrimSpace(string(tok)), sock.PassedFDKey, fmt.Sprint(seq))
	stream, err := gitv1.NewGitServiceClient(conn).PushWorking(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The announced size is a lie on purpose: the daemon must not use it.
	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: 1}}}); err != nil {
		t.Fatal(err)
	}
	res, err := stream.CloseAndRecv()
	md, _ := stream.Header()
	acc := md.Get(sock.PushFDKey)
	return res.GetCommit(), len(acc) == 1 && acc[0] == sock.FDAccepted, err
}

// nothingLeft checks that project's repositories hold no quarantine and no
// work ref, and that the log gained no event since before.
func nothingLeft(t *testing.T, h *Host, project string, eventsBefore int) {
	t.Helper()
	filepath.WalkDir(filepath.Join(h.Home, "repos", "b", project), func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), bundlePrefix) {
			t.Errorf("quarantine left: %s", p)
		}
		return nil
	})
	if _, err := os.Stat(h.TaskRepo("b", project, "t")); err == nil {
		if out := testGit(t, h.TaskRepo("b", project, "t"), "for-each-ref", "refs/work/"); out != "" {
			t.Errorf("a work ref moved: %s", out)
		}
	}
	if n := len(brokerEvents(t, h)); n != eventsBefore {
		t.Errorf("events: %d before, %d after a refused push", eventsBefore, n)
	}
}

// The CLI passes a bundle file's descriptor; the daemon takes it (the
// call's log line counts the bytes it read from it: passed=N), and the push lands like a streamed one.
func TestPushBundleByDescriptor(t *testing.T) {
	h := startHostWith(t, hostOpts{})
	bundle, commit, tok := fdWork(t, h, "p")
	out, errs, code := h.Run(t, nil, "--token-file", tok, "push-working", "--bundle", bundle)
	if code != 0 || strings.TrimSpace(out) != commit {
		t.Fatalf("push: exit %d: %s%s", code, out, errs)
	}
	if got := testGit(t, h.TaskRepo("b", "p", "t"), "rev-parse", "refs/work/t"); got != commit {
		t.Fatalf("refs/work/t = %s, want %s", got, commit)
	}
	if b, _ := os.ReadFile(h.Log); !strings.Contains(string(b), "PushWorking") || !strings.Contains(string(b), " passed=") {
		t.Fatalf("the daemon did not take the descriptor; log:\n%s", tail(string(b), 3000))
	}
	h.FsckProject(t, "b", "p")
}

// Descriptors that are not a regular bundle file on a disk or memory file
// system are refused with the reason and what they are, before any byte is
// read; an oversized file (sparse: nothing to read), by its size, whatever
// the header announced; a file that grows while the push reads it, as
// changed or as junk. Nothing is left behind.
func TestPushDescriptorHostile(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--max-bundle-bytes", "8M"}})
	bundle, _, tok := fdWork(t, h, "p")
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	open := func(path string, flags int) *os.File {
		fd, err := syscall.Open(path, flags|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(fd), path)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte("# v2 git bundle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Truncate(big, 8<<20+1)
	wronly := filepath.Join(dir, "wronly")
	os.WriteFile(wronly, nil, 0o644)
	for _, c := range []struct {
		name, reason, says string
		f                  *os.File
	}{
		{"fifo", "PUSH_FD_REFUSED", "FIFO", open(fifo, syscall.O_RDWR)},
		{"directory", "PUSH_FD_REFUSED", "directory", open(dir, syscall.O_RDONLY)},
		{"/dev/zero", "PUSH_FD_REFUSED", "character device", open("/dev/zero", syscall.O_RDONLY)},
		{"O_PATH", "PUSH_FD_REFUSED", "O_PATH", open(bundle, 0x200000)},
		{"/proc file", "PUSH_FD_REFUSED", "file system", open("/proc/self/status", syscall.O_RDONLY)},
		{"write-only", "PUSH_FD_REFUSED", "writing only", open(wronly, syscall.O_WRONLY)},
		{"oversize", "BUNDLE_TOO_LARGE", "over the limit", open(big, syscall.O_RDONLY)},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(brokerEvents(t, h))
			_, accepted, err := fdPush(t, h, tok, c.f, 0)
			c.f.Close()
			if err == nil || reasonOf(err) != c.reason || !strings.Contains(err.Error(), c.says) || !accepted {
				t.Fatalf("push of a %s: accepted %v, %v (reason %s), want %s saying %q", c.name, accepted, err, reasonOf(err), c.reason, c.says)
			}
			nothingLeft(t, h, "p", before)
		})
	}

	// The daemon closes a passed descriptor whatever the call's outcome, a
	// refused grant included: once the call ended and the client closed
	// its own copy, the pipe has no reader left.
	t.Run("closed after a refused grant", func(t *testing.T) {
		bogus := filepath.Join(dir, "bogus-token")
		os.WriteFile(bogus, []byte("not-a-token\n"), 0o600)
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		_, accepted, err := fdPush(t, h, bogus, r, 0)
		r.Close()
		if err == nil || accepted {
			t.Fatalf("push with a bogus token: accepted %v, %v", accepted, err)
		}
		if _, err := w.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("the daemon still holds the passed descriptor: write %v", err)
		}
	})

	t.Run("growing", func(t *testing.T) {
		grow := filepath.Join(dir, "grow")
		b, _ := os.ReadFile(bundle)
		os.WriteFile(grow, b, 0o644)
		w, err := os.OpenFile(grow, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		stop, grew := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				w.Write([]byte("junk junk junk\n"))
				if i == 0 {
					close(grew)
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
		<-grew
		before := len(brokerEvents(t, h))
		f := open(grow, syscall.O_RDONLY)
		_, accepted, err := fdPush(t, h, tok, f, 0)
		close(stop)
		<-done
		f.Close()
		if r := reasonOf(err); !accepted || (r != "PUSH_FD_REFUSED" && r != "PACK_TRAILING_BYTES" && r != "BUNDLE_TOO_LARGE") {
			t.Fatalf("push of a growing file: accepted %v, %v (reason %s)", accepted, err, r)
		}
		nothingLeft(t, h, "p", before)
	})
}

// A daemon from before descriptor passing (a test's build with
// BUSHOST_TESTHOOK_SKIP=fd-passing: it takes no descriptor and ignores the
// offer) still gets the push from the new
// CLI, which falls back to streaming the bytes; a new daemon declines a
// descriptor the connection does not hold, and the CLI's byte stream (the
// only thing an old client sends) still works on it.
func TestPushDescriptorFallback(t *testing.T) {
	old := startHostWith(t, hostOpts{Daemon: hookBin(t, "bushostd"), Env: []string{"BUSHOST_TESTHOOK_SKIP=fd-passing"}})
	bundle, commit, tok := fdWork(t, old, "p")
	f, err := os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	before := len(brokerEvents(t, old))
	if _, accepted, err := fdPush(t, old, tok, f, 0); err == nil || accepted || reasonOf(err) != "BUNDLE_INVALID" {
		t.Fatalf("an old daemon's answer to an offer: accepted %v, %v", accepted, err)
	}
	nothingLeft(t, old, "p", before)
	out, errs, code := old.Run(t, nil, "--token-file", tok, "push-working", "--bundle", bundle)
	if code != 0 || strings.TrimSpace(out) != commit {
		t.Fatalf("push to an old daemon: exit %d: %s%s", code, out, errs)
	}
	if b, _ := os.ReadFile(old.Log); strings.Contains(string(b), " passed=") {
		t.Fatal("the old daemon took a descriptor")
	}

	h := startHost(t)
	bundle, commit, tok = fdWork(t, h, "q")
	before = len(brokerEvents(t, h))
	if _, accepted, err := fdPush(t, h, tok, f, 7); err == nil || accepted || reasonOf(err) != "PUSH_FD_DECLINED" {
		t.Fatalf("a descriptor never passed: accepted %v, %v", accepted, err)
	}
	nothingLeft(t, h, "q", before)
	// The byte stream, as an old client sends it: from a pipe, which is
	// never passed.
	cmd := exec.Command(h.client, "--home", h.Home, "--token-file", tok, "push-working", "--bundle", "/dev/stdin")
	cmd.Env = cleanEnv()
	pr, pw, _ := os.Pipe()
	cmd.Stdin = pr
	go func() { defer pw.Close(); b, _ := os.ReadFile(bundle); pw.Write(b) }()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	got, err := cmd.Output()
	pr.Close()
	if err != nil || strings.TrimSpace(string(got)) != commit {
		t.Fatalf("streamed push: %v: %s%s", err, got, stderr.String())
	}
}
