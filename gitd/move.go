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
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/gitid"
	"github.com/bushost/bushost/internal/names"
)

// Moving a project to another bus host sharing the broker (docs/scaling.md,
// "Moving a project"). Hosts share only the database: the repositories
// travel as one tar archive the operator carries,
//
//	manifest.json          the project, the exporting host and export id,
//	                       the log's head at export, each task's latest
//	                       push, each repository's refs and bundle sha256
//	pool.bundle            the pool: every ref, whole
//	tasks/<task>.bundle    a task's repository: every ref, thin against
//	                       the pool's refs (none when the pool holds it all)
//
// and the broker's store holds the move's state (broker/move.go), with the
// manifest's digest: an import verifies each bundle against the manifest
// and the manifest against the store, so a file altered anywhere, or one
// the log has moved past, is refused before the placement moves.

// manifestFormat names the archive's layout; an import refuses others.
const manifestFormat = "bushost-project-export/1"

const (
	manifestName = "manifest.json"
	poolBundle   = "pool.bundle"
	// maxManifestBytes bounds the manifest an import reads into memory.
	maxManifestBytes = 16 << 20
)

type manifest struct {
	Format   string         `json:"format"`
	Business string         `json:"business"`
	Project  string         `json:"project"`
	From     string         `json:"from"` // the exporting host's id
	ExportID string         `json:"export_id"`
	Head     manifestHead   `json:"head"` // the project.moving event
	Created  string         `json:"created"`
	Root     string         `json:"root,omitempty"` // the project's root on the exporting host
	Pool     manifestRepo   `json:"pool"`
	Tasks    []manifestTask `json:"tasks"`
	// scope is Business/Project as check parsed them.
	scope names.Project
}

type manifestHead struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
}

// manifestRepo is one repository: its refs, and its bundle unless every
// commit its refs reach is in the pool (File "").
type manifestRepo struct {
	File   string            `json:"file,omitempty"`
	SHA256 string            `json:"sha256,omitempty"`
	Size   int64             `json:"size,omitempty"`
	Refs   map[string]string `json:"refs"`
}

type manifestTask struct {
	Task string `json:"task"`
	// LastPush is the log's latest push of the task ("" for none).
	LastPush string `json:"last_push"`
	Closed   bool   `json:"closed"`
	// Repository is nil for a task with no repository (no push yet, or a
	// closed task the host archived).
	Repository *manifestRepo `json:"repository,omitempty"`
	// scope is Task as the manifest's check parsed it.
	scope names.Task
}

func taskBundleName(task string) string { return "tasks/" + task + ".bundle" }

// Flusher is a buffered writer: ExportProject flushes it before it
// reports success, so that a failed send cancels the export.
type Flusher interface {
	io.Writer
	Flush() error
}

// ExportResult is what ExportProject wrote.
type ExportResult struct {
	Bytes          int64  // the archive's
	SHA256         string // the archive's
	ManifestSHA256 string
	Tasks, Bundles int
}

func (s *Service) mover() (authz.Mover, error) {
	m, ok := s.o.Authority.(authz.Mover)
	if !ok {
		return nil, errors.New("this bus host's broker cannot move projects")
	}
	return m, nil
}

