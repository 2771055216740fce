package gitd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/treesnap"
)

func TestPushGood(t *testing.T) {
	e := newEnv(t)
	c1 := e.commitFile("a.txt", "one\n")
	res, err := e.push("t1", e.bundle("HEAD", "^main"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Commit != c1 || res.Previous != "" || res.Ref != "refs/work/t1" {
		t.Fatalf("push = %+v, want commit %s, no previous", res, c1)
	}
	if got := e.ref("refs/work/t1"); got != c1 {
		t.Fatalf("refs/work/t1 = %q, want %s", got, c1)
	}
	c2 := e.commitFile("a.txt", "two\n")
	res, err = e.push("t1", e.bundle("HEAD", "^main"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Commit != c2 || res.Previous != c1 {
		t.Fatalf("second push = %+v, want %s after %s", res, c2, c1)
	}
	e.fsck()
	rec := e.auth.recorded()
	if len(rec) != 2 || rec[0].Commit != c1 || rec[1].Previous != c1 || rec[1].Commit != c2 || rec[1].Ref != "refs/work/t1" {
		t.Fatalf("recorded pushes = %+v", rec)
	}
	// The same commit again changes nothing and records nothing.
	if res, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil || res.Commit != c2 {
		t.Fatalf("repeat push = %+v, %v", res, err)
	}
	if n := len(e.auth.recorded()); n != 2 {
		t.Fatalf("repeat push recorded: %d records", n)
	}
	assertNoQuarantine(t, e)
}

func TestPushFullBundle(t *testing.T) {
	e := newEnv(t)
	c := e.commitFile("b.txt", "x\n")
	if _, err := e.push("t1", e.bundle("HEAD")); err != nil {
		t.Fatal(err)
	}
	if got := e.ref("refs/work/t1"); got != c {
		t.Fatalf("ref = %s, want %s", got, c)
	}
	e.fsck()
}

func assertNoQuarantine(t *testing.T, e *env) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(e.repo, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range ents {
		if strings.HasPrefix(en.Name(), bundle.QuarantinePrefix) {
			t.Fatalf("quarantine left behind: %s", en.Name())
		}
	}
}

// refusal is one push that must be refused with code and a message naming
// the cause, leaving the store exactly as it was.
type refusal struct {
	name string
	// setup prepares the world (optional) and returns the bundle to push.
	bundle func(e *env) []byte
	size   int64
	code   errdefs.Kind
	reason errdefs.Reason
	want   string
	opts   []func(*Options)
}

func TestPushRefusals(t *testing.T) {
	blob := func(e *env, s string) string { return e.rawObject("blob", []byte(s)) }
	badTree := func(entries func(e *env) []treeEntry) func(e *env) []byte {
		return func(e *env) []byte {
			tree := e.rawObject("tree", rawTree(entries(e)...))
			c := e.rawCommit(tree, goodAuthor)
			e.run(e.work, "update-ref", nil, "--", "refs/heads/bad", c)
			return e.bundle("refs/heads/bad", "^main")
		}
	}
	withEntry := func(mode, name string) func(e *env) []byte {
		return badTree(func(e *env) []treeEntry {
			return []treeEntry{{mode, name, blob(e, "x\n")}}
		})
	}
	gitmodules := func(content string) func(e *env) []byte {
		return badTree(func(e *env) []treeEntry {
			return []treeEntry{{"100644", ".gitmodules", blob(e, content)}}
		})
	}
	header := func(e *env, b []byte, newHeader string) []byte {
		i := bytes.Index(b, []byte("\n\n"))
		return append([]byte(newHeader), b[i+2:]...)
	}
	cases := []refusal{
		{name: "non-fast-forward", reason: errdefs.NonFastForward, code: errdefs.KindFailedPrecondition, want: "non-fast-forward", bundle: func(e *env) []byte {
			e.commitFile("a.txt", "one\n")
			if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
				e.t.Fatal(err)
			}
			e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "main")
			e.commitFile("a.txt", "other\n")
			return e.bundle("HEAD", "^main")
		}},
		{name: "unrelated history", reason: errdefs.UnrelatedHistory, code: errdefs.KindFailedPrecondition, want: "shares no history with main", bundle: func(e *env) []byte {
			tree := e.rawObject("tree", rawTree(treeEntry{"100644", "f", blob(e, "orphan\n")}))
			c := e.run(e.work, "commit-tree", nil, "-morphan", "--", tree)
			e.run(e.work, "update-ref", nil, "--", "refs/heads/orphan", c)
			return e.bundle("refs/heads/orphan")
		}},
		{name: "no ref", reason: errdefs.BundleInvalid, code: errdefs.KindInvalidArgument, want: "bundle has 0 refs", bundle: func(e *env) []byte {
			e.commitFile("a.txt", "one\n")
			b := e.bundle("HEAD", "^main")
			return header(e, b, "# v2 git bundle\n-"+e.main+"\n\n")
		}},
		{name: "two refs", code: errdefs.KindInvalidArgument, want: "bundle has 2 refs", bundle: func(e *env) []byte {
			e.commitFile("a.txt", "one\n")
			e.run(e.work, "update-ref", nil, "--", "refs/heads/second", "HEAD")
			return e.bundle("HEAD", "refs/heads/second", "^main")
		}},
		{name: "missing prerequisite", reason: errdefs.PrerequisiteMissing, code: errdefs.KindFailedPrecondition, want: "which the bus host does not have", bundle: func(e *env) []byte {
			e.commitFile("local.txt", "never pushed\n")
			e.run(e.work, "update-ref", nil, "--", "refs/heads/base", "HEAD")
			e.commitFile("a.txt", "one\n")
			return e.bundle("HEAD", "^refs/heads/base")
		}},
		{name: "truncated pack", reason: errdefs.PackInvalid, code: errdefs.KindInvalidArgument, want: "bad pack", bundle: func(e *env) []byte {
			e.commitFile("a.txt", strings.Repeat("some content\n", 100))
			b := e.bundle("HEAD", "^main")
			return b[:len(b)-30]
		}},
		{name: "not a bundle", reason: errdefs.BundleInvalid, code: errdefs.KindInvalidArgument, want: "not a v2 or v3 git bundle", bundle: func(e *env) []byte {
			return []byte("PACK garbage\n\n")
		}},
		{name: "header without end", code: errdefs.KindInvalidArgument, want: "truncated bundle", bundle: func(e *env) []byte {
			return []byte("# v2 git bundle\n" + e.main + " HEAD\n")
		}},
		{name: "v3 with filter", code: errdefs.KindInvalidArgument, want: "@filter", bundle: func(e *env) []byte {
			e.commitFile("a.txt", "one\n")
			b := e.bundle("HEAD", "^main")
			i := bytes.IndexByte(b, '\n')
			return append([]byte("# v3 git bundle\n@object-format=sha1\n@filter=blob:none\n"), b[i+1:]...)
		}},
		{name: "v3 sha256", code: errdefs.KindInvalidArgument, want: "sha256", bundle: func(e *env) []byte {
			e.commitFile("a.txt", "one\n")
			b := e.bundle("HEAD", "^main")
			i := bytes.IndexByte(b, '\n')
			return append([]byte("# v3 git bundle\n@object-format=sha256\n"), b[i+1:]...)
		}},
		{name: "1 MiB header line", code: errdefs.KindInvalidArgument, want: "header line longer than", bundle: func(e *env) []byte {
			return []byte("# v2 git bundle\n" + e.main + " refs/heads/" + strings.Repeat("x", 1<<20) + "\n\n")
		}},
		{name: "oversized", reason: errdefs.BundleTooLarge, code: errdefs.KindResourceExhausted, want: "over the limit", opts: []func(*Options){func(o *Options) { o.MaxBundleBytes = 4096 }}, bundle: func(e *env) []byte {
			e.commitFile("big.txt", strings.Repeat("incompressible? no, but big enough ", 2000)+randomText(8192))
			return e.bundle("HEAD", "^main")
		}},
		{name: "oversized announced", reason: errdefs.BundleTooLarge, code: errdefs.KindResourceExhausted, want: "over the limit", size: 1 << 40, bundle: func(e *env) []byte {
			e.commitFile("a.txt", "one\n")
			return e.bundle("HEAD", "^main")
		}},
		{name: "ref names a tree", reason: errdefs.BundleRefNotCommit, code: errdefs.KindInvalidArgument, want: "not a commit", bundle: func(e *env) []byte {
			tree := e.rawObject("tree", rawTree(treeEntry{"100644", "f", blob(e, "t\n")}))
			b := e.bundle("main")
			i := bytes.Index(b, []byte("\n\n"))
			pack := b[i+2:]
			_ = pack
			// A bundle whose ref is a tree: made by git from a ref to it.
			e.run(e.work, "update-ref", nil, "--", "refs/tags/tree", tree)
			return e.bundle("refs/tags/tree")
		}},
		{name: "fsck .git", reason: errdefs.FsckFailed, code: errdefs.KindInvalidArgument, want: "hasDotgit", bundle: withEntry("100644", ".git")},
		{name: "fsck .GIT", code: errdefs.KindInvalidArgument, want: "hasDotgit", bundle: withEntry("100644", ".GIT")},
		{name: "fsck .git.", code: errdefs.KindInvalidArgument, want: "hasDotgit", bundle: withEntry("100644", ".git.")},
		{name: "fsck ..", code: errdefs.KindInvalidArgument, want: "hasDotdot", bundle: withEntry("100644", "..")},
		{name: "fsck zero-padded mode", code: errdefs.KindInvalidArgument, want: "zeroPaddedFilemode", bundle: withEntry("0100644", "f")},
		{name: "fsck unsorted tree", code: errdefs.KindInvalidArgument, want: "treeNotSorted", bundle: badTree(func(e *env) []treeEntry {
			return []treeEntry{{"100644", "b", blob(e, "b\n")}, {"100644", "a", blob(e, "a\n")}}
		})},
		{name: "fsck bad author", code: errdefs.KindInvalidArgument, want: "badEmail", bundle: func(e *env) []byte {
			tree := e.rawObject("tree", rawTree(treeEntry{"100644", "f", blob(e, "f\n")}))
			c := e.rawCommit(tree, "Bad Author <bad@example.com 1700000000 +0000")
			e.run(e.work, "update-ref", nil, "--", "refs/heads/bad", c)
			return e.bundle("refs/heads/bad", "^main")
		}},
		{name: "fsck .gitmodules ../ name", code: errdefs.KindInvalidArgument, want: "gitmodulesName", bundle: gitmodules("[submodule \"../evil\"]\n\tpath = evil\n\turl = https://example.com/evil\n")},
		{name: "fsck .gitmodules - url", code: errdefs.KindInvalidArgument, want: "gitmodulesUrl", bundle: gitmodules("[submodule \"x\"]\n\tpath = x\n\turl = --upload-pack=touch${IFS}/tmp/pwned\n")},
		{name: "fsck .gitmodules symlink", code: errdefs.KindInvalidArgument, want: "gitmodulesSymlink", bundle: badTree(func(e *env) []treeEntry {
			return []treeEntry{{"120000", ".gitmodules", blob(e, "/etc/passwd")}}
		})},
		// No separate connectivity walk runs after index-pack: these show
		// that index-pack --strict alone refuses a pack whose objects link
		// to objects that are neither in it nor in the repository.
		{name: "tree names a missing blob", code: errdefs.KindInvalidArgument, want: "did not receive expected object", bundle: func(e *env) []byte {
			missing := e.run(e.work, "hash-object", []byte("never written\n"), "--stdin")
			tree := e.rawObject("tree", rawTree(treeEntry{"100644", "f", missing}))
			c := e.rawCommit(tree, goodAuthor)
			return e.handBundle(c, c, tree)
		}},
		{name: "commit names a missing tree", code: errdefs.KindInvalidArgument, want: "did not receive expected object", bundle: func(e *env) []byte {
			c := e.rawCommit(strings.Repeat("2", 40), goodAuthor)
			return e.handBundle(c, c)
		}},
		{name: "commit names a missing parent", code: errdefs.KindInvalidArgument, want: "did not receive expected object", bundle: func(e *env) []byte {
			tree := e.rawObject("tree", rawTree(treeEntry{"100644", "f", blob(e, "p\n")}))
			body := fmt.Sprintf("tree %s\nparent %s\nparent %s\nauthor %s\ncommitter %s\n\nx\n", tree, e.main, strings.Repeat("1", 40), goodAuthor, goodAuthor)
			c := e.rawObject("commit", []byte(body))
			return e.handBundle(c, c, tree, blob(e, "p\n"))
		}},
		{name: "ref names an object the bundle lacks", code: errdefs.KindInvalidArgument, want: "neither the bundle nor the repository holds", bundle: func(e *env) []byte {
			c := e.commitFile("a.txt", "one\n")
			tree := e.run(e.work, "rev-parse", nil, "--", "HEAD^{tree}")
			return e.handBundle(strings.Repeat("3", 40), c, tree, e.run(e.work, "rev-parse", nil, "--", "HEAD:a.txt"))
		}},
		{name: "closed task", reason: errdefs.TaskClosed, code: errdefs.KindFailedPrecondition, want: "is closed", bundle: func(e *env) []byte {
			e.auth.mu.Lock()
			e.auth.closed["t1"] = true
			e.auth.mu.Unlock()
			e.commitFile("a.txt", "one\n")
			return e.bundle("HEAD", "^main")
		}},
		{name: "record refused", code: errdefs.KindFailedPrecondition, want: "closed while pushing", bundle: func(e *env) []byte {
			e.auth.mu.Lock()
			e.auth.refuse = errdefs.FailedPrecondition(errdefs.TaskClosed, "task t1 closed while pushing")
			e.auth.mu.Unlock()
			e.commitFile("a.txt", "one\n")
			return e.bundle("HEAD", "^main")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.opts...)
			b := tc.bundle(e)
			before := e.snapshot()
			recs := len(e.auth.recorded())
			_, err := e.svc.Push(context.Background(), e.grant("t1"), testTask("t1"), authz.Peer{}, tc.size, bytes.NewReader(b))
			if err == nil {
				t.Fatal("push accepted")
			}
			back := errdefs.Of(err)
			if back.Kind != tc.code || !strings.Contains(back.Message, tc.want) {
				t.Fatalf("refusal = %v %q, want %v containing %q", back.Kind, back.Message, tc.code, tc.want)
			}
			if tc.reason != "" && back.Reason != tc.reason {
				t.Fatalf("reason %s, want %s", back.Reason, tc.reason)
			}
			if tc.reason == errdefs.FsckFailed && back.Metadata["fsck_id"] != "hasDotgit" {
				t.Fatalf("fsck_id = %q", back.Metadata["fsck_id"])
			}
			if d := treesnap.Diff(before, e.snapshot()); d != "" {
				t.Fatalf("store changed by a refused push:\n%s", d)
			}
			if n := len(e.auth.recorded()); n != recs {
				t.Fatalf("refused push was recorded")
			}
			e.fsck()
		})
	}
}

// handBundle writes a v2 bundle by hand: main as prerequisite, ref naming
// commit, and a pack of exactly objects, so that the pack can lack what
// git bundle create would refuse to leave out.
func (e *env) handBundle(commit string, objects ...string) []byte {
	e.t.Helper()
	var pack bytes.Buffer
	err := e.git.Run(context.Background(), gitcmd.Cmd{Dir: e.work, Sub: "pack-objects", Flags: []string{"--stdout", "-q"},
		Stdin: strings.NewReader(strings.Join(objects, "\n") + "\n"), Stdout: &pack})
	if err != nil {
		e.t.Fatal(err)
	}
	return append([]byte("# v2 git bundle\n-"+e.main+" initial\n"+commit+" refs/heads/hand\n\n"), pack.Bytes()...)
}

func randomText(n int) string {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = 'a' + byte(x%26)
	}
	return string(b)
}

