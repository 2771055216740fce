package gitd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/treesnap"
)

// rawTarEntry writes one tar entry by hand, as a crafted archive would:
// a PAX extended header of pax (in key order) when given, then a ustar
// header of type typ (linkname for links), then data padded to a block.
// Go's tar.Writer will not write some of these (GNU.sparse.* records).
func rawTarEntry(name string, typ byte, linkname string, data []byte, size int64, pax map[string]string) []byte {
	block := func(name string, typ byte, linkname string, size int64) []byte {
		b := make([]byte, 512)
		copy(b[0:100], name)
		copy(b[100:], "0000600\x00")
		copy(b[108:], "0000000\x00")
		copy(b[116:], "0000000\x00")
		copy(b[124:], fmt.Sprintf("%011o\x00", size))
		copy(b[136:], "00000000000\x00")
		b[156] = typ
		copy(b[157:257], linkname)
		copy(b[257:], "ustar\x0000")
		copy(b[148:156], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		return b
	}
	pad := func(b []byte) []byte {
		if n := len(b) % 512; n != 0 {
			b = append(b, make([]byte, 512-n)...)
		}
		return b
	}
	var out []byte
	if pax != nil {
		keys := make([]string, 0, len(pax))
		for k := range pax {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var recs []byte
		for _, k := range keys {
			rec := " " + k + "=" + pax[k] + "\n"
			n := len(rec) + 1
			for n != len(rec)+len(fmt.Sprint(n)) {
				n = len(rec) + len(fmt.Sprint(n))
			}
			recs = append(recs, fmt.Sprintf("%d%s", n, rec)...)
		}
		out = append(out, block("PaxHeaders/"+name, 'x', "", int64(len(recs)))...)
		out = append(out, pad(recs)...)
	}
	out = append(out, block(name, typ, linkname, size)...)
	return append(out, pad(append([]byte(nil), data...))...)
}

// withEntries is a hostile archive's manifest and files, then raw entries,
// then the archive's end.
func withEntries(t *testing.T, m *fakeMover, mf manifest, files map[string][]byte, entries ...[]byte) []byte {
	raw := hostileArchive(t, m, mf, files)
	raw = raw[:len(raw)-1024] // the end: two zero blocks
	for _, en := range entries {
		raw = append(raw, en...)
	}
	return append(raw, make([]byte, 1024)...)
}

// importRefused imports raw on e, wants reason, and checks that the store
// is as it was, nothing was placed and no staging directory is left.
func importRefusedIn(t *testing.T, e *env, m *fakeMover, raw []byte, reason errdefs.Reason) error {
	t.Helper()
	before := e.snapshot()
	_, err := importArchive(e, raw)
	t.Logf("refused: %v", err)
	if got := errdefs.ReasonOf(err); got != reason {
		t.Fatalf("import: %v, want %s", err, reason)
	}
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Fatalf("a refused import changed the store:\n%s", d)
	}
	if m.completed != 0 {
		t.Fatal("the broker was asked to place a refused import")
	}
	return err
}

// TestImportRefusesCraftedEntries: a file whose manifest the store
// vouches for (a compromised host sealed it) may still carry entries
// that are not plain files: a PAX sparse entry that a few blocks of
// archive expand to any size on disk, links and devices where a bundle
// should be, an entry whose size is not the manifest's. Each is refused
// before anything is written.
func TestImportRefusesCraftedEntries(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-b", &m))
	var pool bytes.Buffer
	if err := e.git.Run(context.Background(), gitcmd.Cmd{GitDir: e.repo, Sub: "bundle", Flags: []string{"create", "--quiet", "--version=2"}, Args: []string{"-", MainRef}, Stdout: &pool}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pool.Bytes())
	poolSum := hex.EncodeToString(sum[:])
	base := func(size int64) manifest {
		return manifest{Format: manifestFormat, Business: testBusiness, Project: testProject, From: "host-a", ExportID: "x1",
			Head: manifestHead{Seq: 7, Hash: "h7"},
			Pool: manifestRepo{File: poolBundle, SHA256: poolSum, Size: size, Refs: map[string]string{MainRef: e.main}}}
	}
	// 64 MiB of zeros from one sparse entry of no data: enough to show
	// the expansion, not to fill the disk if it is not refused.
	const sparse = 64 << 20
	staged := filepath.Join(e.svc.o.ReposDir, seedPrefix+"import-*", "files", poolBundle)
	for _, tc := range []struct {
		name  string
		size  int64
		entry []byte
		why   string // in the refusal: refused for this, not later
	}{
		{"a PAX sparse entry", sparse, rawTarEntry(poolBundle, '0', "", nil, 0, map[string]string{
			"GNU.sparse.major": "0", "GNU.sparse.minor": "1", "GNU.sparse.size": fmt.Sprint(sparse),
			"GNU.sparse.numblocks": "0", "GNU.sparse.map": ""}), "sparse"},
		{"a symbolic link", int64(pool.Len()), rawTarEntry(poolBundle, '2', "/etc/passwd", nil, 0, nil), "not a bundle"},
		{"a hard link", int64(pool.Len()), rawTarEntry(poolBundle, '1', "/etc/passwd", nil, 0, nil), "not a bundle"},
		{"a character device", int64(pool.Len()), rawTarEntry(poolBundle, '3', "", nil, 0, nil), "not a bundle"},
		{"a FIFO", int64(pool.Len()), rawTarEntry(poolBundle, '6', "", nil, 0, nil), "not a bundle"},
		{"a directory", int64(pool.Len()), rawTarEntry(poolBundle, '5', "", nil, 0, nil), "not a bundle"},
		{"a size not the manifest's", int64(pool.Len()) + 1, rawTarEntry(poolBundle, '0', "", pool.Bytes(), int64(pool.Len()), nil), "its manifest says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := importRefusedIn(t, e, m, withEntries(t, m, base(tc.size), nil, tc.entry), errdefs.ExportAltered)
			if !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("refused for another reason than %q: %v", tc.why, err)
			}
			if found, _ := filepath.Glob(staged); len(found) > 0 {
				t.Fatalf("left behind: %v", found)
			}
		})
	}
	// The same archive with the entry as a plain file is imported: the
	// refusals above are the entries', not the harness's.
	t.Run("a plain file", func(t *testing.T) {
		raw := withEntries(t, m, base(int64(pool.Len())), nil, rawTarEntry(poolBundle, '0', "", pool.Bytes(), int64(pool.Len()), nil))
		_, err := importArchive(e, raw)
		if err != nil {
			t.Fatalf("import: %v", err)
		}
	})
}

