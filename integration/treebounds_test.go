package integration

import (
	"bytes"
	"compress/zlib"
	"crypto/rand"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/gitobj"
	"github.com/bushost/bushost/internal/testenv"
	"github.com/bushost/bushost/internal/treesnap"
)

// Issue 31: a push bounded in total. A commit whose tree expands to 2^30
// paths (1.7 KB as a bundle), a bundle of deltas that inflate to 9.9 GB,
// and a push of 600 tree deltas cancelled half way: each refused or
// stopped, nothing left behind, the daemon small; and a tree of 200,000
// files, which is legitimate, pushes, lands and publishes.

// bomb writes, in the worker's clone work, a commit on its HEAD whose tree
// names levels levels of two copies of one subtree (2^levels paths in
// levels+1 trees), made with git plumbing; it returns the commit and a
// bundle of it.
func bomb(t *testing.T, work string, levels int) (commit, bundleFile string) {
	t.Helper()
	blob := testGitIn(t, work, "x\n", "hash-object", "-w", "--stdin")
	tree := testGitIn(t, work, "100644 blob "+blob+"\tf\n", "mktree")
	for i := 0; i < levels; i++ {
		tree = testGitIn(t, work, fmt.Sprintf("040000 tree %s\ta\n040000 tree %s\tb\n", tree, tree), "mktree")
	}
	head := testGit(t, work, "rev-parse", "HEAD")
	commit = testGit(t, work, "commit-tree", "-p", head, "-m", "bomb", tree)
	testGit(t, work, "update-ref", "refs/heads/bomb", commit)
	bundleFile = filepath.Join(filepath.Dir(work), "bomb.bundle")
	testGit(t, work, "bundle", "create", "-q", bundleFile, "bomb", "^"+head)
	return commit, bundleFile
}

// The tree bomb is refused at the push (TREE_TOO_LARGE, exit 7), bushostd
// staying under memBound, nothing left or recorded. Pushed past a raised
// bound and approved, the daemon started again with the default bound
// refuses to land it, --merge included, as the attack of issue 31 tried.
func TestAttackTreeBomb(t *testing.T) {
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	commit, b := bomb(t, f.work, 30)
	if fi, _ := os.Stat(b); fi.Size() > 4096 {
		t.Fatalf("the bomb's bundle is %d bytes", fi.Size())
	}
	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
	events := len(brokerEvents(t, h))
	_, errs := runAs(t, h, f.worker, 7, "push-working", "--bundle", b)
	if !strings.Contains(errs, "TREE_TOO_LARGE") || !strings.Contains(errs, commit) || !strings.Contains(errs, "--max-tree-paths") {
		t.Fatalf("the tree bomb: %s", errs)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("the refused push changed the store:\n%s", d)
	}
	if n := len(brokerEvents(t, h)); n != events {
		t.Fatalf("the refused push appended to the log: %d -> %d events", events, n)
	}
	hwm := vmHWM(t, h.PID())
	t.Logf("bushostd peak RSS %d MiB", hwm>>20)
	if hwm >= memBound {
		t.Fatalf("bushostd peak RSS %d MiB, over %d MiB", hwm>>20, memBound>>20)
	}

	// Past a bound raised for it, the same push is taken and approved.
	h.Args = []string{"--max-tree-paths", strconv.Itoa(1 << 31)}
	h.Restart(t)
	runAs(t, h, f.worker, 0, "push-working", "--bundle", b)
	f.approve(t)
	h.Args = nil
	h.Restart(t)
	if err := os.WriteFile(filepath.Join(f.root, "other.txt"), []byte("host's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, f.root, "add", "other.txt")
	testGit(t, f.root, "commit", "-q", "-m", "host's change")
	h.Must(t, "project", "sync", "--business", "acme", "--project", "web")
	_, errs = refusedLand(t, h, f.lander, 7, "TREE_TOO_LARGE", "--merge")
	if !strings.Contains(errs, "--max-tree-paths") {
		t.Fatalf("land --merge of the bomb: %s", errs)
	}
	hwm = vmHWM(t, h.PID())
	t.Logf("bushostd peak RSS after the landing %d MiB", hwm>>20)
	if hwm >= memBound {
		t.Fatalf("bushostd peak RSS %d MiB, over %d MiB", hwm>>20, memBound>>20)
	}
	h.FsckProject(t, "acme", "web")
}

// manyFiles commits, with git fast-import in the worker's clone work, n
// files in directories of 1,000 on top of its HEAD as refs/heads/name, and
// returns the commit and a bundle of it against HEAD.
func manyFiles(t *testing.T, work, name string, n int) (commit, bundleFile string) {
	t.Helper()
	head := testGit(t, work, "rev-parse", "HEAD")
	var in strings.Builder
	for i := 0; i < n; i++ {
		body := fmt.Sprintf("file %d\n", i)
		fmt.Fprintf(&in, "blob\nmark :%d\ndata %d\n%s\n", i+1, len(body), body)
	}
	msg := fmt.Sprintf("%d files", n)
	fmt.Fprintf(&in, "commit refs/heads/%s\ncommitter tester <tester@localhost> 1700000000 +0000\ndata %d\n%s\nfrom %s\n", name, len(msg), msg, head)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&in, "M 100644 :%d d%03d/f%04d.txt\n", i+1, i/1000, i%1000)
	}
	testGitIn(t, work, in.String(), "fast-import", "--quiet")
	commit = testGit(t, work, "rev-parse", "refs/heads/"+name)
	bundleFile = filepath.Join(filepath.Dir(work), name+".bundle")
	testGit(t, work, "bundle", "create", "-q", bundleFile, name, "^"+head)
	return commit, bundleFile
}

