package gitd

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/treesnap"
)

// fakeMover is the broker's side of a move for gitd's tests: an export is
// at head 7; an import is accepted when its digest is the
// one sealed (the store's check is the broker's, tested there).
type fakeMover struct {
	*fakeAuth
	host string
	mu   sync.Mutex
	// digest is the sealed manifest's; imports must present it.
	digest      string
	cancelled   int
	cancelledID string // the last cancel's export id ("" for any)
	begunID     string // the last export begun
	completed   int
}

// withMover makes the env's broker a fakeMover on host.
func withMover(host string, m **fakeMover) func(*Options) {
	return func(o *Options) {
		*m = &fakeMover{fakeAuth: o.Authority.(*fakeAuth), host: host}
		o.Authority = *m
	}
}

func (m *fakeMover) BeginExport(ctx context.Context, b, p, id string) (authz.Export, error) {
	last, _ := m.LastPushes(ctx, b, p)
	m.mu.Lock()
	m.begunID = id
	m.mu.Unlock()
	ex := authz.Export{ID: id, Host: m.host, HeadSeq: 7, HeadHash: "h7"}
	for t, c := range last {
		ex.Tasks = append(ex.Tasks, authz.ExportTask{Task: t, Commit: c, Closed: m.closed[t]})
	}
	sort.Slice(ex.Tasks, func(i, j int) bool { return ex.Tasks[i].Task < ex.Tasks[j].Task })
	return ex, nil
}

func (m *fakeMover) SealExport(_ context.Context, b, p, id, digest string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.digest = digest
	return nil
}

func (m *fakeMover) CancelExport(_ context.Context, _, _, id string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cancelled++
	m.cancelledID = id
	return 9, nil
}

func (m *fakeMover) NotMoving(context.Context, string, string) error { return nil }

func (m *fakeMover) CheckImport(_ context.Context, c authz.ImportClaim) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.Digest != m.digest {
		return errdefs.InvalidArgument(errdefs.ExportAltered, "digest %s, sealed %s", c.Digest, m.digest)
	}
	return nil
}

func (m *fakeMover) CompleteImport(ctx context.Context, c authz.ImportClaim) (int64, error) {
	if err := m.CheckImport(ctx, c); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.completed++
	return 8, nil
}

func (m *fakeMover) HostID() string { return m.host }

func (m *fakeMover) Placement(context.Context, string, string) (string, bool, error) {
	return m.host, true, nil
}

// export runs e's ExportProject and returns the archive.
func export(t *testing.T, e *env) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	if _, err := e.svc.ExportProject(context.Background(), testBusiness, testProject, func(string) {}, func(authz.Export) error { return nil }, w); err != nil {
		t.Fatalf("export: %v", err)
	}
	return buf.Bytes()
}

func importArchive(e *env, raw []byte) (ImportResult, error) {
	return e.svc.ImportProject(context.Background(), bytes.NewReader(raw), func(string) {})
}

// An export carries the pool and every task's repository; an import into
// another store rebuilds them with the same refs, replacing the copy the
// store had, and the result passes git fsck --strict.
func TestExportImportRoundTrip(t *testing.T) {
	var ma, mb *fakeMover
	a := newEnv(t, withMover("host-a", &ma))
	for i, task := range []string{"t1", "t2", "t1"} {
		a.run(a.work, "reset", nil, "--hard", "--quiet", "--", "main")
		if r := a.ref("refs/work/" + task); r != "" {
			a.run(a.work, "reset", nil, "--hard", "--quiet", "--", r)
		}
		a.commitFile(task+".txt", string(rune('a'+i))+"\n")
		if _, err := a.push(task, a.bundle("HEAD", "^main")); err != nil {
			t.Fatal(err)
		}
	}
	raw := export(t, a)

	b := newEnv(t, withMover("host-b", &mb))
	mb.digest = ma.digest
	mb.pushes = a.auth.recorded()
	if _, err := importArchive(b, raw); err != nil {
		t.Fatalf("import: %v", err)
	}
	for _, ref := range []string{MainRef, "refs/work/t1", "refs/work/t2"} {
		if got, want := b.ref(ref), a.ref(ref); got != want || got == "" {
			t.Fatalf("%s: %s after the import, %s exported", ref, got, want)
		}
	}
	b.fsck()
	if mb.completed != 1 || ma.cancelled != 0 {
		t.Fatalf("completed %d, cancelled %d", mb.completed, ma.cancelled)
	}
	if found, _ := filepath.Glob(filepath.Join(b.svc.o.ReposDir, "*", seedPrefix+"*")); len(found) > 0 {
		t.Fatalf("left behind: %v", found)
	}
}