// TestImportRefusesCraftedRefs: refs the manifest names outside what a
// ref may be, a task bundle thin against a commit the file does not
// carry, a bundle header naming a ref twice (so that its count matches
// the manifest's while a manifest ref goes unchecked): each refused,
// leaving the store as it was.
func TestImportRefusesCraftedRefs(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-b", &m))
	ctx := context.Background()
	var pool bytes.Buffer
	if err := e.git.Run(ctx, gitcmd.Cmd{GitDir: e.repo, Sub: "bundle", Flags: []string{"create", "--quiet", "--version=2"}, Args: []string{"-", MainRef}, Stdout: &pool}); err != nil {
		t.Fatal(err)
	}
	x := e.commitFile("x.txt", "x\n") // on main, in no bundle
	y := e.commitFile("y.txt", "y\n")
	thin := e.bundle("HEAD", "^"+x) // y, needing x
	e.run(e.work, "update-ref", nil, "--", "refs/heads/planted", y)
	planted := e.bundle("refs/heads/planted", "^main")
	pushes := e.auth.pushes
	base := func() manifest {
		return manifest{Format: manifestFormat, Business: testBusiness, Project: testProject, From: "host-a", ExportID: "x1",
			Head: manifestHead{Seq: 7, Hash: "h7"}, Pool: manifestRepo{File: poolBundle, Refs: map[string]string{MainRef: e.main}}}
	}
	// The pool's bundle with its one ref line written twice, and a
	// manifest naming it and another ref at a commit the pool lacks.
	hdrEnd := bytes.Index(pool.Bytes(), []byte("\n\n"))
	lines := strings.Split(string(pool.Bytes()[:hdrEnd]), "\n")
	twice := append([]byte(strings.Join(append(lines, lines[len(lines)-1]), "\n")), pool.Bytes()[hdrEnd:]...)
	for _, tc := range []struct {
		name  string
		build func() []byte
		why   string
	}{
		{"a ref with ..", func() []byte {
			mf := base()
			mf.Pool.Refs["refs/heads/../x"] = e.main
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes()})
		}, `"refs/heads/../x"`},
		{"a ref outside refs/", func() []byte {
			mf := base()
			mf.Pool.Refs["HEAD"] = e.main
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes()})
		}, `"HEAD"`},
		{"a task bundle thin against a commit the file lacks", func() []byte {
			mf := base()
			e.auth.pushes = append(pushes, authz.Push{Business: testBusiness, Project: testProject, Task: "t9", Commit: y})
			mf.Tasks = []manifestTask{{Task: "t9", LastPush: y, Repository: &manifestRepo{File: taskBundleName("t9"), Refs: map[string]string{"refs/work/t9": y}}}}
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes(), taskBundleName("t9"): thin})
		}, "does not verify"},
		{"a repository for a task the log does not know, without its work ref", func() []byte {
			mf := base()
			mf.Tasks = []manifestTask{{Task: "t8", Repository: &manifestRepo{File: taskBundleName("t8"), Refs: map[string]string{"refs/heads/planted": y}}}}
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes(), taskBundleName("t8"): planted})
		}, "refs/work/t8"},
		{"a task's repository with a ref besides its work ref", func() []byte {
			mf := base()
			e.auth.pushes = append(pushes, authz.Push{Business: testBusiness, Project: testProject, Task: "t8", Commit: y})
			mf.Tasks = []manifestTask{{Task: "t8", LastPush: y, Repository: &manifestRepo{File: taskBundleName("t8"),
				Refs: map[string]string{"refs/heads/planted": y, "refs/work/t8": y}}}}
			e.run(e.work, "update-ref", nil, "--", "refs/work/t8", y)
			defer e.run(e.work, "update-ref", nil, "-d", "--", "refs/work/t8")
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes(), taskBundleName("t8"): e.bundle("refs/heads/planted", "refs/work/t8", "^main")})
		}, "refs/work/t8"},
		{"a root that is not an absolute path", func() []byte {
			mf := base()
			mf.Root = "../../elsewhere"
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes()})
		}, "its root"},
		{"a root of two lines", func() []byte {
			mf := base()
			mf.Root = "/srv/web\n[core]\n\thooksPath = /tmp"
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes()})
		}, "its root"},
		{"a bundle header naming a ref twice", func() []byte {
			mf := base()
			mf.Pool.Refs["refs/heads/other"] = e.main
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: twice})
		}, "names refs/heads/main twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() { e.auth.pushes = pushes }()
			if err := importRefusedIn(t, e, m, tc.build(), errdefs.ExportAltered); !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("refused for another reason than %q: %v", tc.why, err)
			}
		})
	}
}