// ExportProject begins moving business/project to another host and writes
// its archive to w. Under the project's lock it checks that every task's
// ref agrees with the log, has the broker mark the project moving (pushes,
// landings and syncs are refused with PROJECT_MOVING from then on), calls
// begun, bundles each repository into a spool directory, records the
// manifest's digest with the broker, and then streams the archive. step
// names what it is doing, for a caller that reports progress. If the
// export fails after it began, it is cancelled: the project takes pushes
// again.
func (s *Service) ExportProject(ctx context.Context, scope names.Project, step func(string), begun func(authz.Export) error, w Flusher) (res ExportResult, err error) {
	business, project := scope.Business(), scope.Name()
	m, err := s.mover()
	if err != nil {
		return res, err
	}
	p, err := s.store.existingProject(scope)
	if err != nil {
		return res, err
	}
	tx, err := p.beginExport(ctx, m)
	if err != nil {
		return res, err
	}
	defer func() { tx.Rollback(ctx, err) }()
	step("check the repositories against the log")
	repos, err := s.exportRepos(ctx, p)
	if err != nil {
		return res, err
	}
	ex, err := tx.begin(ctx)
	if err != nil {
		return res, err
	}
	spool := tx.spool
	// Under the lock, nothing recorded a push of the project between the
	// check and BeginExport: the log's tasks are those checked.
	for _, t := range ex.Tasks {
		if repos.last[t.Task] != t.Commit {
			return res, errdefs.Internal(errdefs.InternalError, "task %s's latest push changed during the export (%s, now %s)", t.Task, repos.last[t.Task], t.Commit)
		}
	}
	if err := begun(ex); err != nil {
		return res, err
	}
	mf := manifest{Format: manifestFormat, Business: business, Project: project, From: ex.Host, ExportID: ex.ID,
		Head: manifestHead{Seq: ex.HeadSeq, Hash: ex.HeadHash}, Created: time.Now().UTC().Format(time.RFC3339)}
	if root, err := s.git.Line(ctx, gitcmd.Cmd{GitDir: p.Path, Sub: "config", Flags: []string{"--get"}, Args: []string{rootKey}}, gitcmd.MaxLine); err == nil {
		mf.Root = root
	}
	step("bundle the pool")
	var poolTips []string
	for _, oid := range repos.pool {
		poolTips = append(poolTips, "^"+oid)
	}
	if mf.Pool, err = p.bundleRefs(ctx, repos.pool, nil, spool, poolBundle); err != nil {
		return res, err
	}
	files := []string{poolBundle}
	for _, t := range ex.Tasks {
		mt := manifestTask{Task: t.Task, LastPush: t.Commit, Closed: t.Closed}
		if refs, ok := repos.tasks[t.Task]; ok {
			step("bundle task " + t.Task)
			tn, err := scope.Task(t.Task)
			if err != nil {
				return res, err
			}
			r, err := s.store.task(tn)
			if err != nil {
				return res, err
			}
			mr, err := r.bundleRefs(ctx, refs, poolTips, spool, taskBundleName(t.Task))
			if err != nil {
				return res, err
			}
			mt.Repository = &mr
			if mr.File != "" {
				files = append(files, mr.File)
				res.Bundles++
			}
		}
		mf.Tasks = append(mf.Tasks, mt)
	}
	res.Bundles++ // the pool's
	res.Tasks = len(mf.Tasks)
	raw, err := json.MarshalIndent(mf, "", "  ")
	if err != nil {
		return res, err
	}
	raw = append(raw, '\n')
	sum := sha256.Sum256(raw)
	res.ManifestSHA256 = hex.EncodeToString(sum[:])
	if err := m.SealExport(ctx, business, project, ex.ID, res.ManifestSHA256); err != nil {
		return res, err
	}
	// The spool is the export's own: pushes are refused from here on and
	// wait for nothing, so the lock is not held while the archive streams.
	tx.unlock()
	tx.unlock = nil
	step("send the archive")
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h)}
	tw := tar.NewWriter(cw)
	mtime := time.Now().UTC().Truncate(time.Second)
	if err := tarFile(tw, manifestName, bytes.NewReader(raw), int64(len(raw)), mtime); err != nil {
		return res, err
	}
	crashpoint("export:sending")
	for _, name := range files {
		f, err := os.Open(filepath.Join(spool, name))
		if err != nil {
			return res, err
		}
		fi, err := f.Stat()
		if err == nil {
			err = tarFile(tw, name, f, fi.Size(), mtime)
		}
		f.Close()
		if err != nil {
			return res, err
		}
	}
	if err := tw.Close(); err != nil {
		return res, err
	}
	if err := w.Flush(); err != nil {
		return res, err
	}
	if err := tx.Commit(); err != nil {
		return res, err
	}
	res.Bytes, res.SHA256 = cw.n, hex.EncodeToString(h.Sum(nil))
	s.log.Info("exported a project: it is moving, pushes are refused until it is imported elsewhere or the export is cancelled",
		"business", business, "project", project, "export_id", ex.ID, "head_seq", ex.HeadSeq, "bytes", res.Bytes, "tasks", res.Tasks)
	return res, nil
}

// exportTx is an export's hold on the store: the project's lock (until
// the archive is sealed), the spool the bundles are written into, and the
// export begun with the broker. Commit, once the file is whole, removes
// the spool: from then a crash leaves nothing to cancel. Rollback,
// deferred right after beginExport, cancels a begun export that did not
// commit (the project takes pushes again), removes the spool unless the
// export's fate is unknown (settleExports cancels it at the next start),
// and releases the lock.
type exportTx struct {
	m           authz.Mover
	p           repo
	unlock      func() // the project's lock, until the export is sealed
	spool       string
	ex          authz.Export
	begun, done bool
	keep        bool // leave the spool
}

// beginExport takes p's project lock for an export.
func (p repo) beginExport(ctx context.Context, m authz.Mover) (*exportTx, error) {
	unlock, err := p.state().lock(ctx)
	if err != nil {
		return nil, err
	}
	return &exportTx{m: m, p: p, unlock: unlock}, nil
}

// begin makes the spool, named by the export's id, and has the broker
// begin the export (pushes, landings and syncs are refused from then on).
func (tx *exportTx) begin(ctx context.Context) (authz.Export, error) {
	id := authz.NewExportID()
	spool := filepath.Join(filepath.Dir(tx.p.Dir), exportSpoolPrefix+tx.p.Project+"-"+id)
	if err := os.Mkdir(spool, 0o700); err != nil {
		return authz.Export{}, err
	}
	tx.spool = spool
	if err := os.Mkdir(filepath.Join(spool, "tasks"), 0o700); err != nil {
		return authz.Export{}, err
	}
	ex, err := tx.m.BeginExport(ctx, tx.p.Business, tx.p.Project, id)
	// Begun or not, unknown: the next start cancels it if it was.
	tx.keep = errdefs.ReasonOf(err) == errdefs.CommitUnknown
	tx.ex, tx.begun = ex, err == nil
	return ex, err
}