// A tree of 200,000 files is no bomb: it pushes, lands as a fast-forward,
// a second task's work lands onto it with --merge (the merge's tree is
// checked too), and main publishes.
func TestLargeTreePushLandPublish(t *testing.T) {
	if testing.Short() {
		t.Skip("commits 200,000 files")
	}
	h := startHost(t)
	f := newLandFixture(t, h, "web", "t1")
	// t2 works from the same main and is approved before t1 lands.
	worker2 := h.Grant(t, "acme", "web", "t2", "worker", "git.push.working", "review.request")
	reviewer2 := h.Grant(t, "acme", "web", "t2", "reviewer", "review.verdict")
	lander2 := h.Grant(t, "acme", "web", "t2", "lead", "task.land")
	work2 := filepath.Join(filepath.Dir(h.Home), "work2")
	runAs(t, h, worker2, 0, "fetch-main", "--repo", work2)
	if err := os.WriteFile(filepath.Join(work2, "t2.txt"), []byte("t2's work\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, work2, "add", "t2.txt")
	testGit(t, work2, "commit", "-q", "-m", "t2")
	runAs(t, h, worker2, 0, "push-working", "--repo", work2)
	id, _ := runAs(t, h, worker2, 0, "review", "request")
	review2 := filepath.Join(filepath.Dir(h.Home), "review2")
	runAs(t, h, reviewer2, 0, "fetch-review", "--repo", review2)
	runAs(t, h, reviewer2, 0, "review", "verdict", "--request", id, "--approve", "--repo", review2)

	commit, b := manyFiles(t, f.work, "big", 200_000)
	runAs(t, h, f.worker, 0, "push-working", "--bundle", b)
	f.approve(t)
	runAs(t, h, f.lander, 0, "task", "land")
	if got := f.main(t); got != commit {
		t.Fatalf("main is %s after landing %s", got, commit)
	}
	runAs(t, h, lander2, 0, "task", "land", "--merge")
	merge := f.main(t)
	paths := func(c string) int {
		return strings.Count(testGit(t, f.repo, "ls-tree", "-r", "--name-only", c), "\n") + 1
	}
	if n, want := paths(merge), paths(commit)+1; n != want {
		t.Fatalf("the merge holds %d paths, want %d", n, want)
	}
	if out := h.Must(t, "project", "publish", "--business", "acme", "--project", "web"); out != merge {
		t.Fatalf("publish printed %q, want %s", out, merge)
	}
	h.FsckProject(t, "acme", "web")
}

// rawPack builds a pack of entries (type, inflated content; an OFS_DELTA
// names its base by index) and a v2 bundle of it: prerequisite base, its
// one ref tip.
type rawEntry struct {
	typ  int
	data []byte
	base int    // OFS_DELTA: the index of its base entry
	ref  string // REF_DELTA: its base's id
}

func writeRawBundle(t *testing.T, path, base, tip string, entries []rawEntry) int64 {
	t.Helper()
	var pack bytes.Buffer
	pack.WriteString("PACK")
	binary.Write(&pack, binary.BigEndian, uint32(2))
	binary.Write(&pack, binary.BigEndian, uint32(len(entries)))
	offs := make([]int, len(entries))
	zw, _ := zlib.NewWriterLevel(&pack, zlib.BestSpeed)
	for i, e := range entries {
		offs[i] = pack.Len()
		pack.Write(gitobj.AppendEntryHeader(nil, e.typ, uint64(len(e.data))))
		if e.typ == 6 {
			back := offs[i] - offs[e.base]
			ofs := []byte{byte(back & 0x7f)}
			for back >>= 7; back > 0; back >>= 7 {
				back--
				ofs = append([]byte{byte(0x80 | back&0x7f)}, ofs...)
			}
			pack.Write(ofs)
		}
		if e.typ == 7 {
			id, err := hex.DecodeString(e.ref)
			if err != nil || len(id) != 20 {
				t.Fatalf("REF_DELTA base %q", e.ref)
			}
			pack.Write(id)
		}
		zw.Reset(&pack)
		zw.Write(e.data)
		zw.Close()
	}
	sum := sha1.Sum(pack.Bytes())
	pack.Write(sum[:])
	out := append([]byte(fmt.Sprintf("# v2 git bundle\n-%s\n%s refs/heads/work\n\n", base, tip)), pack.Bytes()...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return int64(len(out))
}

// varint is a delta header's size (little-endian base 128).
func varint(v int) []byte {
	var out []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(out, c)
		}
		out = append(out, c|0x80)
	}
}

// A bundle of 100 deltas against one 64 KiB blob, each inflating to 99 MB
// (under --max-object-bytes), 9.9 GB in all, is refused as it streams in
// (PUSH_INFLATED_TOO_LARGE) within 15 s, nothing left behind.
func TestAttackDeltaBomb(t *testing.T) {
	h := startHost(t)
	root := h.AddProject(t, "acme", "web")
	main := testGit(t, root, "rev-parse", "HEAD")
	tok := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	base := make([]byte, 1<<16)
	rand.Read(base)
	entries := []rawEntry{{typ: 3, data: base}}
	const copies = 1510 // each a one-byte copy of the whole base
	delta := append(varint(len(base)), varint(copies*len(base))...)
	delta = append(delta, bytes.Repeat([]byte{0x80}, copies)...)
	for i := 0; i < 100; i++ {
		entries = append(entries, rawEntry{typ: 6, data: delta, base: 0})
	}
	b := filepath.Join(filepath.Dir(h.Home), "deltas.bundle")
	n := writeRawBundle(t, b, main, main, entries)
	t.Logf("a %d-byte bundle declaring %.1f GB", n, float64(100*copies*len(base))/1e9)
	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
	events := len(brokerEvents(t, h))
	start := time.Now()
	_, errs := runAs(t, h, tok, 7, "push-working", "--bundle", b)
	took := time.Since(start)
	if !strings.Contains(errs, "PUSH_INFLATED_TOO_LARGE") || !strings.Contains(errs, "--max-push-inflated") {
		t.Fatalf("the delta bomb: %s", errs)
	}
	t.Logf("refused in %v", took)
	if took > 15*time.Second {
		t.Fatalf("the delta bomb took %v to refuse", took)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("the refused push changed the store:\n%s", d)
	}
	if m := len(brokerEvents(t, h)); m != events {
		t.Fatalf("the refused push appended to the log: %d -> %d events", events, m)
	}
}

// treeDeltaBundle is a bundle of a chain of commits on main, 1 + deltas of
// them: the first with a tree of some 2 MB (entries naming one blob), each
// next with that tree plus one entry, sent as an OFS_DELTA on it.
func treeDeltaBundle(t *testing.T, path, main string, deltas int) {
	t.Helper()
	blob := []byte("x\n")
	blobID := objectID("blob", blob)
	raw := func(id string) []byte {
		b, err := hex.DecodeString(id)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var base []byte
	for i := 0; i < 58_000; i++ {
		base = append(append(base, fmt.Sprintf("100644 f%06d\x00", i)...), raw(blobID)...)
	}
	entries := []rawEntry{{typ: 3, data: blob}, {typ: 2, data: base}}
	trees := []string{objectID("tree", base)}
	for i := 0; i < deltas; i++ {
		add := append([]byte(fmt.Sprintf("100644 z%05d\x00", i)), raw(blobID)...)
		d := append(varint(len(base)), varint(len(base)+len(add))...)
		n := len(base)
		d = append(d, 0x80|0x10|0x20|0x40, byte(n), byte(n>>8), byte(n>>16), byte(len(add)))
		d = append(d, add...)
		entries = append(entries, rawEntry{typ: 6, data: d, base: 1})
		trees = append(trees, objectID("tree", append(base[:len(base):len(base)], add...)))
	}
	parent := main
	for i, tree := range trees {
		c := []byte(fmt.Sprintf("tree %s\nparent %s\nauthor a <a@b> 1700000000 +0000\ncommitter a <a@b> 1700000000 +0000\n\n%d\n", tree, parent, i))
		entries = append(entries, rawEntry{typ: 1, data: c})
		parent = objectID("commit", c)
	}
	writeRawBundle(t, path, main, parent, entries)
}

// workCPU is the CPU time of the process pid and its descendants, alive
// or reaped, and how many descendants are alive (bushostd's git children
// run in process groups of their own, so they are found by parent).
func workCPU(t *testing.T, pid int) (time.Duration, int) {
	t.Helper()
	type proc struct{ ppid, ticks int64 }
	procs := map[int64]proc{}
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range dirs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		s := string(data)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		id, _ := strconv.ParseInt(filepath.Base(filepath.Dir(p)), 10, 64)
		ppid, _ := strconv.ParseInt(f[1], 10, 64)
		var ticks int64
		fields := []int{14, 15} // utime, stime
		if int(id) == pid {
			fields = append(fields, 16, 17) // and its reaped children's
		}
		for _, i := range fields {
			v, _ := strconv.ParseInt(f[i-3], 10, 64)
			ticks += v
		}
		procs[id] = proc{ppid, ticks}
	}
	var total int64
	alive := 0
	for id, p := range procs {
		for a := id; a > 1; a = procs[a].ppid {
			if a == int64(pid) {
				total += p.ticks
				if id != int64(pid) {
					alive++
				}
				break
			}
			if _, ok := procs[a]; !ok {
				break
			}
		}
	}
	return time.Duration(total) * 10 * time.Millisecond, alive
}

// childRunning says whether a descendant of pid runs git sub.
func childRunning(pid int, sub string) bool {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range dirs {
		cmd, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(cmd, []byte("\x00"+sub+"\x00")) {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		if f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			return true
		}
	}
	return false
}

// A push of 600 tree deltas (3.5 GB of trees to build, hash, fsck and
// walk) whose client is killed stops all its work within a second, while
// index-pack runs and again while the walk runs after it: bushostd's CPU
// time, with its children's, stops growing and no child is left; nothing
// of the push is kept or recorded.
func TestAttackCancelledPushStops(t *testing.T) {
	h := startHost(t)
	root := h.AddProject(t, "acme", "web")
	main := testGit(t, root, "rev-parse", "HEAD")
	b := filepath.Join(filepath.Dir(h.Home), "trees.bundle")
	treeDeltaBundle(t, b, main, 600)
	fi, _ := os.Stat(b)
	t.Logf("a %d-byte bundle of 600 tree deltas", fi.Size())
	for _, tc := range []struct {
		name string
		walk bool // cut once index-pack is done, else while it runs
	}{{"during index-pack", false}, {"during the walk", true}} {
		t.Run(tc.name, func(t *testing.T) {
			tok := h.Grant(t, "acme", "web", "t-"+strings.ReplaceAll(tc.name, " ", "-"), "worker", "git.push.working")
			before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
			events := len(brokerEvents(t, h))
			pid := h.PID()
			cmd := exec.Command(h.client, "--home", h.Home, "--token-file", tok, "push-working", "--bundle", b)
			cmd.Env = cleanEnv()
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			testenv.WaitFor(t, time.Minute, "index-pack to start", func() bool { return childRunning(pid, "index-pack") })
			if tc.walk {
				// index-pack done, the push goes on in process: the
				// walk reads 601 trees of 2 MB each.
				testenv.WaitFor(t, 5*time.Minute, "index-pack to end", func() bool { return !childRunning(pid, "index-pack") })
			}
			// The step is under way: it has spent 300 ms of CPU.
			from, _ := workCPU(t, pid)
			testenv.WaitFor(t, time.Minute, "the push to work", func() bool {
				cpu, _ := workCPU(t, pid)
				return cpu-from >= 300*time.Millisecond
			})
			if running := childRunning(pid, "index-pack"); running == tc.walk {
				t.Fatalf("index-pack running: %v, at the cut %s", running, tc.name)
			}
			select {
			case err := <-exited:
				t.Fatalf("the push ended before it was cut: %v\n%s", err, out.String())
			default:
			}
			cmd.Process.Kill()
			<-exited
			// Stopped: the CPU time unchanged over 200 ms, and no child.
			last, lastAt := time.Duration(-1), time.Now()
			cut := time.Now()
			testenv.WaitFor(t, 1200*time.Millisecond, "bushostd to stop the push's work", func() bool {
				cpu, alive := workCPU(t, pid)
				if cpu != last || alive > 0 {
					last, lastAt = cpu, time.Now()
					return false
				}
				return time.Since(lastAt) >= 200*time.Millisecond
			})
			t.Logf("stopped %v after the cut (CPU %v)", lastAt.Sub(cut), last)
			testenv.WaitFor(t, 10*time.Second, "the cut push to leave the store as it was", func() bool {
				return treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))) == ""
			})
			if m := len(brokerEvents(t, h)); m != events {
				t.Fatalf("the cut push appended to the log: %d -> %d events", events, m)
			}
		})
	}
}

