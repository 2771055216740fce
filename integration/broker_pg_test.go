package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/pgtest"
)

// Two bushostd with their own homes and repositories share one PostgreSQL
// broker: a grant issued through one works on the other, both see one log,
// and the close gate decided through one holds for pushes through the
// other.
func TestBrokerTwoHostsSharePostgres(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "it", "two bushostd sharing PostgreSQL")
	hosts := startSharing(t, 2, "--broker-dsn", dsn)
	a, b := hosts[0], hosts[1]
	if _, err := os.Stat(filepath.Join(a.Home, "broker.db")); err == nil {
		t.Fatal("bushostd made broker.db although --broker-dsn names PostgreSQL")
	}
	// The project lives on A (repositories shard by host; the broker is
	// shared): B refuses to add it, and serves none of its git calls.
	a.AddProject(t, "acme", "web")
	aID := readHostID(t, a)
	root := filepath.Join(filepath.Dir(a.Home), "root-acme-web")
	out, errs, code := b.Run(t, nil, "--json", "project", "add", "--business", "acme", "--project", "web", "--root", root)
	if code != 5 || !strings.Contains(errs, `"reason":"PROJECT_ON_OTHER_HOST"`) || !strings.Contains(errs, aID) {
		t.Fatalf("project add on B: exit %d, want 5 PROJECT_ON_OTHER_HOST naming %q\nstdout: %s\nstderr: %s", code, aID, out, errs)
	}
	if _, err := os.Stat(filepath.Join(b.Home, "repos", "acme")); err == nil {
		t.Fatalf("B made a repository for a project placed on A")
	}
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working", "review.request")
	reviewer := a.Grant(t, "acme", "web", "t1", "reviewer", "review.verdict")
	lead := a.Grant(t, "acme", "web", "t1", "lead", "task.close")

	// Push through A, ask for review and get the verdict through B.
	work := filepath.Join(filepath.Dir(a.Home), "work")
	if _, errs := runAs(t, b, worker, 5, "fetch-main", "--repo", work); !strings.Contains(errs, aID) {
		t.Fatalf("fetch-main through B does not name A: %s", errs)
	}
	runAs(t, a, worker, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "work")
	head := testGit(t, work, "rev-parse", "HEAD")
	runAs(t, a, worker, 0, "push-working", "--repo", work)
	id, _ := runAs(t, b, worker, 0, "review", "request")
	if _, errs := runAs(t, b, lead, 1, "task", "close"); !strings.Contains(errs, "no verdict yet") {
		t.Fatalf("close through B before the verdict: %s", errs)
	}
	runAs(t, b, reviewer, 0, "review", "verdict", "--request", id, "--approve", "--commit", head)
	runAs(t, a, lead, 0, "task", "close")

	// Closed for both.
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "late")
	if _, errs := runAs(t, a, worker, 1, "push-working", "--repo", work); !strings.Contains(errs, "closed") {
		t.Fatalf("push through A after close: %s", errs)
	}
	if _, errs := runAs(t, b, worker, 5, "push-working", "--repo", work); !strings.Contains(errs, aID) {
		t.Fatalf("push through B: %s", errs)
	}

	// One log, seen the same from both, verified by both.
	ea, eb := brokerEvents(t, a), brokerEvents(t, b)
	if len(ea) == 0 || len(ea) != len(eb) || ea[len(ea)-1].Hash != eb[len(eb)-1].Hash {
		t.Fatalf("the hosts disagree on the log: %d vs %d events", len(ea), len(eb))
	}
	var pushes int
	for _, e := range ea {
		if e.Type == "action.allowed" {
			pushes++
			if !strings.Contains(string(e.Data), head) {
				t.Fatalf("push event: %s", e.Data)
			}
		}
	}
	if pushes != 1 {
		t.Fatalf("%d push events, want 1", pushes)
	}
	for _, h := range []*Host{a, b} {
		if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
			t.Fatalf("log verify: %s", out)
		}
	}
}

// readHostID is the id h made at its first start (HOME/host-id).
func readHostID(t *testing.T, h *Host) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(h.Home, "host-id"))
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(string(raw))
	if id == "" {
		t.Fatal("empty host-id")
	}
	return id
}