// Commit ends a whole export: its spool goes (if it cannot, Rollback
// cancels the export).
func (tx *exportTx) Commit() error {
	err := os.RemoveAll(tx.spool)
	tx.done = err == nil
	return err
}

// Rollback undoes what Commit did not make final (exportTx); cause is why
// the export failed, for the log. The broker's cancel runs even when ctx,
// the call's, ended (the client went away).
func (tx *exportTx) Rollback(ctx context.Context, cause error) {
	if tx.begun && !tx.done {
		tx.done = true
		business, project := tx.p.Business, tx.p.Project
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), criticalTimeout)
		// This export only: another may have replaced it meanwhile.
		if _, err := tx.m.CancelExport(ctx, business, project, tx.ex.ID); err != nil {
			tx.keep = true
			tx.p.st.log.Error("export failed, and cancelling it failed too: the project stays moving until the next start of bushostd or 'bushost project export --cancel'", "business", business, "project", project, "err", err)
		} else {
			tx.p.st.log.Warn("export failed and was cancelled: the project takes pushes again", "business", business, "project", project, "err", cause)
		}
		cancel()
	}
	if tx.spool != "" && !tx.keep {
		os.RemoveAll(tx.spool)
	}
	if tx.unlock != nil {
		tx.unlock()
		tx.unlock = nil
	}
}

// exportRefs are a project's refs as an export found them.
type exportRefs struct {
	pool  map[string]string            // ref -> commit
	tasks map[string]map[string]string // task -> its repository's refs
	last  map[string]string            // the log's latest push per task
}

// exportRepos reads the project's refs and refuses an export when one
// disagrees with the log (REPO_DISAGREES_WITH_LOG): a task's refs/work
// that is not its latest recorded push, an open task with a push but no
// repository, main behind the last landing. The caller holds the
// project's lock.
func (s *Service) exportRepos(ctx context.Context, p repo) (exportRefs, error) {
	out := exportRefs{tasks: map[string]map[string]string{}}
	var err error
	if out.last, err = s.o.Authority.LastPushes(ctx, p.Business, p.Project); err != nil {
		return out, err
	}
	if out.pool, err = p.refs(ctx); err != nil {
		return out, err
	}
	if _, ok := out.pool[MainRef]; !ok {
		return out, errdefs.FailedPrecondition(errdefs.MainNotFound, "project %s/%s has no main", p.Business, p.Project)
	}
	if err := s.mainHasLandings(ctx, p); err != nil {
		return out, err
	}
	disagree := func(task, ref, log string) error {
		return errdefs.FailedPrecondition(errdefs.RepoDisagreesWithLog,
			"task %s/%s/%s: its ref is at %q, the log's latest push is %q: restart bushostd (it reconciles refs with the log at start) or run 'bushost task repair', then export again",
			p.Business, p.Project, task, ref, log).
			With("task", p.Business+"/"+p.Project+"/"+task).With("ref_commit", ref).With("log_commit", log)
	}
	ts, err := p.tasks()
	if err != nil {
		return out, err
	}
	for _, t := range ts {
		refs, err := t.refs(ctx)
		if err != nil {
			return out, err
		}
		ref := t.task.WorkRef()
		if refs[ref] != out.last[t.Task] {
			return out, disagree(t.Task, refs[ref], out.last[t.Task])
		}
		for other := range refs {
			if other != ref {
				// An import takes a task's work ref only: refuse here,
				// before the project moves, rather than there.
				return out, errdefs.FailedPrecondition(errdefs.RepoDisagreesWithLog,
					"task %s/%s/%s: its repository holds %s besides %s, which no push makes: delete it ('git --git-dir %s update-ref -d %s'), then export again",
					p.Business, p.Project, t.Task, other, ref, t.Path, other).With("task", p.Business+"/"+p.Project+"/"+t.Task).With("ref", other)
			}
		}
		if len(refs) > 0 {
			out.tasks[t.Task] = refs
		}
	}
	for task, commit := range out.last {
		if _, ok := out.tasks[task]; ok || commit == "" {
			continue
		}
		// A closed task's repository may have been archived; an open
		// task's may not be missing.
		if s.o.Authority.TaskOpen(ctx, authz.Grant{Business: p.Business, Project: p.Project, Task: task}) == nil {
			return out, disagree(task, "", commit)
		}
	}
	return out, nil
}

// mainHasLandings refuses a pool p whose main does not hold the log's
// last landing of its project.
func (s *Service) mainHasLandings(ctx context.Context, p repo) error {
	last, err := s.lastLanding(ctx, p.proj)
	if last == nil {
		return err
	}
	err = p.git.Run(ctx, gitcmd.Cmd{GitDir: p.Path, Sub: "merge-base", Flags: []string{"--is-ancestor"}, Args: []string{last.New, MainRef}})
	if err == nil {
		return nil
	}
	if gitcmd.ExitCode(err) != 1 && gitcmd.ExitCode(err) != 128 {
		return err
	}
	return errdefs.FailedPrecondition(errdefs.RepoDisagreesWithLog,
		"project %s/%s: main does not hold %s, where the log's last landing (task %s) put it: restart bushostd (it reconciles main with the log at start), then export again",
		p.Business, p.Project, last.New, last.Task).With("log_commit", last.New).With("task", last.Task)
}

