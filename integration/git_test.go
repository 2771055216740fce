package integration

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
	"github.com/bushost/bushost/internal/treesnap"
)

// gitWorld is a host with one project, a worker's and a reviewer's grant
// for task t1, and the worker's repository fetched from main.
type gitWorld struct {
	h                 *Host
	root, work, repo  string
	worker, reviewer  string
	business, project string
	main              string
}

func newGitWorld(t *testing.T, o hostOpts) *gitWorld {
	t.Helper()
	h := startHostWith(t, o)
	w := &gitWorld{h: h, business: "acme", project: "web"}
	w.root = h.AddProject(t, w.business, w.project)
	w.repo = h.PoolRepo(w.business, w.project)
	w.worker = h.Grant(t, w.business, w.project, "t1", "worker", "git.push.working")
	w.reviewer = h.Grant(t, w.business, w.project, "t1", "reviewer", "review.verdict")
	w.work = filepath.Join(filepath.Dir(h.Home), "work")
	w.main = w.as(t, w.worker, "fetch-main", "--repo", w.work)
	testGit(t, w.work, "checkout", "-q", "-b", "feature")
	return w
}

// as runs bushost with a token file and requires success.
func (w *gitWorld) as(t *testing.T, tok string, args ...string) string {
	t.Helper()
	out, errs, code := w.h.Run(t, nil, append([]string{"--token-file", tok}, args...)...)
	if code != 0 {
		t.Fatalf("bushost %s: exit %d: %s", strings.Join(args, " "), code, errs)
	}
	return strings.TrimSpace(out)
}

func (w *gitWorld) commit(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(w.work, name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, w.work, "add", "-A")
	testGit(t, w.work, "commit", "-q", "-m", "change "+name)
	return testGit(t, w.work, "rev-parse", "HEAD")
}

func (w *gitWorld) ref(t *testing.T, name string) string {
	t.Helper()
	dir := w.h.RefRepo(w.business, w.project, name)
	if _, err := os.Stat(dir); err != nil {
		return ""
	}
	return testGit(t, dir, "for-each-ref", "--format=%(objectname)", name)
}

// storeSnapshot records every file and directory under the host's
// repositories.
func storeSnapshot(t *testing.T, h *Host) map[string]string {
	t.Helper()
	return treesnap.Take(t, filepath.Join(h.Home, "repos"))
}

// A good push is accepted, the ref moves, fsck is clean, and the reviewer
// fetches exactly that commit into refs/review/t1.
func TestGitPushAndReview(t *testing.T) {
	w := newGitWorld(t, hostOpts{})
	if got := testGit(t, w.work, "rev-parse", "main"); got != w.main {
		t.Fatalf("fetch-main: main = %s, printed %s", got, w.main)
	}
	c1 := w.commit(t, "a.txt", "one\n")
	if got := w.as(t, w.worker, "push-working", "--repo", w.work); got != c1 {
		t.Fatalf("push-working printed %q, want %s", got, c1)
	}
	if got := w.ref(t, "refs/work/t1"); got != c1 {
		t.Fatalf("refs/work/t1 = %s, want %s", got, c1)
	}
	c2 := w.commit(t, "a.txt", "two\n")
	if got := w.as(t, w.worker, "push-working", "--repo", w.work); got != c2 {
		t.Fatalf("second push printed %q", got)
	}
	w.h.FsckProject(t, w.business, w.project)

	rev := filepath.Join(filepath.Dir(w.h.Home), "review")
	w.as(t, w.reviewer, "fetch-main", "--repo", rev)
	if got := w.as(t, w.reviewer, "fetch-review", "--repo", rev); got != c2 {
		t.Fatalf("fetch-review printed %q, want %s", got, c2)
	}
	if got := testGit(t, rev, "rev-parse", "refs/review/t1"); got != c2 {
		t.Fatalf("refs/review/t1 = %s", got)
	}
	testGit(t, rev, "fsck", "--strict", "--no-progress")

	// The worker may not fetch the review; the reviewer may not push.
	if _, errs, code := w.h.Run(t, nil, "--token-file", w.worker, "fetch-review", "--repo", rev); code == 0 || !strings.Contains(errs, "PermissionDenied") {
		t.Fatalf("worker fetch-review: exit %d, %s", code, errs)
	}
	if _, errs, code := w.h.Run(t, nil, "--token-file", w.reviewer, "push-working", "--repo", w.work); code == 0 || !strings.Contains(errs, "PermissionDenied") {
		t.Fatalf("reviewer push: exit %d, %s", code, errs)
	}

	// project sync fast-forwards main from the root.
	os.WriteFile(filepath.Join(w.root, "NEW"), []byte("new\n"), 0o644)
	testGit(t, w.root, "add", "NEW")
	testGit(t, w.root, "commit", "-q", "-m", "new")
	next := testGit(t, w.root, "rev-parse", "HEAD")
	if got := w.h.Must(t, "project", "sync", "--business", w.business, "--project", w.project); got != next {
		t.Fatalf("project sync printed %q, want %s", got, next)
	}
	if got := w.ref(t, "refs/heads/main"); got != next {
		t.Fatalf("main = %s after sync", got)
	}
}

