package gitd

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/treesnap"
)

// fakeAuth is a test double of the broker: tokens map to grants, closed
// tasks refuse, pushes are kept in memory.
type fakeAuth struct {
	mu     sync.Mutex
	grants map[string]authz.Grant
	closed map[string]bool
	refuse error // RecordPush returns it when set
	// unclear is the COMMIT_UNKNOWN RecordPush returns when set, having
	// recorded the push first if unclearCommitted; readBack, when set,
	// is PushRecorded's failure to read the log back.
	unclear          error
	unclearCommitted bool
	readBack         error
	pushes           []authz.Push
	projects         map[string]bool
	lastExtra        map[string]string // task -> commit, recorded without a ref move
	repair           map[string]string // task -> why it needs repair
}

func newFakeAuth() *fakeAuth {
	return &fakeAuth{
		grants:   map[string]authz.Grant{"admin": {ID: authz.HostID, Host: true}},
		closed:   map[string]bool{},
		projects: map[string]bool{},
	}
}

func (f *fakeAuth) grant(tok string, g authz.Grant) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grants[tok] = g
}

func (f *fakeAuth) Authorize(_ context.Context, token string, caps ...string) (authz.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.grants[token]
	if !ok {
		return authz.Grant{}, errdefs.Unauthenticated(errdefs.TokenUnknown, "unknown token")
	}
	if len(caps) == 0 {
		if !g.Host {
			return authz.Grant{}, errdefs.PermissionDenied(errdefs.HostOnly, "host token required")
		}
		return g, nil
	}
	for _, c := range caps {
		if g.Has(c) {
			return g, nil
		}
	}
	return authz.Grant{}, errdefs.PermissionDenied(errdefs.CapabilityMissing, "grant lacks %v", caps)
}

func (f *fakeAuth) CheckPlacement(context.Context, string, string) error { return nil }

func (f *fakeAuth) EnsureProject(_ context.Context, b, p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.projects[b+"/"+p] = true
	return nil
}

func (f *fakeAuth) TaskOpen(_ context.Context, g authz.Grant) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed[g.Task] {
		return errdefs.FailedPrecondition(errdefs.TaskClosed, "task %s is closed", g.Task)
	}
	return nil
}

func (f *fakeAuth) RecordPush(_ context.Context, g authz.Grant, p authz.Push, _ authz.Peer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return f.refuse
	}
	if f.closed[g.Task] {
		return errdefs.FailedPrecondition(errdefs.TaskClosed, "task %s is closed", g.Task)
	}
	if f.unclear != nil && !f.unclearCommitted {
		return f.unclear
	}
	f.pushes = append(f.pushes, p)
	return f.unclear
}

func (f *fakeAuth) GrantValid(context.Context, authz.Grant) error { return nil }

func (f *fakeAuth) PushRecorded(_ context.Context, b, p, task, commit string) (bool, error) {
	f.mu.Lock()
	readBack := f.readBack
	f.mu.Unlock()
	if readBack != nil {
		return false, readBack
	}
	last, _ := f.LastPushes(context.Background(), b, p)
	return last[task] == commit, nil
}

func (f *fakeAuth) LastPush(_ context.Context, b, p, task string) (string, string, error) {
	last, _ := f.LastPushes(context.Background(), b, p)
	f.mu.Lock()
	defer f.mu.Unlock()
	return last[task], f.repair[task], nil
}

func (f *fakeAuth) MarkNeedsRepair(_ context.Context, b, p, task, why, commit string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.repair == nil {
		f.repair = map[string]string{}
	}
	f.repair[task] = why
	return nil
}

func (f *fakeAuth) Repaired(_ context.Context, b, p, task string, restored bool, commit, refCommit string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.repair, task)
	if !restored {
		if f.lastExtra == nil {
			f.lastExtra = map[string]string{}
		}
		f.lastExtra[task] = refCommit
	}
	return 1, nil
}

func (f *fakeAuth) LastPushes(_ context.Context, b, p string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for _, x := range f.pushes {
		if x.Business == b && x.Project == p {
			out[x.Task] = x.Commit
		}
	}
	for t, c := range f.lastExtra {
		out[t] = c
	}
	return out, nil
}

