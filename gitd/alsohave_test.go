package gitd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
)

// TestReviewBundleAlsoHave: a fetch that names the pushes it fetched before
// gets only what is new since; a named commit the task's repository lacks
// (another task's, or none) is left out, with the same bundle either way;
// the latest push itself, which would leave the bundle empty, is left out
// too; more than MaxAlsoHave, or one that is not an object id, is refused.
func TestReviewBundleAlsoHave(t *testing.T) {
	e := newEnv(t)
	c1 := e.commitFile("a.txt", "one\n")
	if _, err := e.push("t1", e.bundle("work", "^"+e.main)); err != nil {
		t.Fatal(err)
	}
	c2 := e.commitFile("a.txt", "two\n")
	if _, err := e.push("t1", e.bundle("work", "^"+c1)); err != nil {
		t.Fatal(err)
	}
	// Another task's push, which t1's fetch must not use.
	e.run(e.work, "update-ref", nil, "--", "refs/heads/other", e.main)
	e.run(e.work, "symbolic-ref", nil, "--", "HEAD", "refs/heads/other")
	e.run(e.work, "reset", nil, "--hard", "--quiet", "--", "other")
	other := e.commitFile("b.txt", "other\n")
	if _, err := e.push("t2", e.bundle("other", "^"+e.main)); err != nil {
		t.Fatal(err)
	}
	fetch := func(also ...string) ([]byte, []string, error) {
		var out bytes.Buffer
		err := e.svc.WriteReviewBundle(context.Background(), testBusiness, testProject, "t1", e.main, also, func(string) error { return nil }, &out)
		if err != nil {
			return nil, nil, err
		}
		h, err := bundle.ReadHeader(bufioReader(out.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		return out.Bytes(), h.Prerequisites, nil
	}
	_, pre, err := fetch(c1)
	if err != nil || !slices.Contains(pre, c1) {
		t.Fatalf("with the earlier push: prerequisites %v, %v; want %s among them", pre, err, c1)
	}
	withOther, pre, err := fetch(other)
	if err != nil || slices.Contains(pre, other) {
		t.Fatalf("another task's commit: prerequisites %v, %v", pre, err)
	}
	withNone, _, err := fetch("1111111111111111111111111111111111111111")
	if err != nil || !bytes.Equal(withOther, withNone) {
		t.Fatalf("another task's commit and one naming nothing give different bundles (%v)", err)
	}
	if _, pre, err = fetch(c2); err != nil || slices.Contains(pre, c2) {
		t.Fatalf("the latest push as also-have: prerequisites %v, %v", pre, err)
	}
	many := make([]string, MaxAlsoHave+1)
	for i := range many {
		many[i] = c1
	}
	if _, _, err := fetch(many...); errdefs.Of(err).Reason != errdefs.ObjectIDInvalid {
		t.Errorf("%d also-haves: %v, want %s", len(many), err, errdefs.ObjectIDInvalid)
	}
	if _, _, err := fetch("HEAD"); errdefs.Of(err).Reason != errdefs.ObjectIDInvalid {
		t.Errorf("an also-have that is not an object id: %v", err)
	}
}

// TestMainBundleHave: fetch-main's have. The same as main: the commit and
// no bundle. An older main: a bundle of what main gained since. Unknown
// here: the whole bundle, as without a have.
func TestMainBundleHave(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	fetch := func(have string) (string, []string) {
		t.Helper()
		var out bytes.Buffer
		commit := ""
		if err := e.svc.WriteMainBundle(ctx, testBusiness, testProject, have, func(c string) error { commit = c; return nil }, &out); err != nil {
			t.Fatal(err)
		}
		if out.Len() == 0 {
			return commit, nil
		}
		h, err := bundle.ReadHeader(bufioReader(out.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		return commit, append([]string{"bundle"}, h.Prerequisites...)
	}
	old := e.main
	if c, b := fetch(old); c != old || b != nil {
		t.Fatalf("have = main: commit %s, bundle %v; want %s and no bundle", c, b, old)
	}
	os.WriteFile(filepath.Join(e.root, "more.txt"), []byte("more\n"), 0o644)
	e.commitAll(e.root, "more")
	newMain, _, err := e.svc.SyncProject(ctx, testBusiness, testProject)
	if err != nil {
		t.Fatal(err)
	}
	if c, b := fetch(old); c != newMain || !slices.Equal(b, []string{"bundle", old}) {
		t.Errorf("have = the older main: commit %s, bundle %v; want %s, a bundle needing %s", c, b, newMain, old)
	}
	for _, have := range []string{"", "1111111111111111111111111111111111111111", "not an id"} {
		if c, b := fetch(have); c != newMain || !slices.Equal(b, []string{"bundle"}) {
			t.Errorf("have %q: commit %s, bundle %v; want the whole bundle", have, c, b)
		}
	}
}

// TestAlsoHavePastTheWalk: a task whose history is longer than the walk's
// bound still gets a thin bundle against its earlier push. The walk used to
// start from the also-have, down the task's whole history, and gave up on
// any history over alsoHaveWalk commits: every fetch then sent it all.
func TestAlsoHavePastTheWalk(t *testing.T) {
	e := newEnv(t)
	var last string
	for i := 0; i <= alsoHaveWalk+5; i++ {
		last = e.commitFile("a.txt", fmt.Sprintf("change %d\n", i))
	}
	if _, err := e.push("t1", e.bundle("work", "^"+e.main)); err != nil {
		t.Fatal(err)
	}
	e.commitFile("a.txt", "one more\n")
	if _, err := e.push("t1", e.bundle("work", "^"+last)); err != nil {
		t.Fatal(err)
	}
	for _, have := range []string{"", e.main} {
		var out bytes.Buffer
		err := e.svc.WriteReviewBundle(context.Background(), testBusiness, testProject, "t1", have, []string{last}, func(string) error { return nil }, &out)
		if err != nil {
			t.Fatal(err)
		}
		h, err := bundle.ReadHeader(bufioReader(out.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(h.Prerequisites, last) {
			t.Fatalf("have %q, also-have the earlier push: prerequisites %v, want %s among them", have, h.Prerequisites, last)
		}
	}
}
