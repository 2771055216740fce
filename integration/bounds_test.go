package integration

import (
	"bufio"
	"bytes"
	"compress/flate"
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/adler32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/treesnap"

	"github.com/bushost/bushost/internal/gitobj"
)

// The bounds of issue 11, as an attacker meets them: a bundle of about a
// megabyte that inflates to a gigabyte, as a commit message or as a blob of
// one repeated byte; a reviewer's have naming a huge object the host seeded;
// a grant recording events in a loop; a task pushing past its quota. Each
// is refused with its reason, leaves the repository as it was and the
// daemon serving, and costs bushostd and every git it starts less than
// memBound of peak memory.

// memBound is the most any process may have resident (VmHWM, ru_maxrss).
const memBound = 256 << 20

// gib is the inflated size of the hostile objects.
const gib = 1 << 30

// hugeObject is an object of size bytes: head, then one byte repeated.
type hugeObject struct {
	typ  string // commit, tree, blob
	head []byte
	fill byte
	size int64 // total, head included
}

func (o hugeObject) id() string {
	h := sha1.New()
	fmt.Fprintf(h, "%s %d\x00", o.typ, o.size)
	h.Write(o.head)
	o.eachRun(func(run []byte) { h.Write(run) })
	return hex.EncodeToString(h.Sum(nil))
}

// eachRun calls f with the fill bytes after head, in runs of at most 1 MiB.
func (o hugeObject) eachRun(f func([]byte)) {
	run := bytes.Repeat([]byte{o.fill}, 1<<20)
	for n := o.size - int64(len(o.head)); n > 0; n -= int64(len(run)) {
		f(run[:min(n, int64(len(run)))])
	}
}

// writeZlib writes o's content as one zlib stream, fast: deflating a
// gigabyte takes Go ten seconds, so one MiB of the fill byte is deflated
// once, against a dictionary of that byte, and its blocks repeated (each
// block refers back only to fill bytes, which precede it).
func (o hugeObject) writeZlib(w io.Writer) error {
	w.Write([]byte{0x78, 0x9c})
	ad := adler32.New()
	run := bytes.Repeat([]byte{o.fill}, 1<<20)
	dict := run[:32<<10]
	fw, _ := flate.NewWriter(w, flate.DefaultCompression)
	fw.Write(o.head)
	ad.Write(o.head)
	left := o.size - int64(len(o.head))
	lead := min(left, int64(len(dict)))
	fw.Write(run[:lead])
	ad.Write(run[:lead])
	left -= lead
	if err := fw.Flush(); err != nil {
		return err
	}
	var mib bytes.Buffer
	mw, _ := flate.NewWriterDict(&mib, flate.DefaultCompression, dict)
	mw.Write(run)
	mw.Flush()
	for ; left >= int64(len(run)); left -= int64(len(run)) {
		w.Write(mib.Bytes())
		ad.Write(run)
	}
	tw, _ := flate.NewWriterDict(w, flate.DefaultCompression, dict)
	tw.Write(run[:left])
	ad.Write(run[:left])
	if err := tw.Close(); err != nil {
		return err
	}
	return binary.Write(w, binary.BigEndian, ad.Sum32())
}

// writeHugeBundle writes a v2 bundle to path: prerequisite base, one ref
// at ref, and a pack of objs in order. It returns the bundle's size.
func writeHugeBundle(t *testing.T, path, base, ref string, objs ...hugeObject) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	fmt.Fprintf(bw, "# v2 git bundle\n-%s base\n%s refs/heads/work\n\n", base, ref)
	h := sha1.New()
	w := io.MultiWriter(bw, h)
	w.Write([]byte("PACK\x00\x00\x00\x02"))
	binary.Write(w, binary.BigEndian, uint32(len(objs)))
	types := map[string]byte{"commit": 1, "tree": 2, "blob": 3}
	for _, o := range objs {
		w.Write(gitobj.AppendEntryHeader(nil, int(types[o.typ]), uint64(o.size)))
		if err := o.writeZlib(w); err != nil {
			t.Fatal(err)
		}
	}
	bw.Write(h.Sum(nil))
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// ids computes the ids of objs concurrently (a gigabyte takes seconds).
func ids(objs ...hugeObject) []string {
	out := make([]string, len(objs))
	var wg sync.WaitGroup
	for i, o := range objs {
		wg.Add(1)
		go func() { defer wg.Done(); out[i] = o.id() }()
	}
	wg.Wait()
	return out
}