func (f *fakeAuth) recorded() []authz.Push {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]authz.Push(nil), f.pushes...)
}

// env is one test's world: a service on a temp store, a project seeded
// from a git root, and a work repository cloned from that root.
type env struct {
	t    *testing.T
	svc  *Service
	auth *fakeAuth
	git  *gitcmd.Runner
	root string // the project's root (a git work tree)
	work string // a worker's repository, main as on the server
	main string // main's commit
	repo string // the project's pool
}

const (
	testBusiness = "acme"
	testProject  = "web"
)

func newEnv(t *testing.T, opts ...func(*Options)) *env {
	t.Helper()
	g, err := gitcmd.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, auth: newFakeAuth(), git: g}
	o := Options{ReposDir: filepath.Join(t.TempDir(), "repos"), GitHome: t.TempDir(), Authority: e.auth}
	for _, f := range opts {
		f(&o)
	}
	e.svc, err = New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.root = t.TempDir()
	e.run(e.root, "init", nil, "--quiet")
	os.WriteFile(filepath.Join(e.root, "README"), []byte("hello\n"), 0o644)
	e.run(e.root, "add", nil, "--all")
	e.commitAll(e.root, "initial")
	e.main, _, err = e.svc.AddProject(context.Background(), testScope(), e.root)
	if err != nil {
		t.Fatal(err)
	}
	e.repo = filepath.Join(o.ReposDir, testBusiness, testProject, poolName)
	e.work = t.TempDir()
	e.run(e.work, "init", nil, "--quiet")
	e.run(e.work, "fetch", nil, "--quiet", "--update-head-ok", "--", e.root, "+HEAD:refs/heads/main")
	// The worker commits on its own branch; main stays the server's.
	e.run(e.work, "symbolic-ref", nil, "--", "HEAD", "refs/heads/work")
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "main")
	return e
}

