package gitd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/treesnap"
)

// refusedWith pushes b for task t1 and requires a refusal with reason,
// leaving the store as it was.
func (e *env) refusedWith(b []byte, reason errdefs.Reason) *errdefs.Error {
	e.t.Helper()
	before := e.snapshot()
	recs := len(e.auth.recorded())
	_, err := e.push("t1", b)
	got := errdefs.Of(err)
	if err == nil || got.Reason != reason || got.Metadata["limit"] == "" {
		e.t.Fatalf("push: got %v (%+v), want %s", err, got, reason)
	}
	if d := treesnap.Diff(before, e.snapshot()); d != "" {
		e.t.Fatalf("store changed by a refused push:\n%s", d)
	}
	if len(e.auth.recorded()) != recs {
		e.t.Fatal("refused push was recorded")
	}
	e.fsck()
	return got
}

func TestPushObjectBounds(t *testing.T) {
	small := func(o *Options) { o.MaxObjectBytes, o.MaxCommitBytes, o.MaxTreeBytes = 256<<10, 8<<10, 16<<10 }
	t.Run("blob", func(t *testing.T) {
		e := newEnv(t, small)
		e.commitFile("big.bin", strings.Repeat("a", 300<<10))
		got := e.refusedWith(e.bundle("HEAD", "^main"), errdefs.ObjectTooLarge)
		if got.Metadata["type"] != "blob" || !strings.Contains(got.Message, "--max-object-bytes") {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("commit", func(t *testing.T) {
		e := newEnv(t, small)
		tree := e.run(e.work, "rev-parse", nil, "--", "main^{tree}")
		body := fmt.Sprintf("tree %s\nparent %s\nauthor %s\ncommitter %s\n\n%s\n", tree, e.main, goodAuthor, goodAuthor, strings.Repeat("m", 64<<10))
		c := e.rawObject("commit", []byte(body))
		e.run(e.work, "update-ref", nil, "--", "refs/heads/huge", c)
		got := e.refusedWith(e.bundle("refs/heads/huge", "^main"), errdefs.ObjectTooLarge)
		if got.Metadata["type"] != "commit" || !strings.Contains(got.Message, "--max-commit-bytes") {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("within bounds", func(t *testing.T) {
		e := newEnv(t, small)
		e.commitFile("ok.bin", strings.Repeat("a", 200<<10))
		if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("checks off", func(t *testing.T) {
		e := newEnv(t, small)
		e.svc.skip.ObjectChecks = true
		e.commitFile("big.bin", strings.Repeat("a", 300<<10))
		if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
			t.Fatal(err)
		}
	})
}

func TestPushQuotas(t *testing.T) {
	t.Run("task", func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.MaxTaskBytes = 64 << 10 })
		e.commitFile("a.txt", noise(20<<10))
		if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
			t.Fatal(err)
		}
		used, err := taskBytes(e.svc.mustTask(t, "t1"))
		if err != nil || used == 0 {
			t.Fatalf("ledger: %d %v", used, err)
		}
		e.commitFile("b.txt", noise(60<<10))
		got := e.refusedWith(e.bundle("HEAD", "^main"), errdefs.TaskQuota)
		if got.Metadata["used"] != fmt.Sprint(used) {
			t.Fatalf("%+v", got)
		}
		// Another task of the project has its own quota.
		e.run(e.work, "update-ref", nil, "--", "refs/heads/first", "HEAD~1")
		if _, err := e.svc.Push(context.Background(), e.grant("t2"), testTask("t2"), authz.Peer{}, 0, bytes.NewReader(e.bundle("refs/heads/first", "^main"))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("project", func(t *testing.T) {
		e := newEnv(t)
		base, err := dirBytes(filepath.Dir(e.repo))
		if err != nil {
			t.Fatal(err)
		}
		e.svc.o.MaxProjectBytes = base + 40<<10
		e.commitFile("a.txt", noise(20<<10))
		if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
			t.Fatal(err)
		}
		e.commitFile("b.txt", noise(30<<10))
		got := e.refusedWith(e.bundle("HEAD", "^main"), errdefs.ProjectQuota)
		// The project's usage is every task's: none of it is told.
		if _, ok := got.Metadata["used"]; ok || strings.Contains(got.Message, "holds") {
			t.Fatalf("the refusal tells the project's usage: %q %v", got.Message, got.Metadata)
		}
	})
}

func (s *Service) mustTask(t *testing.T, task string) repo {
	r, err := s.store.task(testTask(task))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A have naming a commit over the bound, or something that is no commit,
// is never read whole.
func TestReviewHaveBounds(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxCommitBytes = 8 << 10 })
	e.commitFile("a.txt", "one\n")
	res, err := e.push("t1", e.bundle("HEAD", "^main"))
	if err != nil {
		t.Fatal(err)
	}
	// An object the host's seeding could have put there.
	tree := e.run(e.work, "rev-parse", nil, "--", "main^{tree}")
	inRepo := func(typ string, body []byte) string {
		id, err := e.git.Line(context.Background(), gitcmd.Cmd{GitDir: e.repo, Sub: "hash-object",
			Flags: []string{"--literally", "-t" + typ, "-w", "--stdin"}, Stdin: bytes.NewReader(body)}, gitcmd.MaxLine)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	huge := inRepo("commit", []byte(fmt.Sprintf("tree %s\nauthor %s\ncommitter %s\n\n%s\n", tree, goodAuthor, goodAuthor, strings.Repeat("m", 64<<10))))
	blob := inRepo("blob", []byte("just a blob\n"))
	write := func(have string) (string, error) {
		var out bytes.Buffer
		err := e.svc.WriteReviewBundle(context.Background(), testTask("t1"), have, nil, func(string) error { return nil }, &out)
		head, _, _ := strings.Cut(out.String(), "\n\n")
		return head, err
	}
	head, err := write(huge)
	if err != nil || strings.Contains(head, "\n-") || !strings.Contains(head, res.Commit) {
		t.Fatalf("a huge have: %v\n%s", err, head)
	}
	if _, err := write(blob); err == nil || !strings.Contains(err.Error(), "not a commit") {
		t.Fatalf("a blob as have: %v", err)
	}
	head, err = write(e.main)
	if err != nil || !strings.Contains(head, "-"+e.main) {
		t.Fatalf("main as have: %v\n%s", err, head)
	}
}

// noise is incompressible text: its pack is as large as it is.
func noise(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return string(b)
}