// hostileBundles writes the two bundles of the issue against main (its
// commit and tree) with objects of size bytes: a commit whose message
// fills it, and a commit whose tree holds a blob of one repeated byte.
func hostileBundles(t *testing.T, dir, main, mainTree string, size int64) (message, blob string) {
	t.Helper()
	head := fmt.Sprintf("tree %s\nparent %s\nauthor A <a@localhost> 1700000000 +0000\ncommitter A <a@localhost> 1700000000 +0000\n\n", mainTree, main)
	msg := hugeObject{typ: "commit", head: []byte(head), fill: 'x', size: size}
	big := hugeObject{typ: "blob", fill: 0, size: size}
	got := ids(msg, big)
	rawBlob, _ := hex.DecodeString(got[1])
	tree := hugeObject{typ: "tree", head: append([]byte("100644 big.bin\x00"), rawBlob...)}
	tree.size = int64(len(tree.head))
	treeID := tree.id()
	commitHead := fmt.Sprintf("tree %s\nparent %s\nauthor A <a@localhost> 1700000000 +0000\ncommitter A <a@localhost> 1700000000 +0000\n\nbig\n", treeID, main)
	commit := hugeObject{typ: "commit", head: []byte(commitHead), size: int64(len(commitHead))}
	message = filepath.Join(dir, fmt.Sprintf("message-%d.bundle", size))
	blob = filepath.Join(dir, fmt.Sprintf("blob-%d.bundle", size))
	n1 := writeHugeBundle(t, message, main, got[0], msg)
	n2 := writeHugeBundle(t, blob, main, commit.id(), commit, tree, big)
	t.Logf("bundles of %d-byte objects: message %d bytes, blob %d bytes", size, n1, n2)
	return message, blob
}

// gitRSS puts a git that records every run's peak memory first on the
// PATH it returns, and reads back what it recorded.
func gitRSS(t *testing.T) (path string, read func() []rssEntry) {
	t.Helper()
	dir := filepath.Join(baseDir(t), "gitrss")
	os.MkdirAll(dir, 0o755)
	b, err := os.ReadFile(testdataBin(t, "gitrss"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "git"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir + string(os.PathListSeparator) + os.Getenv("PATH"), func() []rssEntry {
		data, err := os.ReadFile(filepath.Join(dir, "gitrss.log"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		var out []rssEntry
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			kb, sub, ok := strings.Cut(line, " ")
			if n, err := strconv.ParseInt(kb, 10, 64); ok && err == nil {
				out = append(out, rssEntry{sub: sub, bytes: n << 10})
			}
		}
		return out
	}
}

type rssEntry struct {
	sub   string
	bytes int64
}

// checkMemory requires bushostd's and every git run's peak under memBound.
func checkMemory(t *testing.T, h *Host, runs []rssEntry) {
	t.Helper()
	hwm := vmHWM(t, h.PID())
	t.Logf("bushostd peak RSS %d MiB", hwm>>20)
	if hwm >= memBound {
		t.Errorf("bushostd peak RSS %d MiB, over %d MiB", hwm>>20, memBound>>20)
	}
	if len(runs) == 0 {
		t.Fatal("no git run was recorded")
	}
	var peak rssEntry
	for _, r := range runs {
		if r.bytes > peak.bytes {
			peak = r
		}
		if r.bytes >= memBound {
			t.Errorf("git %s peaked at %d MiB, over %d MiB", r.sub, r.bytes>>20, memBound>>20)
		}
	}
	t.Logf("%d git runs, the largest git %s at %d MiB", len(runs), peak.sub, peak.bytes>>20)
}

// pushFile pushes a bundle file through the GitService as bushost does.
func pushFile(t *testing.T, h *Host, tokenFile, path string) (*gitv1.PushWorkingResponse, error) {
	t.Helper()
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	conn, ctx := dialHome(t, h.Home, "git.sock", strings.TrimSpace(string(tok)))
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	stream, err := gitv1.NewGitServiceClient(conn).PushWorking(ctx)
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: fi.Size()}}}); err != nil {
		_, err = stream.CloseAndRecv()
		return nil, err
	}
	buf := make([]byte, 1<<20)
	for {
		n, rerr := io.ReadFull(f, buf)
		if n > 0 {
			if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: buf[:n]}}); err != nil {
				_, err = stream.CloseAndRecv()
				return nil, err
			}
		}
		if rerr != nil {
			break
		}
	}
	return stream.CloseAndRecv()
}