// bundleRefs writes r's refs as the bundle name under spool, thin against
// not (^commit of the pool's refs; nil for the pool itself), and returns
// its manifest entry: no file when the pool already holds every commit the
// refs reach (git refuses an empty bundle).
func (r repo) bundleRefs(ctx context.Context, refs map[string]string, not []string, spool, name string) (manifestRepo, error) {
	mr := manifestRepo{Refs: refs}
	revs := make([]string, 0, len(refs)+len(not))
	for ref := range refs {
		revs = append(revs, ref)
	}
	sort.Strings(revs)
	revs = append(revs, not...)
	if len(not) > 0 {
		n, err := r.git.Line(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "rev-list", Flags: []string{"--count"}, Args: revs}, gitcmd.MaxLine)
		if err != nil {
			return mr, err
		}
		if n == "0" {
			return mr, nil
		}
	}
	path := filepath.Join(spool, name)
	if err := r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "bundle", Flags: []string{"create", "--quiet", "--version=2"},
		Args: append([]string{path}, revs...)}); err != nil {
		return mr, fmt.Errorf("bundle %s: %w", r.Path, err)
	}
	sum, size, err := fileSHA256(path)
	if err != nil {
		return mr, err
	}
	mr.File, mr.SHA256, mr.Size = name, sum, size
	return mr, nil
}

func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