// An export of a project whose task ref disagrees with the log is refused
// before the project moves.
func TestExportRefusesRefsAgainstLog(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-a", &m))
	e.commitFile("a.txt", "a\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	e.auth.lastExtra = map[string]string{"t1": e.main}
	var buf bytes.Buffer
	_, err := e.svc.ExportProject(context.Background(), testBusiness, testProject, func(string) {}, func(authz.Export) error { return nil }, bufio.NewWriter(&buf))
	if errdefs.ReasonOf(err) != errdefs.RepoDisagreesWithLog || buf.Len() != 0 || m.digest != "" {
		t.Fatalf("export: %v (%d bytes, digest %q)", err, buf.Len(), m.digest)
	}
	// A ref in a task's repository that no push makes (an import would
	// refuse it) is refused too.
	e.auth.lastExtra = nil
	e.run(e.taskRepo("t1"), "update-ref", nil, "--", "refs/heads/stray", e.ref("refs/work/t1"))
	_, err = e.svc.ExportProject(context.Background(), testBusiness, testProject, func(string) {}, func(authz.Export) error { return nil }, bufio.NewWriter(&buf))
	if errdefs.ReasonOf(err) != errdefs.RepoDisagreesWithLog || buf.Len() != 0 || m.digest != "" {
		t.Fatalf("export with a stray ref: %v (%d bytes, digest %q)", err, buf.Len(), m.digest)
	}
	t.Logf("refused: %v", err)
}

// hostileArchive writes mf and files as an export would, filling in each
// bundle's size and sha256, and seals the manifest's digest in m: a file
// whose manifest the store vouches for, with hostile content.
func hostileArchive(t *testing.T, m *fakeMover, mf manifest, files map[string][]byte, extra ...string) []byte {
	t.Helper()
	fill := func(r *manifestRepo) {
		if b, ok := files[r.File]; ok {
			sum := sha256.Sum256(b)
			r.SHA256, r.Size = hex.EncodeToString(sum[:]), int64(len(b))
		}
	}
	fill(&mf.Pool)
	for i := range mf.Tasks {
		if mf.Tasks[i].Repository != nil {
			fill(mf.Tasks[i].Repository)
		}
	}
	raw, err := json.Marshal(mf)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	m.digest = hex.EncodeToString(sum[:])
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	write := func(name string, b []byte) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b)
	}
	write(manifestName, raw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		write(n, files[n])
	}
	for _, n := range extra {
		write(n, []byte("evil\n"))
	}
	tw.Close()
	return buf.Bytes()
}