// refusedWith requires err to be ResourceExhausted with reason and the
// limit in its metadata.
func refusedWith(t *testing.T, err error, reason errdefs.Reason, limit int64) *errdefs.Error {
	t.Helper()
	e := grpcerr.FromStatus(err)
	if err == nil || e.Kind != errdefs.KindResourceExhausted || e.Reason != reason || e.Metadata["limit"] != strconv.FormatInt(limit, 10) {
		t.Fatalf("got %v (%+v), want ResourceExhausted %s with limit %d", err, e, reason, limit)
	}
	return e
}

// fsckAll runs git fsck --strict on every repository of the home.
func fsckAll(t *testing.T, h *Host) {
	t.Helper()
	pools, _ := filepath.Glob(filepath.Join(h.Home, "repos", "*", "*", "pool.git"))
	tasks, _ := filepath.Glob(filepath.Join(h.Home, "repos", "*", "*", "tasks", "*.git"))
	repos := append(pools, tasks...)
	if len(repos) == 0 {
		t.Fatal("no repository to fsck")
	}
	for _, r := range repos {
		testGit(t, r, "fsck", "--strict", "--no-progress")
	}
}

// serving requires the daemon to answer the host and be the same process.
func serving(t *testing.T, h *Host, pid int) {
	t.Helper()
	h.Must(t, "log", "verify")
	if h.PID() != pid {
		t.Fatal("bushostd restarted")
	}
}

func TestBoundsHugeObjects(t *testing.T) {
	if testing.Short() {
		t.Skip("writes two gigabyte objects")
	}
	path, runs := gitRSS(t)
	h := startHostWith(t, hostOpts{Env: []string{"PATH=" + path}})
	pid := h.PID()
	root := h.AddProject(t, "acme", "web")
	main := testGit(t, root, "rev-parse", "HEAD")
	mainTree := testGit(t, root, "rev-parse", "HEAD^{tree}")
	tok := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	dir := filepath.Dir(h.Home)

	// The same construction at a size within the limits is a bundle git
	// accepts whole: what is refused below is only the size.
	msgOK, blobOK := hostileBundles(t, dir, main, mainTree, 512<<10)
	for i, b := range []string{msgOK, blobOK} {
		tk := h.Grant(t, "acme", "web", fmt.Sprintf("ok%d", i), "worker", "git.push.working")
		if _, err := pushFile(t, h, tk, b); err != nil {
			t.Fatalf("%s: %v", filepath.Base(b), err)
		}
	}

	msg, blob := hostileBundles(t, dir, main, mainTree, gib)
	for _, tc := range []struct {
		bundle, typ, flag string
		limit             int64
	}{
		{msg, "commit", "--max-commit-bytes", 1 << 20},
		{blob, "blob", "--max-object-bytes", 100 << 20},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			fi, _ := os.Stat(tc.bundle)
			if fi.Size() > 2<<20 {
				t.Fatalf("bundle is %d bytes, not about a megabyte", fi.Size())
			}
			before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
			_, err := pushFile(t, h, tok, tc.bundle)
			e := refusedWith(t, err, errdefs.ObjectTooLarge, tc.limit)
			if e.Metadata["type"] != tc.typ || !strings.Contains(e.Message, tc.flag) || e.Metadata["size"] != strconv.Itoa(gib) {
				t.Fatalf("refusal does not name the object and its limit: %s %v", e.Message, e.Metadata)
			}
			// The client as a user runs it says the same.
			_, errs, code := h.Run(t, nil, "--token-file", tok, "push-working", "--bundle", tc.bundle)
			if code == 0 || !strings.Contains(errs, tc.flag) {
				t.Fatalf("bushost push-working: exit %d: %s", code, errs)
			}
			if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
				t.Fatalf("a refused push changed the store:\n%s", d)
			}
		})
	}
	serving(t, h, pid)
	fsckAll(t, h)
	checkMemory(t, h, runs())
}

