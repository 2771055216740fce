package gitd

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// hookAuth is fakeAuth whose RecordPush runs a hook first: the push has
// migrated its pack and holds its task's lock there.
type hookAuth struct {
	*fakeAuth
	record func(authz.Push) error
}

func (h *hookAuth) RecordPush(ctx context.Context, g authz.Grant, p authz.Push, peer authz.Peer) error {
	if h.record != nil {
		if err := h.record(p); err != nil {
			return err
		}
	}
	return h.fakeAuth.RecordPush(ctx, g, p, peer)
}

// parkedIn reports whether a goroutine running outer is waiting in inner
// (both function names as a stack trace spells them).
func parkedIn(outer, inner string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, outer) && strings.Contains(g, inner) {
			return true
		}
	}
	return false
}

// A push refused after its pack moved in (by the beyond-git walk or by the
// broker) removes that pack again. A repack of the task's repository that
// ran in between rolled the pack into a new one, so the removal missed and
// the refused objects stayed in the repository; and the walk trusts what
// the repository holds ("entered before"), so the session's next push
// named the refused tree without carrying it and put a .gitmodules the
// walk refuses on refs/work/<task>, for reviewers to fetch. Housekeeping
// now repacks a task's repository under the task's lock, which a push
// holds from before its pack moves in until it is recorded or undone.
//
// The race is made deterministic: the broker's record of the refused push
// starts a forced housekeeping run and waits until it ended or waits for
// the lock, then refuses. The walk is off for that push (the broker's
// refusal is the same undo as the walk's) and on for the next.
func TestAttackRepackKeepsRefusedPush(t *testing.T) {
	var ha *hookAuth
	e := newEnv(t, func(o *Options) {
		ha = &hookAuth{fakeAuth: o.Authority.(*fakeAuth)}
		o.Authority = ha
	})
	e.svc.skip.BeyondGit = true
	ctx := context.Background()
	last := e.pushChain("t1", 2)
	r := e.svc.mustTask(t, "t1")
	bad := e.commitFile(".gitmodules", "[submodule \"s\"]\n\tpath = a./s\n\turl = ./s\n")
	badTree := e.run(e.work, "rev-parse", nil, "--", bad+"^{tree}")

	hkDone := make(chan HousekeepingRun, 1)
	ha.record = func(p authz.Push) error {
		if p.Commit != bad {
			return nil
		}
		return refuseBesideHousekeeping(ctx, e, r, hkDone)
	}
	if _, err := e.push("t1", e.bundle("HEAD", "^"+last)); errdefs.ReasonOf(err) != errdefs.TaskClosed {
		t.Fatalf("push the broker refuses: %v", err)
	}
	if run := <-hkDone; run.Err != nil {
		t.Fatalf("housekeeping beside the refused push: %+v", run)
	}
	ha.record = nil
	task := e.taskRepo("t1")
	if _, err := e.runErr(task, "cat-file", nil, "-e", "--", bad); err == nil {
		t.Errorf("the refused push's commit %s is still in the task's repository", bad)
	}
	if e.ref("refs/work/t1") != last {
		t.Fatalf("the ref moved: %s", e.ref("refs/work/t1"))
	}

	// The walk refuses that push when it runs.
	e.svc.skip.BeyondGit = false
	if _, err := e.push("t1", e.bundle("HEAD", "^"+last)); err == nil {
		t.Fatal("the walk took the .gitmodules it must refuse")
	}
	// The session's next push names the refused tree and the refused commit
	// as what the bus host has, and carries only a new commit.
	evil := e.run(e.work, "commit-tree", nil, "-p"+last, "-mevil", "--", badTree)
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", evil)
	res, err := e.push("t1", e.bundle("HEAD", "^"+bad))
	if err == nil {
		t.Fatalf("a push naming the refused tree was accepted: refs/work/t1 = %s holds the .gitmodules the walk refused", res.Commit)
	}
	if e.ref("refs/work/t1") != last {
		t.Fatalf("the ref moved: %s", e.ref("refs/work/t1"))
	}
	e.fsck()
}

// landAuth is fakeAuth that lets a task's latest push land, and whose
// record of the landing runs a hook and refuses.
type landAuth struct {
	*fakeAuth
	record func() error
}

func (l *landAuth) LandApproved(ctx context.Context, _ authz.Grant, b, p, task string, _ bool) (string, error) {
	c, _, err := l.LastPush(ctx, b, p, task)
	return c, err
}

func (l *landAuth) RecordLanding(context.Context, authz.Grant, authz.Landing, authz.Peer) (int64, error) {
	return 0, l.record()
}

func (l *landAuth) RecordLandRefusal(context.Context, authz.Grant, authz.Landing, string, authz.Peer) (int64, error) {
	return 0, nil
}

func (l *landAuth) Landings(context.Context, string, string) ([]authz.Landing, error) {
	return nil, nil
}

// A landing copies the task's work into the pool, and removes it again if
// the broker refuses to record it. A repack of the task's repository in
// between (-l: what the pool holds now is left out of the new pack) lost
// the task's objects: the old packs went with the repack, the pool's copy
// with the refusal, and refs/work/<task> named a commit nobody had. The
// repack takes the task's lock, which waits for the landing's whole
// project lock.
func TestAttackRepackDuringRefusedLanding(t *testing.T) {
	var la *landAuth
	e := newEnv(t, func(o *Options) {
		la = &landAuth{fakeAuth: o.Authority.(*fakeAuth)}
		o.Authority = la
	})
	ctx := context.Background()
	last := e.pushChain("t1", 3)
	r := e.svc.mustTask(t, "t1")
	hkDone := make(chan HousekeepingRun, 1)
	la.record = func() error {
		return refuseBesideHousekeeping(ctx, e, r, hkDone)
	}
	g := authz.Grant{ID: "lead", Business: testBusiness, Project: testProject, Task: "t1", Role: "lead", Caps: []string{authz.CapTaskLand}}
	if _, err := e.svc.Land(ctx, g, authz.Peer{PID: 1}, testTask("t1"), LandOptions{}); errdefs.ReasonOf(err) != errdefs.TaskClosed {
		t.Fatalf("landing the broker refuses: %v", err)
	}
	if run := <-hkDone; run.Err != nil {
		t.Fatalf("housekeeping beside the refused landing: %+v", run)
	}
	if _, err := e.runErr(e.taskRepo("t1"), "cat-file", nil, "-e", "--", last+"^{tree}"); err != nil {
		t.Fatalf("the task's pushed commit %s is lost: %v", last, err)
	}
	if e.ref("refs/work/t1") != last || e.ref(MainRef) != e.main {
		t.Fatalf("refs moved: work %s, main %s", e.ref("refs/work/t1"), e.ref(MainRef))
	}
	e.fsck()
}

// refuseBesideHousekeeping starts a forced housekeeping run on r and
// returns, as the test's broker refusing a record, once that run has
// ended (its result put back on done) or waits on a lock: the run is then
// as far into the refused push's or landing's window as it can get.
func refuseBesideHousekeeping(ctx context.Context, e *env, r repo, done chan HousekeepingRun) error {
	go func() { done <- e.svc.hk.housekeep(ctx, r, true) }()
	var run *HousekeepingRun
	for run == nil && !parkedIn("gitd.(*housekeeper).housekeep", "gitd.(*project).lock") {
		select {
		case got := <-done:
			run = &got
		case <-time.After(time.Millisecond):
		}
	}
	if run != nil {
		done <- *run
	}
	return errdefs.FailedPrecondition(errdefs.TaskClosed, "refused by the test's broker")
}
