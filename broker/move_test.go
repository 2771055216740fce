package broker

import (
	"context"
	"testing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
)

// hostEnv is newEnv for a broker that names its host.
func hostEnv(t *testing.T, dsn, id string) *env {
	t.Helper()
	return newEnvWith(t, Options{DSN: dsn, AdminToken: adminToken, HostID: id})
}

// claim is what an export file of ex would say of itself.
func claim(ex authz.Export, digest string) authz.ImportClaim {
	return authz.ImportClaim{Business: "acme", Project: "web", From: ex.Host, ID: ex.ID, Digest: digest, HeadSeq: ex.HeadSeq, HeadHash: ex.HeadHash}
}

func wantReason(t *testing.T, err error, code errdefs.Kind, reason errdefs.Reason, what string) {
	t.Helper()
	e := errdefs.Of(err)
	if err == nil || e.Kind != code || e.Reason != reason {
		t.Fatalf("%s: %v, want %s %s", what, err, code, reason)
	}
}

// A project moves between two hosts sharing the store through the states
// of move.go: placed on A; moving from A (pushes refused with
// PROJECT_MOVING, reads served, an import checked against the export's id,
// digest and head); placed on B, where A serves nothing of it although it
// had cached its placement; and a cancelled export, after which the
// project takes pushes again and its file is stale.
func TestMoveStates(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			ctx := context.Background()
			a, b := hostEnv(t, dsn, "host-a"), hostEnv(t, dsn, "host-b")
			a.project("acme", "web")
			tm := a.team("t1")
			if err := a.push(tm.worker, 1); err != nil {
				t.Fatal(err)
			}
			// A caches its placement.
			if err := a.b.CheckPlacement(ctx, "acme", "web"); err != nil {
				t.Fatal(err)
			}

			_, err := b.b.BeginExport(ctx, "acme", "web", authz.NewExportID())
			wantReason(t, err, errdefs.KindFailedPrecondition, errdefs.ProjectOnOtherHost, "export on B")
			_, err = a.b.BeginExport(ctx, "acme", "nothing", authz.NewExportID())
			wantReason(t, err, errdefs.KindNotFound, errdefs.ProjectNotFound, "export of an unknown project")

			ex, err := a.b.BeginExport(ctx, "acme", "web", authz.NewExportID())
			if err != nil {
				t.Fatal(err)
			}
			if ex.HeadSeq != a.head() || ex.Host != "host-a" || len(ex.Tasks) != 1 || ex.Tasks[0].Commit != commit(1) || ex.Tasks[0].Closed {
				t.Fatalf("export %+v (head %d)", ex, a.head())
			}
			before := a.head()
			err = a.push(tm.worker, 2)
			a.refused(err, errdefs.KindUnavailable, before, "a push while moving")
			wantReason(t, err, errdefs.KindUnavailable, errdefs.ProjectMoving, "a push while moving")
			if e, _ := errdefs.As(err); e.RetryAfter == 0 || e.Metadata["host"] != "host-a" {
				t.Fatalf("PROJECT_MOVING is not retryable or names no host: %+v", e)
			}
			wantReason(t, a.b.NotMoving(ctx, "acme", "web"), errdefs.KindUnavailable, errdefs.ProjectMoving, "NotMoving on A")
			wantReason(t, b.b.NotMoving(ctx, "acme", "web"), errdefs.KindFailedPrecondition, errdefs.ProjectOnOtherHost, "NotMoving on B")
			if err := a.b.CheckPlacement(ctx, "acme", "web"); err != nil {
				t.Fatalf("reads on the owner while it moves: %v", err)
			}

			// Not sealed yet: the file was never finished.
			wantReason(t, b.b.CheckImport(ctx, claim(ex, "d1")), errdefs.KindFailedPrecondition, errdefs.ExportStale, "import of an unsealed export")
			if err := a.b.SealExport(ctx, "acme", "web", ex.ID, "d1"); err != nil {
				t.Fatal(err)
			}
			if err := b.b.CheckImport(ctx, claim(ex, "d1")); err != nil {
				t.Fatalf("the export's own claim: %v", err)
			}
			bad := claim(ex, "d2")
			wantReason(t, b.b.CheckImport(ctx, bad), errdefs.KindInvalidArgument, errdefs.ExportAltered, "another digest")
			bad = claim(ex, "d1")
			bad.HeadHash = "00"
			wantReason(t, b.b.CheckImport(ctx, bad), errdefs.KindInvalidArgument, errdefs.ExportAltered, "another head hash")
			bad = claim(ex, "d1")
			bad.HeadSeq--
			wantReason(t, b.b.CheckImport(ctx, bad), errdefs.KindInvalidArgument, errdefs.ExportAltered, "another head seq")
			bad = claim(ex, "d1")
			bad.ID = "x0"
			wantReason(t, b.b.CheckImport(ctx, bad), errdefs.KindFailedPrecondition, errdefs.ExportStale, "another export id")
			wantReason(t, a.b.CheckImport(ctx, claim(ex, "d1")), errdefs.KindFailedPrecondition, errdefs.ExportStale, "import on the exporting host")
			before = a.head()
			_, err = b.b.CompleteImport(ctx, bad)
			b.refused(err, errdefs.KindFailedPrecondition, before, "CompleteImport of another export id")

			// Exporting again makes the first file stale.
			ex2, err := a.b.BeginExport(ctx, "acme", "web", authz.NewExportID())
			if err != nil {
				t.Fatal(err)
			}
			if err := a.b.SealExport(ctx, "acme", "web", ex.ID, "d1"); errdefs.ReasonOf(err) != errdefs.ExportStale {
				t.Fatalf("sealing a replaced export: %v", err)
			}
			if err := a.b.SealExport(ctx, "acme", "web", ex2.ID, "d2"); err != nil {
				t.Fatal(err)
			}
			wantReason(t, b.b.CheckImport(ctx, claim(ex, "d1")), errdefs.KindFailedPrecondition, errdefs.ExportStale, "the replaced export")

			// An event of the project after the head makes the file stale.
			a.task("acme", "web", "t2")
			err = b.b.CheckImport(ctx, claim(ex2, "d2"))
			wantReason(t, err, errdefs.KindFailedPrecondition, errdefs.ExportStale, "an event after the head")
			if e, _ := errdefs.As(err); e.Metadata["type"] != TypeTaskAdded {
				t.Fatalf("stale import does not name the event: %+v", e)
			}

			ex3, err := a.b.BeginExport(ctx, "acme", "web", authz.NewExportID())
			if err != nil {
				t.Fatal(err)
			}
			if len(ex3.Tasks) != 2 {
				t.Fatalf("tasks %+v", ex3.Tasks)
			}
			if err := a.b.SealExport(ctx, "acme", "web", ex3.ID, "d3"); err != nil {
				t.Fatal(err)
			}
			// An event of another project does not.
			a.project("acme", "api")
			a.task("acme", "api", "t1")
			seq, err := b.b.CompleteImport(ctx, claim(ex3, "d3"))
			if err != nil {
				t.Fatalf("import: %v", err)
			}
			if ev, _, _ := b.b.st.read().event(ctx, seq); ev.Type != TypeProjectMoved || ev.Task != "" {
				t.Fatalf("the move's event: %+v", ev)
			}
			if host, _, _ := a.b.Placement(ctx, "acme", "web"); host != "host-b" {
				t.Fatalf("placed on %q after the import", host)
			}
			// The old owner serves nothing of it, its cache notwithstanding.
			wantReason(t, a.b.CheckPlacement(ctx, "acme", "web"), errdefs.KindFailedPrecondition, errdefs.ProjectOnOtherHost, "A after the move")
			before = a.head()
			err = a.push(tm.worker, 2)
			a.refused(err, errdefs.KindFailedPrecondition, before, "a push through A after the move")
			if err := b.b.CheckPlacement(ctx, "acme", "web"); err != nil {
				t.Fatalf("B after the move: %v", err)
			}
			_, err = b.b.CompleteImport(ctx, claim(ex3, "d3"))
			wantReason(t, err, errdefs.KindFailedPrecondition, errdefs.ExportStale, "a second import")
			if err := b.push(tm.worker, 2); err != nil {
				t.Fatalf("a push through B after the move: %v", err)
			}

			// A cancelled export: pushes again, and the file is stale.
			ex4, err := b.b.BeginExport(ctx, "acme", "web", authz.NewExportID())
			if err != nil {
				t.Fatal(err)
			}
			if err := b.b.SealExport(ctx, "acme", "web", ex4.ID, "d4"); err != nil {
				t.Fatal(err)
			}
			_, err = a.b.CancelExport(ctx, "acme", "web", "")
			wantReason(t, err, errdefs.KindFailedPrecondition, errdefs.ProjectOnOtherHost, "cancel on A")
			if seq, err := b.b.CancelExport(ctx, "acme", "web", ""); err != nil || seq == 0 {
				t.Fatalf("cancel: %d %v", seq, err)
			}
			if seq, err := b.b.CancelExport(ctx, "acme", "web", ""); err != nil || seq != 0 {
				t.Fatalf("cancel again: %d %v", seq, err)
			}
			wantReason(t, a.b.CheckImport(ctx, claim(ex4, "d4")), errdefs.KindFailedPrecondition, errdefs.ExportStale, "import of a cancelled export")
			if err := b.push(tm.worker, 3); err != nil {
				t.Fatalf("a push after the cancel: %v", err)
			}
			a.verify()
			b.verify()
		})
	}
}

