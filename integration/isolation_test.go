package integration

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/treesnap"

	"github.com/bushost/bushost/internal/gitobj"
)

// The attacks of issue 12: a worker of task A, with nothing but its own
// token, tries to learn or read what task B pushed and nobody reviewed.
// Each one is refused with the same status, reason and message (object
// ids, which the attacker chose, aside) whether the object it aims at is
// B's or exists nowhere, and A's reviewer never receives B's objects.

// secretB is what task B pushes; A knows its length, not its content.
const secretB = "SECRET-B-API-KEY=12345\n"

// isoWorld is gitWorld (task t1 = A) plus task t2 = B, which pushed secretB.
type isoWorld struct {
	*gitWorld
	workerB, workB string
	blobB, commitB string // B's secret blob and its pushed commit
	baseA          string // A's accepted push
}

func newIsoWorld(t *testing.T) *isoWorld {
	t.Helper()
	w := &isoWorld{gitWorld: newGitWorld(t, hostOpts{})}
	w.commit(t, "a.txt", "work of A\n")
	w.baseA = w.as(t, w.worker, "push-working", "--repo", w.work)
	w.workerB = w.h.Grant(t, w.business, w.project, "t2", "worker", "git.push.working")
	w.workB = filepath.Join(filepath.Dir(w.h.Home), "work-b")
	w.as(t, w.workerB, "fetch-main", "--repo", w.workB)
	if err := os.WriteFile(filepath.Join(w.workB, "secret.env"), []byte(secretB), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, w.workB, "add", "secret.env")
	testGit(t, w.workB, "commit", "-q", "-m", "B's secret")
	w.commitB = w.as(t, w.workerB, "push-working", "--repo", w.workB)
	w.blobB = testGit(t, w.workB, "rev-parse", "HEAD:secret.env")
	return w
}

// packEntry is one object of a hand-made pack: a whole object, or a
// REF_DELTA against base.
type packEntry struct {
	typ  string // commit, tree, blob; "" for a REF_DELTA
	base string // REF_DELTA's base id
	data []byte // the object's body, or the delta
}

// rawBundle is a v2 bundle with prerequisites prereq, one ref naming tip
// (refs/heads/work), and a pack of entries in order.
func rawBundle(prereq []string, tip string, entries ...packEntry) []byte {
	var b bytes.Buffer
	b.WriteString("# v2 git bundle\n")
	for _, p := range prereq {
		fmt.Fprintf(&b, "-%s base\n", p)
	}
	fmt.Fprintf(&b, "%s refs/heads/work\n\n", tip)
	var pack bytes.Buffer
	pack.WriteString("PACK\x00\x00\x00\x02")
	binary.Write(&pack, binary.BigEndian, uint32(len(entries)))
	types := map[string]byte{"commit": 1, "tree": 2, "blob": 3, "": 7}
	for _, e := range entries {
		pack.Write(gitobj.AppendEntryHeader(nil, int(types[e.typ]), uint64(len(e.data))))
		if e.typ == "" {
			id, _ := hex.DecodeString(e.base)
			pack.Write(id)
		}
		z := zlib.NewWriter(&pack)
		z.Write(e.data)
		z.Close()
	}
	sum := sha1.Sum(pack.Bytes())
	pack.Write(sum[:])
	b.Write(pack.Bytes())
	return b.Bytes()
}

// objectID is git's id of an object of typ with body.
func objectID(typ string, body []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "%s %d\x00", typ, len(body))
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// treeBody is a tree of (mode, name, id) entries, sorted by the caller.
func treeBody(entries ...[3]string) []byte {
	var b bytes.Buffer
	for _, e := range entries {
		id, _ := hex.DecodeString(e[2])
		fmt.Fprintf(&b, "%s %s\x00", e[0], e[1])
		b.Write(id)
	}
	return b.Bytes()
}

func commitBody(tree, parent, msg string) []byte {
	return []byte(fmt.Sprintf("tree %s\nparent %s\nauthor A <a@example.com> 1700000000 +0000\ncommitter A <a@example.com> 1700000000 +0000\n\n%s\n", tree, parent, msg))
}

// delta is a git delta from a base of baseSize bytes: copy its first n
// bytes, then insert add.
func delta(baseSize, targetSize, n int, add []byte) []byte {
	var b bytes.Buffer
	varint := func(v int) {
		for v >= 0x80 {
			b.WriteByte(byte(v) | 0x80)
			v >>= 7
		}
		b.WriteByte(byte(v))
	}
	varint(baseSize)
	varint(targetSize)
	if n > 0 {
		b.Write([]byte{0x80 | 0x10, byte(n)}) // copy offset 0, size n (< 256)
	}
	if len(add) > 0 {
		b.WriteByte(byte(len(add)))
		b.Write(add)
	}
	return b.Bytes()
}