// Refusals through the real client and socket: the message names the
// cause, the client exits with the refusal's class, and the store is byte-for-byte unchanged.
func TestGitPushRefusals(t *testing.T) {
	w := newGitWorld(t, hostOpts{Args: []string{"--max-bundle-bytes", "200000"}})
	w.commit(t, "a.txt", "one\n")
	w.as(t, w.worker, "push-working", "--repo", w.work)
	dir := filepath.Dir(w.h.Home)

	// Each case returns a bundle file.
	cases := []struct {
		name, want string
		exit       int // the class: docs/errors.md
		make       func(t *testing.T) string
	}{
		{"tree entry .git (git 2.39's fetch would take it)", "hasDotgit", 6, func(t *testing.T) string {
			blob := testGitIn(t, w.work, "x\n", "hash-object", "-w", "--stdin")
			tree := testGitIn(t, w.work, fmt.Sprintf("100644 blob %s\t.git\n", blob), "mktree")
			c := testGit(t, w.work, "commit-tree", "-p", "HEAD", "-m", "evil", tree)
			testGit(t, w.work, "update-ref", "refs/heads/evil", c)
			return bundleFile(t, w.work, dir, "evil", "refs/heads/evil", "^main")
		}},
		{"non-fast-forward", "non-fast-forward", 5, func(t *testing.T) string {
			testGit(t, w.work, "checkout", "-q", "-b", "other", "main")
			w.commit(t, "a.txt", "different\n")
			return bundleFile(t, w.work, dir, "nonff", "HEAD", "^main")
		}},
		{"two refs", "bundle has 2 refs", 6, func(t *testing.T) string {
			return bundleFile(t, w.work, dir, "two", "feature", "other", "^main")
		}},
		{"missing prerequisite", "does not have", 1, func(t *testing.T) string {
			testGit(t, w.work, "checkout", "-q", "feature")
			w.commit(t, "local.txt", "local\n")
			base := testGit(t, w.work, "rev-parse", "HEAD")
			w.commit(t, "a.txt", "three\n")
			return bundleFile(t, w.work, dir, "prereq", "HEAD", "^"+base)
		}},
		{"oversized", "over the limit", 7, func(t *testing.T) string {
			w.commit(t, "big.bin", randomString(400000))
			return bundleFile(t, w.work, dir, "big", "HEAD", "^main")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.make(t)
			before := storeSnapshot(t, w.h)
			_, errs, code := w.h.Run(t, nil, "--token-file", w.worker, "push-working", "--bundle", f)
			if code != tc.exit || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", code, errs, tc.exit, tc.want)
			}
			if d := treesnap.Diff(before, storeSnapshot(t, w.h)); d != "" {
				t.Fatalf("store changed:\n%s", d)
			}
		})
	}
	w.h.FsckProject(t, w.business, w.project)
}

// Hostile names never reach the filesystem.
func TestGitHostileNames(t *testing.T) {
	h := startHost(t)
	root := t.TempDir()
	before := storeSnapshot(t, h)
	for _, bad := range []string{"../x", "a/b", "", strings.Repeat("a", 200), "ünï"} {
		for _, args := range [][]string{
			{"project", "add", "--business", bad, "--project", "p", "--root", root},
			{"project", "add", "--business", "b", "--project", bad, "--root", root},
		} {
			_, errs, code := h.Run(t, nil, args...)
			if code == 0 || (!strings.Contains(errs, "invalid") && !strings.Contains(errs, "required")) {
				t.Errorf("%q: exit %d, %s", args, code, errs)
			}
		}
	}
	if d := treesnap.Diff(before, storeSnapshot(t, h)); d != "" {
		t.Fatalf("store changed:\n%s", d)
	}
}