// A thin pack's REF_DELTA entries make index-pack read their bases from
// the repository and append them to the pack (--fix-thin): a delta of a
// few bytes against each large blob of main's history costs what those
// blobs inflate to, and stores them again in the task's repository. So a
// base counts toward --max-push-inflated too (each once, by the size the
// delta's header declares): 24 deltas of a few bytes each against 24
// blobs of 1 MiB of main are refused under a bound of 8 MiB, nothing
// left behind.
func TestAttackThinBasesCountTowardTheInflatedBound(t *testing.T) {
	h := startHostWith(t, hostOpts{Args: []string{"--max-push-inflated", "8M"}})
	root := filepath.Join(filepath.Dir(h.Home), "root-acme-web")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	testGit(t, root, "init", "-q", "-b", "main")
	const bases = 24
	var ids []string
	var firsts []byte
	for i := 0; i < bases; i++ {
		b := make([]byte, 1<<20)
		rand.Read(b)
		name := fmt.Sprintf("asset%02d.bin", i)
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		ids, firsts = append(ids, objectID("blob", b)), append(firsts, b[0])
	}
	testGit(t, root, "add", ".")
	testGit(t, root, "commit", "-q", "-m", "assets")
	h.Must(t, "project", "add", "--business", "acme", "--project", "web", "--root", root)
	main := testGit(t, root, "rev-parse", "HEAD")
	tok := h.Grant(t, "acme", "web", "t1", "worker", "git.push.working")

	var entries []rawEntry
	var tree [][3]string
	for i, id := range ids {
		add := []byte(fmt.Sprintf("-%02d", i))
		d := delta(1<<20, 1+len(add), 1, add)
		entries = append(entries, rawEntry{typ: 7, data: d, ref: id})
		tree = append(tree, [3]string{"100644", fmt.Sprintf("f%02d", i), objectID("blob", append([]byte{firsts[i]}, add...))})
	}
	tb := treeBody(tree...)
	c := commitBody(objectID("tree", tb), main, "thin")
	entries = append(entries, rawEntry{typ: 2, data: tb}, rawEntry{typ: 1, data: c})
	b := filepath.Join(filepath.Dir(h.Home), "thin.bundle")
	n := writeRawBundle(t, b, main, objectID("commit", c), entries)
	t.Logf("a %d-byte bundle of %d deltas against %d MiB of main's blobs", n, bases, bases)

	before := treesnap.Take(t, filepath.Join(h.Home, "repos"))
	events := len(brokerEvents(t, h))
	_, errs := runAs(t, h, tok, 7, "push-working", "--bundle", b)
	if !strings.Contains(errs, "PUSH_INFLATED_TOO_LARGE") || !strings.Contains(errs, "--max-push-inflated") {
		t.Fatalf("the thin push: %s", errs)
	}
	if d := treesnap.Diff(before, treesnap.Take(t, filepath.Join(h.Home, "repos"))); d != "" {
		t.Fatalf("the refused push changed the store:\n%s", d)
	}
	if m := len(brokerEvents(t, h)); m != events {
		t.Fatalf("the refused push appended to the log: %d -> %d events", events, m)
	}
}
