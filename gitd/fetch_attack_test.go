package gitd

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// A session's fetch names ids (have, also_have) to learn about another
// task's objects, or to make the daemon work: every answer about another
// task's object (a commit, its tree, a blob) must be the one an id of
// nothing gets, error code, reason and message alike but for the id; ids
// that are trees or blobs of the task's own repository, and the same id
// 32 times, change nothing.
func TestAttackFetchHaveOracle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// Task t2's push, which t1's session probes.
	e.run(e.work, "update-ref", nil, "--", "refs/heads/other", e.main)
	e.run(e.work, "symbolic-ref", nil, "--", "HEAD", "refs/heads/other")
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "other")
	other := e.commitFile("secret.txt", "t2's secret\n")
	if _, err := e.push("t2", e.bundle("other", "^"+e.main)); err != nil {
		t.Fatal(err)
	}
	otherTree := e.run(e.work, "rev-parse", nil, "--", other+"^{tree}")
	otherBlob := e.run(e.work, "rev-parse", nil, "--", other+":secret.txt")
	// t1's own push: a commit, a tree and a blob of its own.
	e.run(e.work, "update-ref", nil, "--", "refs/heads/work", e.main)
	e.run(e.work, "symbolic-ref", nil, "--", "HEAD", "refs/heads/work")
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "work")
	own := e.commitFile("a.txt", "one\n")
	if _, err := e.push("t1", e.bundle("HEAD", "^"+e.main)); err != nil {
		t.Fatal(err)
	}
	ownTree := e.run(e.work, "rev-parse", nil, "--", own+"^{tree}")
	ownBlob := e.run(e.work, "rev-parse", nil, "--", own+":a.txt")
	mainTree := e.run(e.work, "rev-parse", nil, "--", e.main+"^{tree}")
	const nothing = "1111111111111111111111111111111111111111"

	review := func(have string, also ...string) ([]byte, error) {
		var out bytes.Buffer
		err := e.svc.WriteReviewBundle(ctx, testBusiness, testProject, "t1", have, also, func(string) error { return nil }, &out)
		return out.Bytes(), err
	}
	// have: another task's objects are answered as nothing.
	_, want := review(nothing)
	if want == nil {
		t.Fatal("a have of nothing was taken")
	}
	we := errdefs.Of(want)
	for name, id := range map[string]string{"commit": other, "tree": otherTree, "blob": otherBlob} {
		_, err := review(id)
		ge := errdefs.Of(err)
		if ge.Kind != we.Kind || ge.Reason != we.Reason || strings.ReplaceAll(err.Error(), id, nothing) != want.Error() {
			t.Errorf("have = t2's %s: %v (%s %s); a have of nothing: %v (%s %s)", name, err, ge.Kind, ge.Reason, want, we.Kind, we.Reason)
		}
	}
	// also_have: the same bundle with another task's ids, with ids that
	// are no commits, and with one id 32 times, as with none.
	plain, err := review(e.main)
	if err != nil {
		t.Fatal(err)
	}
	for name, also := range map[string][]string{
		"t2's objects": {other, otherTree, otherBlob},
		"no commits":   {ownTree, ownBlob, mainTree, nothing},
		"duplicates":   repeat(otherTree, MaxAlsoHave),
	} {
		got, err := review(e.main, also...)
		if err != nil || !bytes.Equal(got, plain) {
			t.Errorf("also-have %s: %d bytes, %v; want the %d bytes of none", name, len(got), err, len(plain))
		}
	}
	// fetch-main: a have of t2's commit gets main whole, as nothing does.
	mainOf := func(have string) []byte {
		var out bytes.Buffer
		if err := e.svc.WriteMainBundle(ctx, testBusiness, testProject, have, func(string) error { return nil }, &out); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	if !bytes.Equal(mainOf(other), mainOf(nothing)) || !bytes.Equal(mainOf(otherTree), mainOf(nothing)) {
		t.Error("fetch-main with t2's commit as have differs from one with an id of nothing")
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}