// Eight workers push to one task in a loop, each alternating the two hosts
// sharing the store: every push through B is refused (the project lives on
// A), every accepted push extends the one before (the log's pushes of the
// task form one chain, each previous the commit before it), nothing
// accepted is lost, and A's ref agrees with the log after a restart of each
// host (issue 19).
func TestPushChainThroughTwoHosts(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "chain", "eight workers through two hosts")
	hosts := startSharing(t, 2, "--broker-dsn", dsn, "--max-calls-per-grant", "32")
	a, b := hosts[0], hosts[1]
	a.AddProject(t, "acme", "web")
	worker := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working")

	const workers, each = 8, 2
	var mu sync.Mutex
	accepted := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := filepath.Join(filepath.Dir(a.Home), fmt.Sprintf("w%d", w))
			if _, errs, code := a.Run(t, nil, "--token-file", worker, "fetch-main", "--repo", dir); code != 0 {
				t.Errorf("worker %d fetch-main: exit %d: %s", w, code, errs)
				return
			}
			done := 0
			for attempt := 0; done < each && attempt < 60; attempt++ {
				h := []*Host{a, b}[attempt%2]
				start := "main"
				if out, _, code := a.Run(t, nil, "--token-file", worker, "fetch-work", "--repo", dir); code == 0 {
					start = strings.TrimSpace(out)
				}
				testGit(t, dir, "checkout", "-q", "-B", "work", start)
				file := filepath.Join(dir, fmt.Sprintf("w%d-%d.txt", w, attempt))
				if err := os.WriteFile(file, []byte("x\n"), 0o644); err != nil {
					t.Error(err)
					return
				}
				testGit(t, dir, "add", ".")
				testGit(t, dir, "commit", "-q", "-m", filepath.Base(file))
				out, errs, code := h.Run(t, nil, "--json", "--token-file", worker, "push-working", "--repo", dir)
				switch {
				case code == 0:
					var r struct{ Commit string }
					if err := json.Unmarshal([]byte(out), &r); err != nil || r.Commit == "" {
						t.Errorf("push-working --json printed %q", out)
						return
					}
					mu.Lock()
					accepted[r.Commit] = true
					mu.Unlock()
					done++
				case code == 5 && h == b && strings.Contains(errs, "PROJECT_ON_OTHER_HOST"):
				case code == 5 && h == a && (strings.Contains(errs, "NON_FAST_FORWARD") || strings.Contains(errs, "PUSH_CONFLICT")):
				case code == 7 && strings.Contains(errs, "retry_after"):
				default:
					t.Errorf("worker %d push through %s: exit %d\n%s\n%s", w, h.Home, code, out, errs)
					return
				}
			}
			if done < each {
				t.Errorf("worker %d: %d pushes accepted in 60 attempts", w, done)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	chain := func() []string {
		var commits []string
		prev := ""
		for _, e := range brokerEvents(t, a) {
			var d struct{ Capability, Commit, Previous string }
			if e.Type != "action.allowed" || e.Task != "t1" || json.Unmarshal(e.Data, &d) != nil || d.Capability != "git.push.working" {
				continue
			}
			if d.Previous != prev {
				t.Fatalf("push %d names previous %q, want %q: the task's history forked", e.Seq, d.Previous, prev)
			}
			prev = d.Commit
			commits = append(commits, d.Commit)
		}
		return commits
	}
	commits := chain()
	if len(commits) != len(accepted) || len(commits) != workers*each {
		t.Fatalf("%d pushes in the log, %d accepted, want %d", len(commits), len(accepted), workers*each)
	}
	for _, c := range commits {
		if !accepted[c] {
			t.Fatalf("the log holds push %s no client saw accepted", c)
		}
	}
	last := commits[len(commits)-1]
	for _, h := range []*Host{a, b} {
		h.Restart(t)
		if out := h.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
			t.Fatalf("log verify: %s", out)
		}
	}
	dir := filepath.Join(filepath.Dir(a.Home), "check")
	runAs(t, a, worker, 0, "fetch-main", "--repo", dir)
	if got, _ := runAs(t, a, worker, 0, "fetch-work", "--repo", dir); got != last {
		t.Fatalf("after restarts A serves %s, the log's latest push is %s", got, last)
	}
}