func tarFile(tw *tar.Writer, name string, r io.Reader, size int64, mtime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: size, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := io.Copy(tw, r)
	return err
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// exportSpoolPrefix starts the name of an export's spool, beside the
// project's directory: exportSpoolPrefix + project + "-" + export id.
const exportSpoolPrefix = seedPrefix + "export-"

// cutExport is an export that a killed daemon left unfinished: its spool.
type cutExport struct {
	business, project, id, spool string
}

// findCutExports lists the export spools in the store: each is an export
// cut before its file was complete (a finished or cancelled export removed
// its own). cleanStale leaves them to settleExports.
func findCutExports(reposDir string) ([]cutExport, error) {
	bs, err := os.ReadDir(reposDir)
	if err != nil {
		return nil, err
	}
	var out []cutExport
	for _, b := range bs {
		if !b.IsDir() || strings.HasPrefix(b.Name(), ".") {
			continue
		}
		dir := filepath.Join(reposDir, b.Name())
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			rest, ok := strings.CutPrefix(e.Name(), exportSpoolPrefix)
			if !ok {
				continue
			}
			c := cutExport{business: b.Name(), spool: filepath.Join(dir, e.Name())}
			if i := strings.LastIndexByte(rest, '-'); i > 0 {
				c.project, c.id = rest[:i], rest[i+1:]
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// settleExports cancels each export a killed daemon left cut before its
// file was complete, so that its project takes pushes again without a
// manual step, and removes its spool. Only that export is cancelled: if
// another replaced it, or an import ended the move, nothing is. A cancel
// that fails keeps the spool for the next start. Called by Reconcile.
func (s *Service) settleExports(ctx context.Context) {
	cuts, err := findCutExports(s.o.ReposDir)
	if err != nil {
		s.log.Error("list the exports a killed daemon left", "err", err)
		return
	}
	m, merr := s.mover()
	for _, c := range cuts {
		if names.CheckScope(names.Scope{Business: c.business, Project: c.project}) != nil || !authz.ValidExportID(c.id) || merr != nil {
			// Not a spool this code made (an earlier layout, a hand-made
			// directory): nothing to settle, only to remove.
			os.RemoveAll(c.spool)
			continue
		}
		seq, err := m.CancelExport(ctx, c.business, c.project, c.id)
		if r := errdefs.ReasonOf(err); r == errdefs.ProjectOnOtherHost || r == errdefs.ProjectNotFound {
			// An import placed it elsewhere, or it is gone: no move of
			// this host's to end.
			seq, err = 0, nil
		}
		if err != nil {
			s.log.Error("an export cut before its file was complete could not be cancelled: the project stays moving until the next start or 'bushost project export --cancel'",
				"business", c.business, "project", c.project, "export_id", c.id, "err", err)
			continue
		}
		if seq != 0 {
			s.log.Warn("an export cut before its file was complete (bushostd stopped during it) was cancelled: the project takes pushes again; export it again to move it",
				"business", c.business, "project", c.project, "export_id", c.id, "seq", seq)
		} else {
			s.log.Info("an export cut before its file was complete had already ended (cancelled, replaced or imported): nothing to cancel",
				"business", c.business, "project", c.project, "export_id", c.id)
		}
		if err := os.RemoveAll(c.spool); err != nil {
			s.log.Error("remove a cut export's spool", "path", c.spool, "err", err)
		}
	}
}

// CancelExport ends a move of business/project begun on this host. It
// returns the project.move_cancelled event (0: nothing was moving).
func (s *Service) CancelExport(ctx context.Context, p names.Project) (int64, error) {
	m, err := s.mover()
	if err != nil {
		return 0, err
	}
	return m.CancelExport(ctx, p.Business(), p.Name(), "")
}

// ImportResult is what ImportProject placed here.
type ImportResult struct {
	Business, Project, From, ExportID string
	Seq                               int64 // the project.moved event
	Tasks, Bundles                    int
}

// ImportProject reads an ExportProject archive from body, verifies it and
// places its project on this host. In order: the manifest (first entry)
// is parsed and checked against the broker's store (CheckImport: the
// export is the project's current one, its digest and head the recorded
// ones, nothing appended for the project since) and its tasks against the
// log (each task's refs/work its latest push, every open task with a push
// carried), before anything is built; every bundle is read
// into a staging directory and checked against the manifest's sha256 and
// size; the repositories are built there, each bundle through `git
// bundle verify` and index-pack --strict in a quarantine, as pushes are,
// with exactly the manifest's refs; main is checked to hold the log's last
// landing; then, under
// the project's lock, the staging directory is renamed into
// repos/<business>/<project> (a stale copy from an earlier placement here
// set aside) and the broker places the project here in the transaction
// that ends the move (CompleteImport). A refusal at any step leaves
// nothing: no repository, no placement change, the copy set aside back.
func (s *Service) ImportProject(ctx context.Context, body io.Reader, step func(string)) (ImportResult, error) {
	var res ImportResult
	m, err := s.mover()
	if err != nil {
		return res, err
	}
	tx, err := s.store.beginImport()
	if err != nil {
		return res, err
	}
	defer tx.Rollback()
	step("read the manifest")
	tr := tar.NewReader(body)
	mf, digest, err := readManifest(tr)
	if err != nil {
		return res, readErr(ctx, err)
	}
	res.Business, res.Project, res.From, res.ExportID, res.Tasks = mf.Business, mf.Project, mf.From, mf.ExportID, len(mf.Tasks)
	c := authz.ImportClaim{Business: mf.Business, Project: mf.Project, From: mf.From, ID: mf.ExportID, Digest: digest,
		HeadSeq: mf.Head.Seq, HeadHash: mf.Head.Hash}
	if err := m.CheckImport(ctx, c); err != nil {
		return res, err
	}
	if err := s.manifestAgrees(ctx, mf); err != nil {
		return res, err
	}
	step("read the bundles")
	files := filepath.Join(tx.stage, "files")
	if err := readBundles(ctx, tr, mf, files); err != nil {
		return res, err
	}
	proj := tx.built()
	if err := os.Mkdir(proj, 0o700); err != nil {
		return res, err
	}
	p := repo{Business: mf.Business, Project: mf.Project, Dir: proj, Path: filepath.Join(proj, poolName), git: s.git, proj: mf.scope}
	step("verify the pool")
	if err := s.git.Run(ctx, gitcmd.Cmd{Sub: "init", Flags: []string{"--bare", "--quiet"}, Args: []string{p.Path}}); err != nil {
		return res, err
	}
	if err := p.importBundle(ctx, mf.Pool, files); err != nil {
		return res, err
	}
	res.Bundles++
	if mf.Root != "" {
		if err := s.git.Run(ctx, gitcmd.Cmd{GitDir: p.Path, Sub: "config", Args: []string{rootKey, mf.Root}}); err != nil {
			return res, err
		}
	}
	for _, t := range mf.Tasks {
		if t.Repository == nil {
			continue
		}
		step("verify task " + t.Task)
		r := p
		r.Task, r.task, r.Path = t.Task, t.scope, filepath.Join(proj, tasksDir, t.Task+".git")
		if err := os.MkdirAll(filepath.Dir(r.Path), 0o700); err != nil {
			return res, err
		}
		if err := initTask(r.Path); err != nil {
			return res, err
		}
		if err := r.importBundle(ctx, *t.Repository, files); err != nil {
			return res, err
		}
		if t.Repository.File != "" {
			res.Bundles++
		}
	}
	// The refs set are the manifest's, checked by manifestAgrees; main
	// must hold the last landing.
	step("check the refs against the log")
	if err := s.mainHasLandings(ctx, p); errdefs.ReasonOf(err) == errdefs.RepoDisagreesWithLog {
		return res, altered("%v", err)
	} else if err != nil {
		return res, err
	}
	step("place the project")
	res.Seq, err = tx.place(ctx, m, c, mf.scope)
	if err != nil {
		return res, err
	}
	s.log.Info("imported a project: it is placed on this host", "business", mf.Business, "project", mf.Project,
		"from", mf.From, "export_id", mf.ExportID, "seq", res.Seq, "tasks", res.Tasks)
	return res, nil
}

func altered(format string, a ...any) *errdefs.Error {
	return errdefs.InvalidArgument(errdefs.ExportAltered, "the file is not the export it claims to be: "+format, a...)
}

// readErr is an archive read's failure: the call's own end when the
// stream ended, else a file that is not a whole export.
func readErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if _, ok := errdefs.As(err); ok {
		return err
	}
	return altered("%v (truncated, or not an archive of 'bushost project export')", err).Wrap(err)
}

// readManifest reads the archive's first entry, the manifest, checks its
// shape and returns it with its sha256.
func readManifest(tr *tar.Reader) (manifest, string, error) {
	var mf manifest
	hdr, err := tr.Next()
	if err != nil {
		return mf, "", err
	}
	if hdr.Name != manifestName || hdr.Typeflag != tar.TypeReg || sparse(hdr) {
		kind := fmt.Sprintf("type %q", hdr.Typeflag)
		if sparse(hdr) {
			kind += ", sparse"
		}
		return mf, "", altered("its first entry is %q (%s), not the plain file %s", hdr.Name, kind, manifestName)
	}
	if hdr.Size > maxManifestBytes {
		return mf, "", altered("its manifest is %d bytes, over %d", hdr.Size, maxManifestBytes)
	}
	raw, err := io.ReadAll(io.LimitReader(tr, maxManifestBytes+1))
	if err != nil {
		return mf, "", err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&mf); err != nil {
		return mf, "", altered("its manifest is not valid: %v", err)
	}
	if err := mf.check(); err != nil {
		return mf, "", err
	}
	sum := sha256.Sum256(raw)
	return mf, hex.EncodeToString(sum[:]), nil
}

// check refuses a manifest that names anything this host would not make
// itself: other names, paths or refs, files not where the layout puts them.
func (mf *manifest) check() error {
	if mf.Format != manifestFormat {
		return altered("its format is %q, not %q", mf.Format, manifestFormat)
	}
	scope, err := names.ParseProject(mf.Business, mf.Project)
	if err != nil {
		return altered("its project %q/%q: %v", mf.Business, mf.Project, err)
	}
	mf.scope = scope
	if mf.From == "" || mf.ExportID == "" || mf.Head.Seq <= 0 || mf.Head.Hash == "" {
		return altered("its manifest names no exporting host, export or head")
	}
	if mf.Root != "" && (!filepath.IsAbs(mf.Root) || strings.ContainsAny(mf.Root, "\n\x00")) {
		// What project add records: an absolute path, one line.
		return altered("its root %q is not an absolute path on one line", mf.Root)
	}
	if err := mf.Pool.check(poolBundle, true); err != nil {
		return err
	}
	if _, ok := mf.Pool.Refs[MainRef]; !ok {
		return altered("its pool has no %s", MainRef)
	}
	seen := map[string]bool{}
	for i := range mf.Tasks {
		t := &mf.Tasks[i]
		var err error
		if t.scope, err = scope.Task(t.Task); err != nil {
			return altered("a task %q: %v", t.Task, err)
		}
		if seen[t.Task] {
			return altered("task %s is listed twice", t.Task)
		}
		seen[t.Task] = true
		if t.LastPush != "" && !gitid.Valid(t.LastPush) {
			return altered("task %s's last push %q is not an object id", t.Task, t.LastPush)
		}
		if t.Repository != nil {
			if err := t.Repository.check(taskBundleName(t.Task), false); err != nil {
				return err
			}
			// A task's repository holds its work ref and nothing else
			// (a push sets only that): no other ref, and none for a task
			// the log does not know (its work ref must then be the log's
			// latest push, and there is none).
			if ref := t.scope.WorkRef(); len(t.Repository.Refs) != 1 || t.Repository.Refs[ref] == "" {
				return altered("task %s's repository has refs other than %s", t.Task, ref)
			}
		}
	}
	return nil
}

func (mr *manifestRepo) check(file string, whole bool) error {
	if len(mr.Refs) == 0 {
		return altered("a repository (%s) with no refs", file)
	}
	for ref, oid := range mr.Refs {
		if err := gitid.CheckReferenceName(ref); err != nil || !strings.HasPrefix(ref, "refs/") || !gitid.Valid(oid) {
			return altered("ref %q -> %q of %s", ref, oid, file)
		}
	}
	switch {
	case mr.File == "" && whole:
		return altered("the pool has no bundle")
	case mr.File == "" && (mr.SHA256 != "" || mr.Size != 0):
		return altered("a repository without a bundle names a sha256 or size")
	case mr.File != "" && mr.File != file:
		return altered("a bundle is named %q, not %q", mr.File, file)
	case mr.File != "" && (len(mr.SHA256) != 64 || mr.Size <= 0):
		return altered("bundle %s has no sha256 or size", mr.File)
	}
	return nil
}

// sparse says whether hdr is a PAX sparse file (GNU.sparse.* records),
// which archive/tar expands on reading: a few blocks of archive could
// otherwise write any size of zeros into the staging directory before the
// sha256 is checked. The header's size is the expanded one.
func sparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// readBundles reads every other entry of the archive into dir (as
// <dir>/<name>), each one the manifest names, once, with its size and
// sha256; and checks that none the manifest names is missing.
func readBundles(ctx context.Context, tr *tar.Reader, mf manifest, dir string) error {
	want := map[string]*manifestRepo{poolBundle: &mf.Pool}
	for i := range mf.Tasks {
		if r := mf.Tasks[i].Repository; r != nil && r.File != "" {
			want[r.File] = r
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "tasks"), 0o700); err != nil {
		return err
	}
	got := map[string]bool{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return readErr(ctx, err)
		}
		mr, ok := want[hdr.Name]
		if !ok || got[hdr.Name] || hdr.Typeflag != tar.TypeReg {
			return altered("entry %q is not a bundle its manifest names (or is there twice)", hdr.Name)
		}
		if sparse(hdr) {
			return altered("entry %q is a sparse file, which an export never writes", hdr.Name)
		}
		got[hdr.Name] = true
		if hdr.Size != mr.Size {
			return altered("bundle %s is %d bytes, its manifest says %d", hdr.Name, hdr.Size, mr.Size)
		}
		f, err := os.OpenFile(filepath.Join(dir, hdr.Name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(io.MultiWriter(f, h), tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return readErr(ctx, err)
		}
		if sum := hex.EncodeToString(h.Sum(nil)); sum != mr.SHA256 {
			return altered("bundle %s has sha256 %s, its manifest says %s", hdr.Name, sum, mr.SHA256).With("file", hdr.Name)
		}
	}
	for name := range want {
		if !got[name] {
			return altered("bundle %s, which its manifest names, is missing (a truncated file?)", name)
		}
	}
	return nil
}

// importBundle brings mr's bundle into r (made, empty but for its pool) the
// checked way, and sets exactly mr's refs: `git bundle verify` (its
// prerequisites are in the pool), the header's refs the manifest's, the
// pack through index-pack --strict in a quarantine, as a push's.
func (r repo) importBundle(ctx context.Context, mr manifestRepo, files string) error {
	if mr.File != "" {
		path := filepath.Join(files, mr.File)
		if err := r.git.Run(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "bundle", Flags: []string{"verify", "--quiet"}, Args: []string{path}}); err != nil {
			return altered("bundle %s does not verify: %v", mr.File, err).Wrap(err)
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		br := bufio.NewReaderSize(f, 64<<10)
		h, err := bundle.ReadHeader(br)
		if err != nil {
			return altered("bundle %s: %v", mr.File, err).Wrap(err)
		}
		if len(h.Refs) != len(mr.Refs) {
			return altered("bundle %s has %d refs, its manifest %d", mr.File, len(h.Refs), len(mr.Refs))
		}
		// Each once: a ref twice would match the manifest's count and
		// leave one of the manifest's refs unchecked.
		seen := make(map[string]bool, len(h.Refs))
		for _, ref := range h.Refs {
			if seen[ref.Name] {
				return altered("bundle %s names %s twice", mr.File, ref.Name)
			}
			seen[ref.Name] = true
			if mr.Refs[ref.Name] != ref.Commit {
				return altered("bundle %s has %s at %s, its manifest %q", mr.File, ref.Name, ref.Commit, mr.Refs[ref.Name])
			}
		}
		q, err := r.quarantine()
		if err != nil {
			return err
		}
		defer q.Remove()
		q.IndexConfig = indexPackConfig
		if _, err := q.IndexPack(ctx, r.git, r.gitDir(), br); err != nil {
			return err
		}
		if err := q.Migrate(); err != nil {
			return err
		}
	}
	refs := make([]string, 0, len(mr.Refs))
	for ref := range mr.Refs {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	for _, ref := range refs {
		oid := mr.Refs[ref]
		typ, err := r.git.Line(ctx, gitcmd.Cmd{GitDir: r.Path, Sub: "cat-file", Flags: []string{"-t"}, Args: []string{oid}}, gitcmd.MaxLine)
		if err != nil || typ != "commit" {
			return altered("%s of %s names %s, not a commit the file carries", ref, filepath.Base(r.Path), oid)
		}
		if err := r.UpdateRef(ctx, gitid.ReferenceName(ref), gitid.ObjectID(oid), gitid.Zero); err != nil {
			return err
		}
	}
	return nil
}

// manifestAgrees checks the manifest's tasks against the log before
// anything is built, so that a file listing tasks the log does not have
// costs no repository: each task's refs/work is its latest push, and an
// open task with a push has its repository.
func (s *Service) manifestAgrees(ctx context.Context, mf manifest) error {
	last, err := s.o.Authority.LastPushes(ctx, mf.Business, mf.Project)
	if err != nil {
		return err
	}
	listed := map[string]manifestTask{}
	for _, t := range mf.Tasks {
		listed[t.Task] = t
		ref := t.scope.WorkRef()
		var at string
		if t.Repository != nil {
			at = t.Repository.Refs[ref]
		}
		if t.Repository != nil && at != last[t.Task] {
			return altered("task %s's %s is %q, the log's latest push %q", t.Task, ref, at, last[t.Task]).With("task", t.Task)
		}
	}
	for task, commit := range last {
		if t, ok := listed[task]; ok && t.Repository != nil || commit == "" {
			continue
		}
		if s.o.Authority.TaskOpen(ctx, authz.Grant{Business: mf.Business, Project: mf.Project, Task: task}) == nil {
			return altered("open task %s has a push (%s) but the file carries no repository for it", task, commit).With("task", task)
		}
	}
	return nil
}

// place renames the project tx built into the store and has the
// broker place it here, under the project's lock. A copy already there
// (this host owned the project before, and kept its repositories when it
// moved away) is set aside and removed once the placement is here (Commit),
// or put back if it is refused (Rollback).
func (tx *importTx) place(ctx context.Context, m authz.Mover, c authz.ImportClaim, scope names.Project) (int64, error) {
	if err := tx.lock(ctx, scope); err != nil {
		return 0, err
	}
	// Again under the lock, before the copy here is touched: another
	// import of this file on this host may have placed the project since
	// CheckImport, and its repositories are live now (serving fetches, and
	// taking pushes once the lock is free): not to be set aside even for
	// the moment CompleteImport takes to refuse.
	if err := m.CheckImport(ctx, c); err != nil {
		return 0, err
	}
	if err := tx.rename(); err != nil {
		return 0, err
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), criticalTimeout)
	defer cancel()
	seq, err := m.CompleteImport(cctx, c)
	if err != nil && errdefs.ReasonOf(err) == errdefs.CommitUnknown {
		// Whether the placement moved is learned from the store itself.
		host, _, perr := m.Placement(cctx, c.Business, c.Project)
		switch {
		case perr == nil && host == m.HostID():
			err = nil
		case perr != nil:
			// Still unknown: the repositories stay, since the project may
			// be placed here now. If it is not, nothing serves them, and
			// a retry of the import replaces them.
			tx.st.log.Error("import: whether the placement moved is unknown; the repositories are left in place", "dir", tx.p.Dir, "err", perr)
			tx.Commit()
			return 0, err
		}
	}
	if err != nil {
		return 0, err
	}
	tx.Commit()
	return seq, nil
}

// importTx is an import's write into the store: the staging directory
// the project is built in, then what placing it did under the project's
// lock (its business's directory and lock file made, a copy already there
// set aside, the built project renamed into place). Commit removes the
// copy set aside; Rollback, deferred right after beginImport, undoes what
// Commit did not make final, in reverse order, releases the lock and
// removes the staging directory. It may be called more than once.
type importTx struct {
	st                     *store
	stage                  string
	p                      repo // the project's place in the store
	unlock                 func()
	madeBusiness, madeLock bool
	aside                  string // holds the copy set aside as aside/project
	placed, done           bool
}

// beginImport makes an import's staging directory in the store.
func (st *store) beginImport() (*importTx, error) {
	stage, err := os.MkdirTemp(st.dir, seedPrefix+"import-")
	if err != nil {
		return nil, err
	}
	return &importTx{st: st, stage: stage}, nil
}

// built is where the project is built before it is placed.
func (tx *importTx) built() string { return filepath.Join(tx.stage, "project") }

// lock takes the project's lock, noting whether its business's directory
// and its lock file were there before.
func (tx *importTx) lock(ctx context.Context, scope names.Project) (err error) {
	if tx.p, err = tx.st.project(scope); err != nil {
		return err
	}
	_, err = os.Stat(filepath.Dir(tx.p.Dir))
	tx.madeBusiness = errors.Is(err, os.ErrNotExist)
	_, err = os.Stat(tx.p.LockPath)
	tx.madeLock = errors.Is(err, os.ErrNotExist)
	tx.unlock, err = tx.p.state().lock(ctx)
	return err
}

// rename sets the project's copy in the store aside, if there is one, and
// renames the built project into its place.
func (tx *importTx) rename() error {
	bdir := filepath.Dir(tx.p.Dir)
	if _, err := os.Stat(tx.p.Dir); err == nil {
		aside, err := os.MkdirTemp(bdir, seedPrefix+"replaced-"+tx.p.Project+"-")
		if err != nil {
			return err
		}
		if err := os.Rename(tx.p.Dir, filepath.Join(aside, "project")); err != nil {
			os.Remove(aside)
			return err
		}
		tx.aside = aside
	}
	if err := os.Rename(tx.built(), tx.p.Dir); err != nil {
		return err
	}
	tx.placed = true
	return bundle.Sync(bdir)
}

// Commit makes the placement final: the copy set aside goes, and the
// project's size is read afresh.
func (tx *importTx) Commit() {
	tx.done = true
	if err := os.RemoveAll(tx.aside); err != nil {
		tx.st.log.Error("import: remove the copy set aside (cleaned at the next start)", "dir", tx.aside, "err", err)
	}
	tx.p.state().forget()
}

// Rollback puts the store back as the import found it (importTx).
func (tx *importTx) Rollback() {
	bdir := filepath.Dir(tx.p.Dir)
	if !tx.done && (tx.placed || tx.aside != "") {
		if tx.placed {
			if err := os.Rename(tx.p.Dir, tx.built()); err != nil {
				os.RemoveAll(tx.p.Dir)
			}
		}
		if tx.aside != "" {
			if err := os.Rename(filepath.Join(tx.aside, "project"), tx.p.Dir); err != nil {
				tx.st.log.Error("import refused, and putting back the copy set aside failed", "dir", tx.aside, "err", err)
			} else {
				os.Remove(tx.aside)
			}
		}
		bundle.Sync(bdir)
	}
	tx.done = true
	if tx.unlock != nil {
		tx.unlock()
		tx.unlock = nil
		if tx.madeLock && !tx.p.exists() {
			os.Remove(tx.p.LockPath)
		}
		if tx.madeBusiness {
			os.Remove(bdir) // only when empty
		}
	}
	os.RemoveAll(tx.stage)
}