// 16 clients push a growing line of commits to one task at once; 16 more
// push to 16 tasks. No update is lost, every accepted push fast-forwards
// the one before, and fsck stays clean.
func TestGitConcurrentPushes(t *testing.T) {
	w := newGitWorld(t, hostOpts{Args: []string{"--max-calls-per-grant", "32"}})
	dir := filepath.Dir(w.h.Home)
	const n = 16
	files := make([]string, n)
	commits := make([]string, n)
	for i := range files {
		commits[i] = w.commit(t, "a.txt", strings.Repeat("x", i+1))
		files[i] = bundleFile(t, w.work, dir, fmt.Sprintf("line%d", i), "HEAD", "^main")
	}
	codes := make([]int, n)
	errs := make([]string, n)
	var wg sync.WaitGroup
	for i := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i], codes[i] = w.h.Run(t, nil, "--token-file", w.worker, "push-working", "--bundle", files[i])
		}()
	}
	wg.Wait()
	for i := range files {
		if codes[i] != 0 && !strings.Contains(errs[i], "non-fast-forward") {
			t.Fatalf("push %d: exit %d: %s", i, codes[i], errs[i])
		}
	}
	if codes[n-1] != 0 {
		t.Fatalf("the newest commit was refused: %s", errs[n-1])
	}
	if got := w.ref(t, "refs/work/t1"); got != commits[n-1] {
		t.Fatalf("refs/work/t1 = %s, want %s", got, commits[n-1])
	}

	toks := make([]string, n)
	for i := range toks {
		toks[i] = w.h.Grant(t, w.business, w.project, fmt.Sprintf("m%d", i), "worker", "git.push.working")
		testGit(t, w.work, "checkout", "-q", "-B", fmt.Sprintf("m%d", i), "main")
		commits[i] = w.commit(t, "m.txt", fmt.Sprint(i))
		files[i] = bundleFile(t, w.work, dir, fmt.Sprintf("task%d", i), "HEAD", "^main")
	}
	for i := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i], codes[i] = w.h.Run(t, nil, "--token-file", toks[i], "push-working", "--bundle", files[i])
		}()
	}
	wg.Wait()
	for i := range files {
		if codes[i] != 0 {
			t.Fatalf("task m%d: exit %d: %s", i, codes[i], errs[i])
		}
		if got := w.ref(t, fmt.Sprintf("refs/work/m%d", i)); got != commits[i] {
			t.Fatalf("refs/work/m%d = %s, want %s", i, got, commits[i])
		}
	}
	w.h.FsckProject(t, w.business, w.project)
}

// bundleFile writes a v2 bundle of revs from repo into dir/name.bundle.
func bundleFile(t testing.TB, repo, dir, name string, revs ...string) string {
	t.Helper()
	f := filepath.Join(dir, name+".bundle")
	testGit(t, repo, append([]string{"bundle", "create", "-q", "--version=2", f}, revs...)...)
	return f
}

// testGitIn is testGit with stdin.
func testGitIn(t testing.TB, dir, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// randomString is n bytes that do not compress.
func randomString(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return string(b)
}

// TestPushNothingNew: push-working of a HEAD that is main's commit, or in
// main's history, is refused on the client (NOTHING_TO_PUSH, exit 1),
// although it has already sent the bundle's header: the bus host records
// nothing and keeps nothing of it.
func TestPushNothingNew(t *testing.T) {
	w := newGitWorld(t, hostOpts{})
	// main moves on the host; the worker fetches it, then goes back to
	// the main before it.
	if err := os.WriteFile(filepath.Join(w.root, "host.txt"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, w.root, "add", "host.txt")
	testGit(t, w.root, "commit", "-q", "-m", "host moves main")
	w.h.Must(t, "project", "sync", "--business", w.business, "--project", w.project)
	w.as(t, w.worker, "fetch-main", "--repo", w.work)
	before := storeSnapshot(t, w.h)
	events := len(brokerEvents(t, w.h))
	for _, at := range []string{"refs/remotes/bushost/main", w.main} {
		testGit(t, w.work, "reset", "-q", "--hard", at)
		_, errs, code := w.h.Run(t, nil, "--token-file", w.worker, "push-working", "--repo", w.work)
		if code != 1 || !strings.Contains(errs, "NOTHING_TO_PUSH") {
			t.Fatalf("push of HEAD at %s: exit %d, %s", at, code, errs)
		}
	}
	// The bus host ends the cancelled push on its own time: wait for it.
	if !testenv.Poll(20*time.Second, func() bool { return treesnap.Diff(before, storeSnapshot(t, w.h)) == "" }) {
		t.Fatalf("a refused push left:\n%s", treesnap.Diff(before, storeSnapshot(t, w.h)))
	}
	if n := len(brokerEvents(t, w.h)); n != events {
		t.Fatalf("the log grew from %d to %d events", events, n)
	}
}