// Killing one host's daemon in the middle of a push leaves the other host
// serving its own projects, and the shared log verifiable from both; the
// killed host, restarted, serves its project again with nothing of the cut
// push recorded (issue 19).
func TestKillOneHostMidPush(t *testing.T) {
	dsn := pgtest.SchemaDSN(t, "killone", "one of two hosts killed mid-push")
	hosts := startSharing(t, 2, "--broker-dsn", dsn)
	a, b := hosts[0], hosts[1]
	a.AddProject(t, "acme", "web")
	b.AddProject(t, "acme", "api")
	wa := a.Grant(t, "acme", "web", "t1", "worker", "git.push.working")
	wb := b.Grant(t, "acme", "api", "t1", "worker", "git.push.working")

	base := filepath.Dir(a.Home)
	big := filepath.Join(base, "big")
	runAs(t, a, wa, 0, "fetch-main", "--repo", big)
	if err := os.WriteFile(filepath.Join(big, "blob.bin"), []byte(randomString(48<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	testGit(t, big, "add", "blob.bin")
	testGit(t, big, "commit", "-q", "-m", "big")

	// The push to A is cut once its quarantine exists (the pack is
	// arriving), or whenever it ends if it wins the race.
	done := make(chan int, 1)
	go func() {
		_, _, code := a.Run(t, nil, "--token-file", wa, "push-working", "--repo", big)
		done <- code
	}()
	incoming := filepath.Join(a.Home, "repos", "acme")
	code, ended := 0, false
	for !ended && !found(incoming, bundlePrefix) {
		select {
		case code = <-done:
			ended = true
		case <-time.After(5 * time.Millisecond):
		}
	}
	a.Kill()
	if !ended {
		code = <-done
	}
	t.Logf("push to A ended with exit %d when A was killed", code)

	// B serves its project meanwhile, and both hosts' log verifies.
	work := filepath.Join(base, "api")
	runAs(t, b, wb, 0, "fetch-main", "--repo", work)
	testGit(t, work, "commit", "-q", "--allow-empty", "-m", "on B")
	head := testGit(t, work, "rev-parse", "HEAD")
	if out, _ := runAs(t, b, wb, 0, "push-working", "--repo", work); out != head {
		t.Fatalf("push to B while A is down printed %q, want %s", out, head)
	}
	if out := b.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify on B: %s", out)
	}

	// A comes back: its log verifies, it serves its project, and its task's
	// ref agrees with the log (the cut push is either recorded and served,
	// or absent from both).
	a.start(t)
	if out := a.Must(t, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		t.Fatalf("log verify on A: %s", out)
	}
	if found(incoming, bundlePrefix) {
		t.Fatal("the cut push's quarantine is still there after A's restart")
	}
	recorded := ""
	for _, e := range brokerEvents(t, a, "--task", "t1") {
		var d struct{ Capability, Commit string }
		if e.Type == "action.allowed" && json.Unmarshal(e.Data, &d) == nil && strings.Contains(string(e.Data), "git.push.working") && strings.Contains(string(e.Data), testGit(t, big, "rev-parse", "HEAD")) {
			recorded = d.Commit
		}
	}
	check := filepath.Join(base, "check")
	runAs(t, a, wa, 0, "fetch-main", "--repo", check)
	out, errs, code := a.Run(t, nil, "--token-file", wa, "fetch-work", "--repo", check)
	switch {
	case recorded != "" && (code != 0 || strings.TrimSpace(out) != recorded):
		t.Fatalf("the cut push is in the log as %s, but A serves: exit %d %s %s", recorded, code, out, errs)
	case recorded == "" && code == 0:
		t.Fatalf("the cut push is not in the log, but A serves work %s", out)
	}
	testGit(t, check, "commit", "-q", "--allow-empty", "-m", "after restart")
	if recorded != "" {
		testGit(t, check, "reset", "-q", "--hard", recorded)
		testGit(t, check, "commit", "-q", "--allow-empty", "-m", "after restart")
	}
	runAs(t, a, wa, 0, "push-working", "--repo", check)
}

// bundlePrefix is the name gitd's quarantine directories start with.
const bundlePrefix = "bushost-incoming-"

// found says whether a directory under root has a name starting with prefix.
func found(root, prefix string) bool {
	hit := false
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && strings.HasPrefix(d.Name(), prefix) {
			hit = true
			return filepath.SkipAll
		}
		return nil
	})
	return hit
}