// TestPushBadNames sends a push whose grant names a hostile business,
// project or task to the server, and hostile project names to AddProject:
// each is refused NAME_INVALID where the call enters, before anything is
// read or made.
func TestPushBadNames(t *testing.T) {
	e := newEnv(t)
	c := serve(t, e)
	e.commitFile("a.txt", "one\n")
	b := e.bundle("HEAD", "^main")
	before := e.snapshot()
	for _, bad := range []string{"../x", "a/b", "", strings.Repeat("a", 200), "ünï"} {
		for _, which := range []string{"business", "project", "task"} {
			g := e.grant("t1")
			switch which {
			case "business":
				g.Business = bad
			case "project":
				g.Project = bad
			case "task":
				g.Task = bad
			}
			e.auth.grant("bad", g)
			_, err := pushStream(t, c, "bad", b)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid "+which+" name") {
				t.Errorf("%s %q: %v", which, bad, err)
			}
		}
	}
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Fatalf("store changed:\n%s", d)
	}
	for _, bad := range []string{"../x", "a/b", "", strings.Repeat("a", 200), "ünï"} {
		if _, err := c.AddProject(withToken("admin"), &gitv1.AddProjectRequest{Business: bad, Project: "p", Root: e.root}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid business name") {
			t.Errorf("AddProject business %q: %v", bad, err)
		}
		if _, err := c.AddProject(withToken("admin"), &gitv1.AddProjectRequest{Business: "b", Project: bad, Root: e.root}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid project name") {
			t.Errorf("AddProject project %q: %v", bad, err)
		}
	}
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Fatalf("store changed:\n%s", d)
	}
}