// placingMover is a fakeMover that remembers a placement: once an import
// completed, the project is placed here and CheckImport refuses the file
// as stale. With unknown, CompleteImport answers COMMIT_UNKNOWN (as when
// the store's answer is lost) and places nothing.
type placingMover struct {
	*fakeMover
	placed, unknown bool
	completeCalls   int
}

func (m *placingMover) CheckImport(ctx context.Context, c authz.ImportClaim) error {
	m.mu.Lock()
	placed := m.placed
	m.mu.Unlock()
	if placed {
		return errdefs.FailedPrecondition(errdefs.ExportStale, "the project is already placed on this host")
	}
	return m.fakeMover.CheckImport(ctx, c)
}

func (m *placingMover) CompleteImport(ctx context.Context, c authz.ImportClaim) (int64, error) {
	m.mu.Lock()
	m.completeCalls++
	m.mu.Unlock()
	if err := m.CheckImport(ctx, c); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.unknown {
		return 0, errdefs.Unavailable(errdefs.CommitUnknown, "the store's answer was lost")
	}
	m.placed = true
	m.completed++
	return 8, nil
}

// Two imports of one file on one host, the second past its check of the
// store when the first places the project, and work pushed in between:
// the second must not set the live project aside, not even for the moment
// CompleteImport takes to refuse it, nor leave the file's copy in its
// place. It is refused by the store's check again under the project's
// lock. (CompleteImport would refuse it too, in its transaction: a
// COMMIT_UNKNOWN, which would make placeImport ask Placement and find the
// project here because of the first, comes only for a transaction whose
// writes succeeded; the mover models that order.)
func TestImportTwiceOnOneHost(t *testing.T) {
	var ma, fb *fakeMover
	a := newEnv(t, withMover("host-a", &ma))
	a.commitFile("t1.txt", "one\n")
	if _, err := a.push("t1", a.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	raw := export(t, a)
	var mb *placingMover
	b := newEnv(t, withMover("host-b", &fb), func(o *Options) {
		mb = &placingMover{fakeMover: fb}
		o.Authority = mb
	})
	fb.digest = ma.digest
	fb.pushes = a.auth.recorded()

	var pushed string
	first := true
	_, err := b.svc.ImportProject(context.Background(), bytes.NewReader(raw), func(step string) {
		if step != "place the project" || !first {
			return
		}
		first = false
		// The other import, whole, then work on the project it placed.
		if _, err := importArchive(b, raw); err != nil {
			t.Fatalf("the first import: %v", err)
		}
		pushed = b.commitFile("t2.txt", "two\n")
		if _, err := b.push("t2", b.bundle("HEAD", "^main")); err != nil {
			t.Fatalf("a push after the first import: %v", err)
		}
		mb.mu.Lock()
		mb.unknown = true
		mb.mu.Unlock()
	})
	t.Logf("the second import: %v", err)
	if errdefs.ReasonOf(err) != errdefs.ExportStale {
		t.Errorf("the second import: %v, want EXPORT_STALE", err)
	}
	// Refused under the lock before the live project was set aside: the
	// store's commit was asked once, by the first.
	if mb.completeCalls != 1 {
		t.Errorf("CompleteImport called %d times, want 1: the second import set the live project aside", mb.completeCalls)
	}
	if got := b.ref("refs/work/t2"); got != pushed {
		t.Fatalf("refs/work/t2 is %q after the second import, the push made it %s: the live project was replaced", got, pushed)
	}
	if got, want := b.ref("refs/work/t1"), a.ref("refs/work/t1"); got != want {
		t.Fatalf("refs/work/t1 %s, want %s", got, want)
	}
	b.fsck()
	if found, _ := filepath.Glob(filepath.Join(b.svc.o.ReposDir, "*", seedPrefix+"*")); len(found) > 0 {
		t.Fatalf("left behind: %v", found)
	}
	if found, _ := filepath.Glob(filepath.Join(b.svc.o.ReposDir, seedPrefix+"*")); len(found) > 0 {
		t.Fatalf("left behind: %v", found)
	}
}

// refusingMover is a fakeMover whose store refuses the placement once the
// project is renamed into place: CompleteImport answers err, and Placement
// names host.
type refusingMover struct {
	*fakeMover
	err  error
	host string
}

func (m *refusingMover) CompleteImport(context.Context, authz.ImportClaim) (int64, error) {
	return 0, m.err
}

func (m *refusingMover) Placement(context.Context, string, string) (string, bool, error) {
	return m.host, true, nil
}

// An import refused by the store after the built project was renamed
// into place (CompleteImport refuses, or its answer is lost and the
// project turns out placed elsewhere) leaves the store as it was: the
// built project leaves, the copy set aside returns, and into a store
// that had no such business, no business directory or lock file stays.
func TestImportRefusedAfterPlacing(t *testing.T) {
	var ma *fakeMover
	a := newEnv(t, withMover("host-a", &ma))
	a.commitFile("t1.txt", "one\n")
	if _, err := a.push("t1", a.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	raw := export(t, a)
	for _, tc := range []struct {
		name     string
		err      error
		host     string
		business bool // the store holds the business (and a copy of the project)
	}{
		{"refused, a copy here", errdefs.FailedPrecondition(errdefs.ExportStale, "moved on"), "host-b", true},
		{"refused, a new business", errdefs.FailedPrecondition(errdefs.ExportStale, "moved on"), "host-b", false},
		{"answer lost, placed elsewhere", errdefs.Unavailable(errdefs.CommitUnknown, "lost"), "host-c", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fb *fakeMover
			b := newEnv(t, withMover("host-b", &fb), func(o *Options) {
				o.Authority = &refusingMover{fakeMover: fb, err: tc.err, host: tc.host}
			})
			fb.digest = ma.digest
			fb.pushes = a.auth.recorded()
			if !tc.business {
				if err := os.RemoveAll(filepath.Join(b.svc.o.ReposDir, testBusiness)); err != nil {
					t.Fatal(err)
				}
			}
			importRefusedIn(t, b, fb, raw, errdefs.ReasonOf(tc.err))
			if tc.business {
				b.fsck()
			}
		})
	}
}

// A manifest listing tasks the log does not have is refused before any
// bundle is read or repository built: here the archive ends after the
// manifest, and the refusal is the log's, not the truncation's.
func TestImportChecksTasksFirst(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-b", &m))
	mf := manifest{Format: manifestFormat, Business: testBusiness, Project: testProject, From: "host-a", ExportID: "x1",
		Head: manifestHead{Seq: 7, Hash: "h7"}, Pool: manifestRepo{File: poolBundle, SHA256: strings.Repeat("0", 64), Size: 1, Refs: map[string]string{MainRef: e.main}}}
	for i := 0; i < 1000; i++ {
		task := fmt.Sprintf("t%d", i)
		mf.Tasks = append(mf.Tasks, manifestTask{Task: task, LastPush: e.main, Repository: &manifestRepo{Refs: map[string]string{"refs/work/" + task: e.main}}})
	}
	err := importRefusedIn(t, e, m, withEntries(t, m, mf, nil), errdefs.ExportAltered)
	if !strings.Contains(err.Error(), "the log's latest push") {
		t.Fatalf("refused for another reason than the log: %v", err)
	}
}

// An import killed midway leaves its staging directory in the store (and,
// killed while placing, the copy it set aside in the business): the next
// start removes both, and the project is served as before.
func TestImportCrashCleanedAtStart(t *testing.T) {
	var ma, mb *fakeMover
	a := newEnv(t, withMover("host-a", &ma))
	a.commitFile("t1.txt", "one\n")
	if _, err := a.push("t1", a.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	raw := export(t, a)
	b := newEnv(t, withMover("host-b", &mb))
	mb.digest = ma.digest
	mb.pushes = a.auth.recorded()
	repos := b.svc.o.ReposDir
	before := b.snapshot()
	// What a kill leaves: the staging directory as it is once every
	// repository is built, and a copy set aside.
	crashed := filepath.Join(repos, seedPrefix+"import-crashed")
	aside := filepath.Join(repos, testBusiness, seedPrefix+"replaced-"+testProject+"-crashed")
	_, err := b.svc.ImportProject(context.Background(), bytes.NewReader(raw), func(step string) {
		if step != "check the refs against the log" {
			return
		}
		stages, _ := filepath.Glob(filepath.Join(repos, seedPrefix+"import-*"))
		if len(stages) != 1 {
			t.Fatalf("staging directories: %v", stages)
		}
		for _, c := range [][2]string{{stages[0], crashed}, {filepath.Join(repos, testBusiness, testProject), filepath.Join(aside, "project")}} {
			os.MkdirAll(filepath.Dir(c[1]), 0o700)
			if out, err := exec.Command("cp", "-a", c[0], c[1]).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
		}
		// The import is refused from here: the store keeps its copy.
		mb.mu.Lock()
		mb.digest = "changed"
		mb.mu.Unlock()
	})
	if errdefs.ReasonOf(err) != errdefs.ExportAltered {
		t.Fatalf("import: %v", err)
	}
	if _, err := os.Stat(filepath.Join(crashed, "project", poolName)); err != nil {
		t.Fatalf("the simulated leftovers are not there: %v", err)
	}
	// The next start.
	svc, err := New(b.svc.o)
	if err != nil {
		t.Fatal(err)
	}
	b.svc = svc
	if d := treesnap.Diff(before, b.snapshot()); d != "" {
		t.Fatalf("after a start, the store is not as before the killed import:\n%s", d)
	}
	b.fsck()
}

// The manifest must come first, as a plain file, and within its bound:
// an archive opening with a bundle, a link named manifest.json, or a
// manifest whose header claims more than maxManifestBytes (refused on the
// header, before reading it) leaves nothing.
func TestImportRefusesManifestEntry(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-b", &m))
	end := make([]byte, 1024)
	for _, tc := range []struct {
		name string
		raw  []byte
		why  string
	}{
		{"a bundle first", append(rawTarEntry(poolBundle, '0', "", []byte("x"), 1, nil), end...), "its first entry"},
		{"a link as the manifest", append(rawTarEntry(manifestName, '2', "/etc/passwd", nil, 0, nil), end...), "its first entry"},
		{"a sparse manifest", append(rawTarEntry(manifestName, '0', "", nil, 0, map[string]string{
			"GNU.sparse.major": "0", "GNU.sparse.minor": "1", "GNU.sparse.size": "100", "GNU.sparse.numblocks": "0", "GNU.sparse.map": ""}), end...), "its first entry"},
		{"a manifest over the bound", rawTarEntry(manifestName, '0', "", nil, maxManifestBytes+1, nil), "over"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := importRefusedIn(t, e, m, tc.raw, errdefs.ExportAltered)
			if !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("refused for another reason than %q: %v", tc.why, err)
			}
		})
	}
}
