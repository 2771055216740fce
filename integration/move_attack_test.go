package integration

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/bushost/bushost/internal/pgtest"
	"github.com/bushost/bushost/internal/treesnap"
)

// A move as a hostile peer would try it: a session's grant cannot export,
// cancel or import (HOST_ONLY, nothing written, nothing moving); the file
// imported on two hosts at once is placed on exactly one, the other
// refused with nothing left behind; and the file is then refused on a
// third host and on the host that wrote it.
func TestMoveHostile(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "movehostile", "a move tried by a session and by two hosts at once")
	started := startSharing(t, 3, "--broker-dsn", dsn)
	a, b, c := started[0], started[1], started[2]
	aID := readHostID(t, a)
	base := filepath.Dir(a.Home)
	a.AddProject(t, "acme", "web")
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	work := filepath.Join(base, "work")
	runAs(t, a, worker, 0, "fetch-main", "--repo", work)
	if err := os.WriteFile(filepath.Join(work, "one.txt"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, work, "add", ".")
	testGit(t, work, "commit", "-q", "-m", "one")
	runAs(t, a, worker, 0, "push-working", "--repo", work)

	// The session's grant: host only, whatever it asks.
	stolen := filepath.Join(base, "stolen.tar")
	_, errs := runAs(t, a, worker, 4, "--json", "project", "export", "--business", "acme", "--project", "web", "--to", stolen)
	if !strings.Contains(errs, `"reason":"HOST_ONLY"`) {
		t.Fatalf("export with a session's grant: %s", errs)
	}
	if _, err := os.Stat(stolen); err == nil {
		t.Fatal("an export refused to a session wrote its file")
	}
	if p := listedProject(t, a, "acme", "web"); p.Moving {
		t.Fatal("an export refused to a session began a move")
	}
	file := filepath.Join(base, "web.tar")
	exportProject(t, a, file)
	_, errs = runAs(t, a, worker, 4, "--json", "project", "export", "--business", "acme", "--project", "web", "--cancel")
	if !strings.Contains(errs, `"reason":"HOST_ONLY"`) {
		t.Fatalf("cancel with a session's grant: %s", errs)
	}
	if p := listedProject(t, a, "acme", "web"); !p.Moving {
		t.Fatal("a cancel refused to a session ended the move")
	}
	reposB := treesnap.Take(t, filepath.Join(b.Home, "repos"))
	_, errs = runAs(t, b, worker, 4, "--json", "project", "import", "--from", file)
	if !strings.Contains(errs, `"reason":"HOST_ONLY"`) {
		t.Fatalf("import with a session's grant: %s", errs)
	}
	if d := treesnap.Diff(reposB, treesnap.Take(t, filepath.Join(b.Home, "repos"))); d != "" {
		t.Fatalf("an import refused to a session changed B's repositories:\n%s", d)
	}

	// B and C import the file at once: one places it, the other is
	// refused and keeps nothing of it.
	hosts := []*Host{b, c}
	var wg sync.WaitGroup
	codes, errOut := make([]int, 2), make([]string, 2)
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errOut[i], codes[i] = h.Run(t, nil, "--json", "project", "import", "--from", file)
		}()
	}
	wg.Wait()
	won, lost := -1, -1
	for i, code := range codes {
		switch code {
		case 0:
			won = i
		case 5:
			lost = i
		}
	}
	if won < 0 || lost < 0 || !strings.Contains(errOut[lost], `"reason":"EXPORT_STALE"`) {
		t.Fatalf("two imports at once: exits %v, want one 0 and one 5 EXPORT_STALE\n%s\n%s", codes, errOut[0], errOut[1])
	}
	winner, loser := hosts[won], hosts[lost]
	winnerID := readHostID(t, winner)
	if p := listedProject(t, a, "acme", "web"); p.Host != winnerID || p.Moving {
		t.Fatalf("after two imports: %+v, want placed on %s", p, winnerID)
	}
	if _, err := os.Stat(loser.PoolRepo("acme", "web")); err == nil {
		t.Fatal("the refused import left the project's repositories on its host")
	}
	if found(filepath.Join(loser.Home, "repos"), ".seeding-") {
		t.Fatal("the refused import left a staging directory")
	}
	// The winner serves it.
	got, _ := runAs(t, winner, worker, 0, "fetch-work", "--repo", filepath.Join(base, "w2"))
	if want := testGit(t, work, "rev-parse", "HEAD"); got != want {
		t.Fatalf("fetch-work on the new host: %s, want %s", got, want)
	}

	// Again on the loser (a third host now): the project is placed on
	// the winner, not on the host that wrote the file. On the host that
	// wrote it: refused as its own.
	importRefused(t, loser, file, 5, "EXPORT_STALE", "")
	importRefused(t, a, file, 5, "EXPORT_STALE", "")
	if _, errs, _ := loser.Run(t, nil, "--json", "project", "import", "--from", file); !strings.Contains(errs, winnerID) {
		t.Fatalf("the refusal on a third host does not name where the project is: %s", errs)
	}
	if _, errs, _ := a.Run(t, nil, "--json", "project", "import", "--from", file); !strings.Contains(errs, aID) {
		t.Fatalf("the refusal on the exporting host does not name it: %s", errs)
	}
}