// A reviewer's have naming a gigabyte object the host seeded costs the
// daemon no more than any other have.
func TestBoundsHaveHugeObject(t *testing.T) {
	if testing.Short() {
		t.Skip("seeds a gigabyte object")
	}
	path, runs := gitRSS(t)
	h := startHostWith(t, hostOpts{Env: []string{"PATH=" + path}})
	pid := h.PID()
	dir := filepath.Dir(h.Home)
	root := filepath.Join(dir, "root")
	os.MkdirAll(root, 0o755)
	testGit(t, root, "init", "-q", "-b", "main")
	// A gigabyte of zero bytes, sparse on disk; git stores it deflated.
	f, err := os.Create(filepath.Join(root, "zeros.bin"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(gib)
	f.Close()
	testGit(t, root, "-c", "core.compression=1", "add", "zeros.bin")
	testGit(t, root, "commit", "-q", "-m", "a gigabyte of zeros")
	blobID := testGit(t, root, "rev-parse", "HEAD:zeros.bin")
	main := h.Must(t, "project", "add", "--business", "acme", "--project", "web", "--root", root)
	os.Remove(filepath.Join(root, "zeros.bin"))

	// A worker's push on top of main, made without checking the
	// gigabyte out.
	work := filepath.Join(dir, "work.git")
	testGit(t, dir, "clone", "-q", "--bare", root, work)
	c := testGit(t, work, "commit-tree", "-p", main, "-m", "work", main+"^{tree}")
	testGit(t, work, "update-ref", "refs/heads/work", c)
	bundle := filepath.Join(dir, "work.bundle")
	testGit(t, work, "bundle", "create", "-q", bundle, "refs/heads/work", "^"+main)
	wtok := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	h.Must(t, "--token-file", wtok, "push-working", "--bundle", bundle)

	rtok := h.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	tok, _ := os.ReadFile(rtok)
	conn, ctx := dialHome(t, h.Home, "git.sock", strings.TrimSpace(string(tok)))
	fetch := func(have string) (int, error) {
		stream, err := gitv1.NewGitServiceClient(conn).FetchReview(ctx, &gitv1.FetchReviewRequest{Have: have})
		if err != nil {
			return 0, err
		}
		n := 0
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			if err != nil {
				return n, err
			}
			n += len(m.GetChunk())
		}
	}
	before := runs()
	if _, err := fetch(blobID); codeOf(err) != errdefs.KindInvalidArgument || !strings.Contains(err.Error(), "not a commit") {
		t.Fatalf("have naming the gigabyte blob: %v", err)
	}
	if n, err := fetch(main); err != nil || n > 64<<10 {
		t.Fatalf("have naming main: %d bytes, %v", n, err)
	}
	checkMemory(t, h, runs()[len(before):])
	serving(t, h, pid)
	fsckAll(t, h)
	checkMemory(t, h, runs())
}

func codeOf(err error) errdefs.Kind { return grpcerr.FromStatus(err).Kind }

func TestBoundsEventQuota(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--event-rate", "3"}})
	pid := h.PID()
	h.AddProject(t, "acme", "web")
	a := h.Grant(t, "acme", "web", "t1", "agent", "event.record")
	b := h.Grant(t, "acme", "web", "t2", "agent", "event.record")
	// The bucket holds 3 events and refills one every 20 s while the loop
	// runs, so the first refusal comes after at least 3 events, and soon
	// after however slow the machine (a CLI run would need 20 s to keep up).
	accepted := 0
	for {
		_, errs, code := h.Run(t, nil, "--token-file", a, "event", "record", "--type", "note", "--data", fmt.Sprintf(`{"i":%d}`, accepted))
		if code == 0 {
			accepted++
			if accepted > 40 {
				t.Fatal("40 events in a row, none refused")
			}
			continue
		}
		if accepted < 3 || !strings.Contains(errs, "--event-rate") {
			t.Fatalf("event %d refused: exit %d: %s", accepted, code, errs)
		}
		break
	}
	// Another grant's events still go through, while the first is refused.
	h.Must(t, "--token-file", b, "event", "record", "--type", "note")
	// A batch is one call and one transaction, charged whole: two fit
	// what b has left, two more do not and add nothing.
	batch := filepath.Join(t.TempDir(), "batch")
	if err := os.WriteFile(batch, []byte("{\"b\":1}\n\n{\"b\":2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if seqs := strings.Fields(h.Must(t, "--token-file", b, "event", "record", "--type", "note", "--batch", batch)); len(seqs) != 2 {
		t.Fatalf("a batch of two printed %q, want two sequence numbers", seqs)
	}
	if _, errs, code := h.Run(t, nil, "--token-file", b, "event", "record", "--type", "note", "--batch", batch); code != 7 || !strings.Contains(errs, "EVENT_RATE_EXCEEDED") {
		t.Fatalf("a batch past the quota: exit %d: %s", code, errs)
	}
	if _, errs, code := h.Run(t, nil, "--token-file", b, "event", "record", "--type", "note", "--batch", batch, "--data", "{}"); code != 2 {
		t.Fatalf("--batch with --data: exit %d, want 2 (usage): %s", code, errs)
	}
	if n := strings.Count(h.Must(t, "events", "--task", "t2", "--json"), `"note"`); n != 3 {
		t.Fatalf("task t2 has %d notes, want 3 (one, then a batch of two)", n)
	}
	// Through the API: the reason, the limit and when to retry.
	tok, _ := os.ReadFile(a)
	conn, ctx := dialHome(t, h.Home, "broker.sock", strings.TrimSpace(string(tok)))
	_, err := brokerv1.NewBrokerServiceClient(conn).RecordEvent(ctx, &brokerv1.RecordEventRequest{Type: "note"})
	if e := refusedWith(t, err, errdefs.EventRateExceeded, 3); e.RetryAfter <= 0 {
		t.Fatalf("no retry hint: %+v", e)
	}
	out := h.Must(t, "events", "--task", "t1", "--json")
	if n := strings.Count(out, `"note"`); n != accepted {
		t.Fatalf("task t1 has %d notes, want the %d accepted", n, accepted)
	}
	serving(t, h, pid)
}

func TestBoundsTaskQuota(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--max-task-bytes", "256K"}})
	pid := h.PID()
	root := h.AddProject(t, "acme", "web")
	dir := filepath.Dir(h.Home)
	work := filepath.Join(dir, "work")
	testGit(t, dir, "clone", "-q", root, work)
	tok := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	commitNoise := func(name string, n int) {
		b := make([]byte, n)
		rand.Read(b)
		os.WriteFile(filepath.Join(work, name), b, 0o644)
		testGit(t, work, "add", name)
		testGit(t, work, "commit", "-q", "-m", name)
	}
	commitNoise("a.bin", 100<<10)
	first := filepath.Join(dir, "a.bundle")
	testGit(t, work, "bundle", "create", "-q", first, "HEAD", "^origin/main")
	h.Must(t, "--token-file", tok, "push-working", "--bundle", first)
	commitNoise("b.bin", 200<<10)
	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
	bundle := filepath.Join(dir, "b.bundle")
	testGit(t, work, "bundle", "create", "-q", bundle, "HEAD", "^HEAD~1")
	_, err := pushFile(t, h, tok, bundle)
	e := refusedWith(t, err, errdefs.TaskQuota, 256<<10)
	if !strings.Contains(e.Message, "--max-task-bytes") {
		t.Fatal(e.Message)
	}
	_, errs, code := h.Run(t, nil, "--token-file", tok, "push-working", "--bundle", bundle)
	if code == 0 || !strings.Contains(errs, "--max-task-bytes") {
		t.Fatalf("bushost push-working: exit %d: %s", code, errs)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("a refused push changed the store:\n%s", d)
	}
	// Another task of the project still pushes.
	tok2 := h.Grant(t, "acme", "web", "t2", "worker", "git.push.working")
	h.Must(t, "--token-file", tok2, "push-working", "--bundle", bundle2(t, work, dir))
	serving(t, h, pid)
	fsckAll(t, h)
}

// bundle2 is a small push of its own for a second task.
func bundle2(t *testing.T, work, dir string) string {
	t.Helper()
	testGit(t, work, "checkout", "-q", "-b", "other", "origin/main")
	os.WriteFile(filepath.Join(work, "small.txt"), []byte("small\n"), 0o644)
	testGit(t, work, "add", "small.txt")
	testGit(t, work, "commit", "-q", "-m", "small")
	b := filepath.Join(dir, "small.bundle")
	testGit(t, work, "bundle", "create", "-q", b, "HEAD", "^origin/main")
	return b
}