var hexID = regexp.MustCompile(`[0-9a-f]{40}`)

// sameRefusal requires a and b to be refusals alike in code, reason and
// message, object ids (the attacker's own choice) aside.
func sameRefusal(t *testing.T, what string, a, b *errdefs.Error) {
	t.Helper()
	if a == nil || b == nil {
		t.Fatalf("%s: accepted (%v / %v); want both refused", what, a, b)
	}
	ma, mb := hexID.ReplaceAllString(a.Message, "<id>"), hexID.ReplaceAllString(b.Message, "<id>")
	t.Logf("%s: %v %s %q", what, a.Kind, a.Reason, ma)
	if a.Kind != b.Kind || a.Reason != b.Reason || ma != mb {
		t.Fatalf("%s: the answer depends on another task's objects:\n  B's object: %v %s %q\n  no object:  %v %s %q", what, a.Kind, a.Reason, ma, b.Kind, b.Reason, mb)
	}
}

// notIn requires repo (and what it reads through its alternates) not to
// hold id.
func notIn(t *testing.T, repo, id string) {
	t.Helper()
	cmd := exec.Command("git", "cat-file", "-e", id)
	cmd.Dir = repo
	cmd.Env = append(cleanEnv(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	if err := cmd.Run(); err == nil {
		t.Fatalf("%s holds %s, an object only task B pushed", repo, id)
	}
}

// Attack 1: a tree naming a guessed blob without sending it is an
// existence oracle, and its commit would carry B's blob to A's reviewer.
func TestIsolationTreeOracle(t *testing.T) {
	w := newIsoWorld(t)
	before := storeSnapshot(t, w.h)
	try := func(blob string) *errdefs.Error {
		tree := treeBody([3]string{"100644", "stolen.env", blob})
		treeID := objectID("tree", tree)
		c := commitBody(treeID, w.baseA, "steal")
		return pushRPC(t, w.h, w.worker, rawBundle([]string{w.baseA}, objectID("commit", c),
			packEntry{typ: "commit", data: c}, packEntry{typ: "tree", data: tree}))
	}
	hit := try(w.blobB)
	miss := try(objectID("blob", []byte("SECRET-B-API-KEY=99999\n")))
	sameRefusal(t, "a tree naming B's blob", hit, miss)
	if d := treesnap.Diff(before, storeSnapshot(t, w.h)); d != "" {
		t.Fatalf("a refused push changed the store:\n%s", d)
	}
	if got := w.ref(t, "refs/work/t1"); got != w.baseA {
		t.Fatalf("refs/work/t1 = %s, want %s", got, w.baseA)
	}
	notIn(t, w.h.TaskRepo(w.business, w.project, "t1"), w.blobB)
	// A's reviewer gets A's work and nothing of B's.
	rev := filepath.Join(filepath.Dir(w.h.Home), "review")
	if got := w.as(t, w.reviewer, "fetch-review", "--repo", rev); got != w.baseA {
		t.Fatalf("fetch-review printed %q, want %s", got, w.baseA)
	}
	notIn(t, rev, w.blobB)
	notIn(t, rev, w.commitB)
}

// Attack 2: a REF_DELTA against B's blob copying its first k bytes, in a
// push that always fails after index-pack (its ref names a tree), told a
// right guess of the prefix from a wrong one by the error.
func TestIsolationDeltaOracle(t *testing.T) {
	w := newIsoWorld(t)
	before := storeSnapshot(t, w.h)
	k := len("SECRET-B-API-KEY=1")
	try := func(base, guess string) *errdefs.Error {
		d := delta(len(secretB), k, k, nil)
		tree := treeBody([3]string{"100644", "guess", objectID("blob", []byte(guess))})
		return pushRPC(t, w.h, w.worker, rawBundle(nil, objectID("tree", tree),
			packEntry{typ: "tree", data: tree}, packEntry{base: base, data: d}))
	}
	nowhere := objectID("blob", []byte(strings.Repeat("x", len(secretB))))
	right, wrong := secretB[:k], "SECRET-B-API-KEY=9"
	rightB, wrongB := try(w.blobB, right), try(w.blobB, wrong)
	sameRefusal(t, "right and wrong prefix of B's blob", rightB, wrongB)
	sameRefusal(t, "a delta against B's blob and against nothing", rightB, try(nowhere, right))
	if d := treesnap.Diff(before, storeSnapshot(t, w.h)); d != "" {
		t.Fatalf("a refused push changed the store:\n%s", d)
	}
	notIn(t, w.h.TaskRepo(w.business, w.project, "t1"), w.blobB)
}

// Attack 3: FetchReview's have answered whether any commit of the project
// exists.
func TestIsolationHaveOracle(t *testing.T) {
	w := newIsoWorld(t)
	fetch := func(have string) *errdefs.Error {
		conn, ctx := dialHome(t, w.h.Home, "git.sock", strings.TrimSpace(readText(t, w.reviewer)))
		st, err := gitv1.NewGitServiceClient(conn).FetchReview(ctx, &gitv1.FetchReviewRequest{Have: have})
		if err != nil {
			return grpcerr.FromStatus(err)
		}
		var got bytes.Buffer
		for {
			m, err := st.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				return grpcerr.FromStatus(err)
			}
			got.Write(m.GetChunk())
		}
		if bytes.Contains(got.Bytes(), []byte(w.commitB)) {
			t.Fatalf("the review bundle of A names B's commit")
		}
		return nil
	}
	nowhere := objectID("commit", commitBody(objectID("tree", nil), w.main, "never pushed"))
	sameRefusal(t, "have naming B's commit", fetch(w.commitB), fetch(nowhere))
	// main and A's own commits are still good haves.
	if err := fetch(w.main); err != nil {
		t.Fatalf("have main: %v", err)
	}
}

// Two tasks pushing the same file each succeed, and fsck passes on the pool
// and on each task's repository. A push against main stays thin: a delta
// against main's README and a prerequisite are taken, and the task's
// repository holds what the task added (and the delta's base, which
// index-pack --fix-thin appends), not main.
func TestIsolationThinAndShared(t *testing.T) {
	w := newIsoWorld(t)
	same := "the same content\n"
	for _, p := range []struct{ tok, work string }{{w.worker, w.work}, {w.workerB, w.workB}} {
		if err := os.WriteFile(filepath.Join(p.work, "same.txt"), []byte(same), 0o644); err != nil {
			t.Fatal(err)
		}
		testGit(t, p.work, "add", "same.txt")
		testGit(t, p.work, "commit", "-q", "-m", "same")
		w.as(t, p.tok, "push-working", "--repo", p.work)
	}
	sameBlob := objectID("blob", []byte(same))
	for _, task := range []string{"t1", "t2"} {
		if !ownObjects(t, w.h.TaskRepo(w.business, w.project, task))[sameBlob] {
			t.Fatalf("task %s's repository lacks the content it pushed", task)
		}
	}
	w.h.FsckProject(t, w.business, w.project)

	latest := testGit(t, w.work, "rev-parse", "HEAD")
	readme := testGit(t, w.work, "rev-parse", "main:README.md")
	body := []byte(testGitInRaw(t, w.work, "", "cat-file", "blob", readme))
	add := []byte("one more line\n")
	target := append(append([]byte{}, body...), add...)
	blob := objectID("blob", target)
	tree := treeBody([3]string{"100644", "README.md", blob})
	c := commitBody(objectID("tree", tree), latest, "thin against main")
	if err := pushRPC(t, w.h, w.worker, rawBundle([]string{latest}, objectID("commit", c),
		packEntry{typ: "commit", data: c}, packEntry{typ: "tree", data: tree},
		packEntry{base: readme, data: delta(len(body), len(target), len(body), add)})); err != nil {
		t.Fatalf("a delta against main's README: %v", err)
	}
	if got := w.ref(t, "refs/work/t1"); got != objectID("commit", c) {
		t.Fatalf("refs/work/t1 = %s, want %s", got, objectID("commit", c))
	}
	// index-pack --fix-thin completes the pack with its delta base (the
	// README), as git always does; main's commit and tree stay the pool's.
	own := ownObjects(t, w.h.TaskRepo(w.business, w.project, "t1"))
	if own[w.main] || own[testGit(t, w.work, "rev-parse", "main^{tree}")] {
		t.Fatal("task A's repository holds main's objects: the push was not thin")
	}
	if !own[blob] {
		t.Fatal("task A's repository lacks the blob it pushed")
	}
	w.h.FsckProject(t, w.business, w.project)
}

// ownObjects lists the objects in repo's own packs and loose objects (not
// its alternates').
func ownObjects(t *testing.T, repo string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	idx, _ := filepath.Glob(filepath.Join(repo, "objects", "pack", "*.idx"))
	for _, f := range idx {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(testGitInRaw(t, repo, string(b), "show-index"), "\n") {
			if f := strings.Fields(line); len(f) >= 2 {
				out[f[1]] = true
			}
		}
	}
	loose, _ := filepath.Glob(filepath.Join(repo, "objects", "[0-9a-f][0-9a-f]", "*"))
	for _, f := range loose {
		out[filepath.Base(filepath.Dir(f))+filepath.Base(f)] = true
	}
	return out
}