// project.* is the broker's own: no grant records it.
func TestProjectEventsReserved(t *testing.T) {
	for _, typ := range []string{TypeProjectMoving, TypeProjectMoved, TypeProjectMoveCancelled, "project.anything"} {
		if e, ok := errdefs.As(CheckRecordType(typ)); !ok || e.Reason != errdefs.EventTypeReserved {
			t.Fatalf("%s: %v, want EVENT_TYPE_RESERVED", typ, CheckRecordType(typ))
		}
	}
}

// An export replaced by a newer one, that then fails, cancels only
// itself: the newer export's move goes on and its file imports. The
// operator's cancel (no id) ends whichever export is current.
func TestCancelReplacedExport(t *testing.T) {
	for _, k := range storeKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			dsn := k.dsn(t)
			ctx := context.Background()
			a, b := hostEnv(t, dsn, "host-a"), hostEnv(t, dsn, "host-b")
			a.project("acme", "web")
			old, err := a.b.BeginExport(ctx, "acme", "web", authz.NewExportID())
			if err != nil {
				t.Fatal(err)
			}
			ex, err := a.b.BeginExport(ctx, "acme", "web", authz.NewExportID())
			if err != nil {
				t.Fatal(err)
			}
			if err := a.b.SealExport(ctx, "acme", "web", ex.ID, "d2"); err != nil {
				t.Fatal(err)
			}
			head := a.head()
			if seq, err := a.b.CancelExport(ctx, "acme", "web", old.ID); err != nil || seq != 0 {
				t.Fatalf("cancel of the replaced export: %d %v", seq, err)
			}
			if a.head() != head {
				t.Fatal("cancelling a replaced export appended an event")
			}
			wantReason(t, a.b.NotMoving(ctx, "acme", "web"), errdefs.KindUnavailable, errdefs.ProjectMoving, "NotMoving after the replaced export's cancel")
			if err := b.b.CheckImport(ctx, claim(ex, "d2")); err != nil {
				t.Fatalf("the newer export's file: %v", err)
			}
			if seq, err := a.b.CancelExport(ctx, "acme", "web", ""); err != nil || seq == 0 {
				t.Fatalf("the operator's cancel: %d %v", seq, err)
			}
			wantReason(t, b.b.CheckImport(ctx, claim(ex, "d2")), errdefs.KindFailedPrecondition, errdefs.ExportStale, "import after the cancel")
			a.verify()
		})
	}
}