// run runs git in dir; flags and args are split at "--" (args after it).
func (e *env) run(dir, sub string, stdin []byte, words ...string) string {
	e.t.Helper()
	out, err := e.runErr(dir, sub, stdin, words...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) runErr(dir, sub string, stdin []byte, words ...string) (string, error) {
	c := gitcmd.Cmd{Dir: dir, Sub: sub, Env: []string{
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com", "GIT_AUTHOR_DATE=1700000000 +0000",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com", "GIT_COMMITTER_DATE=1700000000 +0000",
	}}
	for i, w := range words {
		if w == "--" {
			c.Args = words[i+1:]
			break
		}
		c.Flags = append(c.Flags, w)
	}
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	return e.git.Line(context.Background(), c, 16<<20)
}

// commitAll commits everything in dir and returns the commit.
func (e *env) commitAll(dir, msg string) string {
	e.t.Helper()
	e.run(dir, "add", nil, "--all")
	e.run(dir, "commit", nil, "--quiet", "--allow-empty", "-m"+msg)
	return e.run(dir, "rev-parse", nil, "--", "HEAD")
}

// commitFile writes name=content in the work repo and commits it.
func (e *env) commitFile(name, content string) string {
	e.t.Helper()
	p := filepath.Join(e.work, name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return e.commitAll(e.work, "change "+name)
}

// bundle makes a bundle in the work repo of revs and returns its bytes.
func (e *env) bundle(revs ...string) []byte {
	e.t.Helper()
	out, err := e.bundleErr(revs...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) bundleErr(revs ...string) ([]byte, error) {
	var buf bytes.Buffer
	err := e.git.Run(context.Background(), gitcmd.Cmd{Dir: e.work, Sub: "bundle",
		Flags: []string{"create", "--quiet", "--version=2"}, Args: append([]string{"-"}, revs...), Stdout: &buf})
	return buf.Bytes(), err
}

func (e *env) grant(task string) authz.Grant {
	return authz.Grant{ID: "g-" + task, Business: testBusiness, Project: testProject, Task: task,
		Role: "worker", Caps: []string{authz.CapPushWorking}}
}

func (e *env) push(task string, b []byte) (PushResult, error) {
	return e.svc.Push(context.Background(), e.grant(task), testTask(task), authz.Peer{PID: 1}, 0, bytes.NewReader(b))
}

// snapshot records every file and directory under the store, so that a
// refused push can be shown to have changed nothing.
func (e *env) snapshot() map[string]string {
	e.t.Helper()
	return treesnap.Take(e.t, e.svc.o.ReposDir)
}

// taskRepo is the path of task's repository.
func (e *env) taskRepo(task string) string {
	return filepath.Join(filepath.Dir(e.repo), tasksDir, task+".git")
}

// ref reads a ref of the server's repositories, "" if absent:
// refs/work/<task> from the task's repository, the others from the pool.
func (e *env) ref(name string) string {
	e.t.Helper()
	dir := e.repo
	if task, ok := strings.CutPrefix(name, "refs/work/"); ok {
		dir = e.taskRepo(task)
		if _, err := os.Stat(dir); err != nil {
			return ""
		}
	}
	out, err := e.git.Line(context.Background(), gitcmd.Cmd{GitDir: dir, Sub: "for-each-ref", Flags: []string{"--format=%(objectname)"}, Args: []string{name}}, gitcmd.MaxLine)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// fsck runs git fsck --strict on the pool and on every task repository.
func (e *env) fsck() {
	e.t.Helper()
	tasks, _ := filepath.Glob(filepath.Join(filepath.Dir(e.repo), tasksDir, "*.git"))
	for _, dir := range append([]string{e.repo}, tasks...) {
		if out, err := e.git.Output(context.Background(), gitcmd.Cmd{GitDir: dir, Sub: "fsck", Flags: []string{"--strict", "--no-progress"}}, 16<<20); err != nil {
			e.t.Fatalf("git fsck %s: %v\n%s", dir, err, out)
		}
	}
}

// rawObject writes an object of type typ with exactly body into the work
// repository, with no checks (hash-object --literally).
func (e *env) rawObject(typ string, body []byte) string {
	e.t.Helper()
	return e.run(e.work, "hash-object", body, "--literally", "-t"+typ, "-w", "--stdin")
}

type treeEntry struct {
	mode, name, oid string
}

// rawTree builds tree bytes in the given order, modes as written.
func rawTree(entries ...treeEntry) []byte {
	var b bytes.Buffer
	for _, en := range entries {
		raw, err := hex.DecodeString(en.oid)
		if err != nil {
			panic(err)
		}
		fmt.Fprintf(&b, "%s %s\x00", en.mode, en.name)
		b.Write(raw)
	}
	return b.Bytes()
}

// rawCommit writes a commit of tree on main with the given author line.
func (e *env) rawCommit(tree, author string) string {
	e.t.Helper()
	body := fmt.Sprintf("tree %s\nparent %s\nauthor %s\ncommitter Test <test@example.com> 1700000000 +0000\n\nbad\n", tree, e.main, author)
	return e.rawObject("commit", []byte(body))
}

const goodAuthor = "Test <test@example.com> 1700000000 +0000"

// bareGit makes a bare repository at repo, outside any service, and
// returns a runner of git in it (stdin, then the words), with no system or
// global configuration; a failure fails the test.
func bareGit(t *testing.T, repo string) func(stdin string, args ...string) string {
	t.Helper()
	git := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"--git-dir", repo}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("", "init", "-q", "--bare")
	return git
}

// testScope is the test project, parsed as the server parses a request.
func testScope() names.Project { return mustProject(testBusiness, testProject) }

// testTask is task of the test project, parsed.
func testTask(task string) names.Task {
	t, err := testScope().Task(task)
	if err != nil {
		panic(err)
	}
	return t
}

// reserved is what pushes to the test project have reserved against its
// quota and not yet accounted or released.
func (e *env) reserved(t *testing.T) int64 {
	t.Helper()
	r, err := e.svc.store.project(testScope())
	if err != nil {
		t.Fatal(err)
	}
	st := r.state()
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.reserved
}

func mustProject(business, project string) names.Project {
	p, err := names.ParseProject(business, project)
	if err != nil {
		panic(err)
	}
	return p
}