// TestPushUnclearRecord: the broker's commit of a push's record fails in
// flight (COMMIT_UNKNOWN). Read back as not recorded, the push is rolled
// back whole (no pack, no repository, no ref); as recorded, it completes;
// not read back, its pack is kept for Reconcile and its ref not moved.
func TestPushUnclearRecord(t *testing.T) {
	unclear := errdefs.Unavailable(errdefs.CommitUnknown, "the test's store lost the answer")
	t.Run("not recorded", func(t *testing.T) {
		e := newEnv(t)
		e.commitFile("a.txt", "one\n")
		e.auth.unclear = unclear
		before := e.snapshot()
		_, err := e.push("t1", e.bundle("HEAD", "^main"))
		if got := errdefs.Of(err); got.Reason != errdefs.CommitUnknown || got.Metadata["recorded"] != "false" {
			t.Fatalf("push: %v (%+v)", err, got)
		}
		if d := treesnap.Diff(before, e.snapshot()); d != "" {
			t.Fatalf("a push not recorded left:\n%s", d)
		}
	})
	t.Run("recorded", func(t *testing.T) {
		e := newEnv(t)
		c := e.commitFile("a.txt", "one\n")
		e.auth.unclear, e.auth.unclearCommitted = unclear, true
		if res, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil || res.Commit != c {
			t.Fatalf("push: %+v %v", res, err)
		}
		if got := e.ref("refs/work/t1"); got != c {
			t.Fatalf("refs/work/t1 = %q, want %s", got, c)
		}
		e.fsck()
	})
	t.Run("not read back", func(t *testing.T) {
		e := newEnv(t)
		c := e.commitFile("a.txt", "one\n")
		e.auth.unclear, e.auth.unclearCommitted = unclear, true
		e.auth.readBack = errors.New("the test's store is down")
		_, err := e.push("t1", e.bundle("HEAD", "^main"))
		if got := errdefs.Of(err); got.Reason != errdefs.CommitUnknown || got.Metadata["recorded"] != "" {
			t.Fatalf("push: %v (%+v)", err, got)
		}
		if got := e.ref("refs/work/t1"); got != "" {
			t.Fatalf("refs/work/t1 moved to %s before the log was read back", got)
		}
		if _, err := e.runErr(e.taskRepo("t1"), "cat-file", nil, "-e", "--", c); err != nil {
			t.Fatalf("the pack of a push whose record may have committed is gone: %v", err)
		}
		// Nothing but the pack and its repository: no lock, no quarantine.
		e.fsck()
		if err := e.svc.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := e.ref("refs/work/t1"); got != c {
			t.Fatalf("after Reconcile refs/work/t1 = %q, want %s", got, c)
		}
	})
}

