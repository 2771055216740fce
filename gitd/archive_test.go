package gitd

import (
	"context"
	"os"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/treesnap"
)

// An open task's repository is kept (TASK_NOT_CLOSED, nothing changed); a
// closed one's is removed, twice is no error, and the next start does not
// take the archived task for a lost push.
func TestArchiveTask(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.commitFile("a.txt", "work\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	before := e.snapshot()
	_, err := e.svc.ArchiveTask(ctx, testTask("t1"))
	if x, ok := errdefs.As(err); !ok || x.Reason != errdefs.TaskNotClosed {
		t.Fatalf("archive of an open task: %v", err)
	}
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		t.Fatalf("a refused archive changed the store:\n%s", d)
	}
	e.auth.mu.Lock()
	e.auth.closed["t1"] = true
	e.auth.mu.Unlock()
	res, err := e.svc.ArchiveTask(ctx, testTask("t1"))
	if err != nil || !res.Removed || res.Bytes == 0 {
		t.Fatalf("archive: %+v %v", res, err)
	}
	if _, err := os.Stat(e.taskRepo("t1")); !os.IsNotExist(err) {
		t.Fatalf("task repository kept: %v", err)
	}
	if res, err := e.svc.ArchiveTask(ctx, testTask("t1")); err != nil || res.Removed {
		t.Fatalf("second archive: %+v %v", res, err)
	}
	svc, err := New(e.svc.o)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if len(e.auth.repair) != 0 {
		t.Fatalf("an archived task marked for repair: %v", e.auth.repair)
	}
	e.fsck()
}