// An import file the store vouches for (its digest sealed) is still
// checked as a push is: a task bundle with a .git tree entry is refused by
// index-pack --strict, a path outside the layout (a task named ../x, an
// archive entry ../../x) is refused before anything is written, and each
// refusal leaves the store as it was.
func TestImportRefusesHostileArchive(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-b", &m))
	ctx := context.Background()
	var pool bytes.Buffer
	if err := e.git.Run(ctx, gitcmd.Cmd{GitDir: e.repo, Sub: "bundle", Flags: []string{"create", "--quiet", "--version=2"}, Args: []string{"-", MainRef}, Stdout: &pool}); err != nil {
		t.Fatal(err)
	}
	blob := e.rawObject("blob", []byte("x\n"))
	tree := e.rawObject("tree", rawTree(treeEntry{"100644", ".git", blob}))
	bad := e.rawCommit(tree, goodAuthor)
	e.run(e.work, "update-ref", nil, "--", "refs/work/t9", bad)
	taskBundle := e.bundle("refs/work/t9", "^main")
	e.auth.pushes = append(e.auth.pushes, authz.Push{Business: testBusiness, Project: testProject, Task: "t9", Commit: bad})

	base := func() manifest {
		return manifest{Format: manifestFormat, Business: testBusiness, Project: testProject, From: "host-a", ExportID: "x1",
			Head: manifestHead{Seq: 7, Hash: "h7"}, Pool: manifestRepo{File: poolBundle, Refs: map[string]string{MainRef: e.main}}}
	}
	outside := filepath.Join(filepath.Dir(e.svc.o.ReposDir), "x")
	for _, tc := range []struct {
		name   string
		reason errdefs.Reason
		build  func() []byte
	}{
		{"a .git tree entry", errdefs.FsckFailed, func() []byte {
			mf := base()
			mf.Tasks = []manifestTask{{Task: "t9", LastPush: bad, Repository: &manifestRepo{File: taskBundleName("t9"), Refs: map[string]string{"refs/work/t9": bad}}}}
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes(), taskBundleName("t9"): taskBundle})
		}},
		{"a task named ../x", errdefs.ExportAltered, func() []byte {
			mf := base()
			mf.Tasks = []manifestTask{{Task: "../x", Repository: &manifestRepo{File: "tasks/../x.bundle", Refs: map[string]string{"refs/work/x": bad}}}}
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes(), "tasks/../x.bundle": taskBundle})
		}},
		{"an entry outside the archive", errdefs.ExportAltered, func() []byte {
			return hostileArchive(t, m, base(), map[string][]byte{poolBundle: pool.Bytes()}, "../../x")
		}},
		{"a bundle named twice", errdefs.ExportAltered, func() []byte {
			return hostileArchive(t, m, base(), map[string][]byte{poolBundle: pool.Bytes()}, poolBundle)
		}},
		{"a pool bundle whose refs are not the manifest's", errdefs.ExportAltered, func() []byte {
			mf := base()
			mf.Pool.Refs = map[string]string{MainRef: e.main, "refs/heads/other": e.main}
			return hostileArchive(t, m, mf, map[string][]byte{poolBundle: pool.Bytes()})
		}},
		{"a truncated archive", errdefs.ExportAltered, func() []byte {
			raw := hostileArchive(t, m, base(), map[string][]byte{poolBundle: pool.Bytes()})
			return raw[:len(raw)-1500]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.snapshot()
			_, err := importArchive(e, tc.build())
			t.Logf("refused: %v", err)
			if got := errdefs.ReasonOf(err); got != tc.reason {
				t.Fatalf("import: %v, want %s", err, tc.reason)
			}
			if d := treesnap.Diff(before, e.snapshot()); d != "" {
				t.Fatalf("a refused import changed the store:\n%s", d)
			}
			if _, err := os.Stat(outside); err == nil {
				t.Fatalf("a refused import wrote %s", outside)
			}
			if m.completed != 0 {
				t.Fatal("the broker was asked to place a refused import")
			}
		})
	}
}

// An export that fails once it began (here: the client went away) is
// cancelled, so the project takes pushes again, and leaves no spool.
func TestExportCancelledOnFailure(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-a", &m))
	gone := errors.New("client went away")
	var buf bytes.Buffer
	_, err := e.svc.ExportProject(context.Background(), testBusiness, testProject, func(string) {}, func(authz.Export) error { return gone }, bufio.NewWriter(&buf))
	if !errors.Is(err, gone) || m.cancelled != 1 || m.digest != "" {
		t.Fatalf("export: %v, cancelled %d, digest %q", err, m.cancelled, m.digest)
	}
	// Its own export only, not whichever is current by then.
	if m.cancelledID != m.begunID || m.begunID == "" {
		t.Fatalf("the failed export cancelled %q, not its own %q", m.cancelledID, m.begunID)
	}
	if found, _ := filepath.Glob(filepath.Join(e.svc.o.ReposDir, "*", seedPrefix+"*")); len(found) > 0 {
		t.Fatalf("left behind: %v", found)
	}
}

// An export cut before its file was complete (bushostd killed while it
// bundled or sent) leaves its spool; the next start (Reconcile) cancels
// that export, and only it, and removes the spool.
func TestStartCancelsACutExport(t *testing.T) {
	var m *fakeMover
	e := newEnv(t, withMover("host-a", &m))
	id := authz.NewExportID()
	spool := filepath.Join(e.svc.o.ReposDir, testBusiness, exportSpoolPrefix+testProject+"-"+id)
	if err := os.MkdirAll(filepath.Join(spool, "tasks"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m.cancelled != 1 || m.cancelledID != id {
		t.Fatalf("cancelled %d exports, the last %q; want export %s cancelled", m.cancelled, m.cancelledID, id)
	}
	if _, err := os.Stat(spool); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the cut export's spool is still there: %v", err)
	}
}