// TestPushRefLockHeld: a push whose ref move cannot be prepared (a lock
// on the ref another process holds) is rolled back after its checks,
// quota reservation and lock: nothing is recorded or left, and the next
// push, the lock gone, goes through.
func TestPushRefLockHeld(t *testing.T) {
	e := newEnv(t)
	e.commitFile("a.txt", "one\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	c := e.commitFile("a.txt", "two\n")
	lock := filepath.Join(e.taskRepo("t1"), "refs", "work", "t1.lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	before, recs := e.snapshot(), len(e.auth.recorded())
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err == nil || !strings.Contains(err.Error(), "t1.lock exists") {
		t.Fatalf("push with the ref locked: %v", err)
	}
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Fatalf("a push refused at its ref move left:\n%s", d)
	}
	if len(e.auth.recorded()) != recs {
		t.Fatal("a push refused at its ref move was recorded")
	}
	if err := os.Remove(lock); err != nil {
		t.Fatal(err)
	}
	if res, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil || res.Commit != c {
		t.Fatalf("push after the lock is gone: %+v %v", res, err)
	}
	// The project's reservation was released: the figure is the
	// repository's, not twice the refused pack.
	if n := e.reserved(t); n != 0 {
		t.Fatalf("reservations left: %d bytes", n)
	}
	e.fsck()
}
