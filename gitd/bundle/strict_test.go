package bundle

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/gitcmd"
)

// Pins what StrictFlag makes git 2.39 refuse: a symlinked .gitattributes
// passes plain --strict (the id is info-level there, and git 2.39's
// documentation does not list gitattributesSymlink), and is refused with
// that id under StrictFlag. If a git update changes either, this says so.
func TestStrictFlagRefusesWhatPlainStrictTakes(t *testing.T) {
	ctx := context.Background()
	g, err := gitcmd.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(t.TempDir(), "r.git")
	run := func(c gitcmd.Cmd) string {
		t.Helper()
		out, err := g.Output(ctx, c, 16<<20)
		if err != nil {
			t.Fatalf("git %s: %v", c.Sub, err)
		}
		return strings.TrimSpace(string(out))
	}
	run(gitcmd.Cmd{Sub: "init", Flags: []string{"--quiet", "--bare"}, Args: []string{repo}})
	blob := run(gitcmd.Cmd{GitDir: repo, Sub: "hash-object", Flags: []string{"-w", "--stdin"}, Stdin: strings.NewReader("target\n")})
	for _, tc := range []struct{ entry, id string }{
		{"120000 blob " + blob + "\t.gitattributes", "gitattributesSymlink"},
		{"120000 blob " + blob + "\t.gitignore", "gitignoreSymlink"},
		{"120000 blob " + blob + "\t.mailmap", "mailmapSymlink"},
		{"100664 blob " + blob + "\tf", "badFilemode"},
	} {
		tree := run(gitcmd.Cmd{GitDir: repo, Sub: "mktree", Stdin: strings.NewReader(tc.entry + "\n")})
		var pack bytes.Buffer
		if err := g.Run(ctx, gitcmd.Cmd{GitDir: repo, Sub: "pack-objects", Flags: []string{"--stdout", "-q", "--revs"}, Stdin: strings.NewReader(tree + "\n"), Stdout: &pack}); err != nil {
			t.Fatal(err)
		}
		for _, flag := range []string{"--strict", StrictFlag} {
			q, err := NewQuarantine(filepath.Join(repo, "objects"))
			if err != nil {
				t.Fatal(err)
			}
			out, err := g.Output(ctx, gitcmd.Cmd{GitDir: repo, Sub: "index-pack", Flags: []string{"--stdin", flag, "--fix-thin"}, Env: q.Env(), Stdin: bytes.NewReader(pack.Bytes())}, 16<<20)
			q.Remove()
			var fe *FsckError
			switch {
			case flag == "--strict" && err != nil:
				t.Fatalf("%s: plain --strict refused it (%v): StrictFlag may no longer be needed for %s", tc.id, classify(err), tc.id)
			case flag == StrictFlag && !(errors.As(classify(err), &fe) && fe.ID == tc.id):
				t.Fatalf("%s: under %s: %v (output %q)", tc.id, StrictFlag, classify(err), out)
			}
		}
	}
}
