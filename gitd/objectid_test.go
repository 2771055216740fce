package gitd

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/treesnap"
)

// An object id in upper or mixed case is no id anywhere (gitid): each
// entry of the service that takes one refuses it, or answers it as it
// answers an id of nothing, and a refused push leaves nothing behind.
func TestObjectIDCase(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	commit := e.commitFile("a.txt", "one\n")
	spellings := map[string]func(string) string{
		"upper": strings.ToUpper,
		"mixed": func(s string) string { return strings.ToUpper(s[:20]) + s[20:] },
	}
	// reason "": the bundle's own refusal of a malformed header.
	refused := func(t *testing.T, b []byte, reason errdefs.Reason) {
		t.Helper()
		before := e.snapshot()
		recs := len(e.auth.recorded())
		_, err := e.push("t1", b)
		var fe *bundle.FormatError
		if reason == "" && !errors.As(err, &fe) || reason != "" && errdefs.ReasonOf(err) != reason {
			t.Fatalf("push: %v, want %s", err, cmp.Or(reason, "a malformed bundle"))
		}
		if d := treesnap.Diff(before, e.snapshot()); d != "" {
			t.Fatalf("store changed by a refused push:\n%s", d)
		}
		if len(e.auth.recorded()) != recs {
			t.Fatal("refused push was recorded")
		}
	}
	tree := e.run(e.work, "rev-parse", nil, "--", commit+"^{tree}")
	objects := strings.Fields(e.run(e.work, "rev-list", nil, "--objects", "--no-object-names", "--", commit, "^"+e.main))
	for name, spell := range spellings {
		t.Run(name, func(t *testing.T) {
			// The bundle's header: its ref, its prerequisite.
			b := e.handBundle(commit, objects...)
			refused(t, bytes.Replace(b, []byte(commit+" refs/"), []byte(spell(commit)+" refs/"), 1), "")
			refused(t, bytes.Replace(b, []byte("-"+e.main), []byte("-"+spell(e.main)), 1), "")
			// A commit's tree and parent lines, which git reads in
			// either case (git fsck --strict takes them).
			for _, line := range []string{"tree", "parent"} {
				tr, parent := tree, e.main
				if line == "tree" {
					tr = spell(tree)
				} else {
					parent = spell(parent)
				}
				c := e.rawObject("commit", fmt.Appendf(nil, "tree %s\nparent %s\nauthor %s\ncommitter %s\n\n%s\n", tr, parent, goodAuthor, goodAuthor, line))
				refused(t, e.handBundle(c, append([]string{c}, objects[1:]...)...), errdefs.ObjectIDInvalid)
			}
		})
	}
	if _, err := e.push("t1", e.bundle("HEAD", "^main")); err != nil {
		t.Fatal(err)
	}
	e.fsck()
	// A fetch's have and also-haves.
	for name, spell := range spellings {
		var out bytes.Buffer
		nop := func(string) error { return nil }
		if err := e.svc.WriteReviewBundle(ctx, testBusiness, testProject, "t1", spell(e.main), nil, nop, &out); errdefs.ReasonOf(err) != errdefs.ObjectIDInvalid {
			t.Errorf("%s have: %v, want %s", name, err, errdefs.ObjectIDInvalid)
		}
		if err := e.svc.WriteReviewBundle(ctx, testBusiness, testProject, "t1", "", []string{spell(e.main)}, nop, &out); errdefs.ReasonOf(err) != errdefs.ObjectIDInvalid {
			t.Errorf("%s also-have: %v, want %s", name, err, errdefs.ObjectIDInvalid)
		}
		// main's have is advice: one that names nothing the host knows
		// gets main whole, and so does one in upper case.
		var whole, got bytes.Buffer
		if err := e.svc.WriteMainBundle(ctx, testBusiness, testProject, "", nop, &whole); err != nil {
			t.Fatal(err)
		}
		if err := e.svc.WriteMainBundle(ctx, testBusiness, testProject, spell(e.main), nop, &got); err != nil || !bytes.Equal(got.Bytes(), whole.Bytes()) {
			t.Errorf("%s main have: %v, %d bytes, want main whole (%d bytes)", name, err, got.Len(), whole.Len())
		}
	}
}
