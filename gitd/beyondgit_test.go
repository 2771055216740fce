package gitd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing"

	"github.com/bushost/bushost/internal/errdefs"
)

// The tree rules in Go, including those git 2.39 under bundle.StrictFlag
// refuses first (so the integration test sees git's id for them): the
// walk must hold whichever git the host runs.
func TestBeyondGitTreeRules(t *testing.T) {
	id := plumbing.NewHash("1111111111111111111111111111111111111111")
	for _, tc := range []struct {
		mode, name string
		want       errdefs.Reason
	}{
		{"120000", ".gitattributes", errdefs.DotfileSymlink},
		{"120000", ".GITIGNORE", errdefs.DotfileSymlink},
		{"120000", ".gitignore . .", errdefs.DotfileSymlink},
		{"120000", ".mailmap:$DATA", errdefs.DotfileSymlink},
		{"120000", "GITATT~2", errdefs.DotfileSymlink},
		{"120000", "gi7d29~1", errdefs.DotfileSymlink},
		{"120000", "GI250A~9", errdefs.DotfileSymlink},
		{"120000", "maba30~4", errdefs.DotfileSymlink},
		{"120000", ".git\u200dattributes", errdefs.DotfileSymlink},
		{"120000", "\ufeff.MailMap", errdefs.DotfileSymlink},
		{"160000", ".gitmodules", errdefs.GitmodulesGitlink},
		{"160000", "GITMOD~1", errdefs.GitmodulesGitlink},
		{"100664", "f", errdefs.TreeEntryMode},
		{"040000", "d", errdefs.TreeEntryMode},
		{"100644", strings.Repeat("x", 4097), errdefs.TreeEntryNameTooLong},
		// Benign.
		{"120000", ".\u0147itignore", ""},
		{"120000", ".gitattributes2", ""},
		{"120000", "gitattributes", ""},
		{"120000", "gi7d29~0", ""},
		{"100644", ".gitattributes", ""},
		{"100644", ".\u0147it", ""},
		{"100644", strings.Repeat("x", 4096), ""},
		{"40000", "d", ""},
		{"160000", "sub", ""},
	} {
		err := checkEntry(id, tc.mode, []byte(tc.name), id, map[plumbing.Hash]plumbing.Hash{})
		if got := errdefs.ReasonOf(err); got != tc.want {
			t.Errorf("%s %q: %q (%v), want %q", tc.mode, tc.name, got, err, tc.want)
		}
	}
	for r, rule := range beyondRules {
		if rule.Reason != r || rule.Source == "" || rule.What == "" {
			t.Errorf("rule %s: %+v", r, rule)
		}
	}
}

// The .gitmodules rules, parsed as git parses.
func TestBeyondGitGitmodulesRules(t *testing.T) {
	id := plumbing.NewHash("2222222222222222222222222222222222222222")
	for _, tc := range []struct {
		name, in string
		want     errdefs.Reason
	}{
		{"CR in a quoted path", "[submodule \"s\"]\n\tpath = \"s\r\"\n", errdefs.GitmodulesControlChar},
		{"tab in a name", "[submodule \"a\tb\"]\n\tpath = ab\n", errdefs.GitmodulesControlChar},
		{"escaped newline in a path", "[submodule \"s\"]\n\tpath = \"s\\n\"\n", errdefs.GitmodulesControlChar},
		{"nested names", "[submodule \"A\"]\npath=a\n[submodule \"a/hooks\"]\npath=b\n", errdefs.SubmoduleNameNested},
		{".. in a path", "[submodule \"s\"]\n\tpath = a\\\\..\\\\b\n", errdefs.SubmodulePathEscapes},
		{".. in a name", "[submodule \"../s\"]\n\tpath = s\n", errdefs.SubmodulePathEscapes},
		{"trailing dot", "[submodule \"s\"]\n\tpath = a./s\n", errdefs.SubmodulePathTrailing},
		{"trailing space, quoted", "[submodule \"s\"]\n\tpath = \"s \"\n", errdefs.SubmodulePathTrailing},
		{"port not a number", "[submodule \"s\"]\n\turl = ssh://git@host:22x/r\n", errdefs.GitmodulesURL},
		{"IPv6 port not a number", "[submodule \"s\"]\n\turl = https://[::1]:http/r\n", errdefs.GitmodulesURL},
		{"newline in a URL", "[submodule \"s\"]\n\turl = \"https://h/r\\n\"\n", errdefs.GitmodulesURL},
		{"encoded newline in a URL", "[submodule \"s\"]\n\turl = https://h/%0Ar\n", errdefs.GitmodulesURL},
		{"unterminated section", "[submodule \"s\"\n\tpath = s\n", errdefs.GitmodulesParse},
		{"unterminated quote", "[submodule \"s\"]\n\tpath = \"s\n", errdefs.GitmodulesParse},
		{"bad escape", "[submodule \"s\"]\n\tpath = s\\q\n", errdefs.GitmodulesParse},
		{"variable outside a section", "path = s\n", errdefs.GitmodulesParse},
		// Benign.
		{"CRLF lines", "[submodule \"s\"]\r\n\tpath = s\r\n\turl = ./-upstream\r\n", ""},
		{"trailing CR, unquoted", "[submodule \"s\"]\n\tpath = s\r\n", ""},
		{"comments and continuation", "# c\n[submodule \"s\"] ; c\n\tpath = a\\\n/b # c\n\turl = https://h:8080/r\n", ""},
		{"old section form", "[submodule.s]\n\tpath = s\n", ""},
		{"siblings", "[submodule \"a\"]\npath=a\n[submodule \"ab\"]\npath=ab\n", ""},
		{"scp-like URL", "[submodule \"s\"]\n\turl = git@host:r.git\n", ""},
		{"IPv6 with a port", "[submodule \"s\"]\n\turl = https://[::1]:8443/r\n", ""},
	} {
		var err error
		subs, perr := parseGitmodules([]byte(tc.in))
		if perr != nil {
			err = refuseBeyond(errdefs.GitmodulesParse, id, "%v", perr)
		} else {
			err = checkSubmodules(id, subs)
		}
		if got := errdefs.ReasonOf(err); got != tc.want {
			t.Errorf("%s: %q (%v), want %q", tc.name, got, err, tc.want)
		}
	}
	subs, err := parseGitmodules([]byte("[submodule \"s\"]\n\tpath = \"a b\"  c  ; x\n"))
	if err != nil || len(subs) != 1 || len(subs[0].path) != 1 || subs[0].path[0] != "a b  c" {
		t.Fatalf("values as git reads them: %+v %v", subs, err)
	}
}

// TestObjectsBefore: the walk's "was it here before the push" answers from
// the packs there were when the push came. A pack moved in afterwards (the
// push's own) is not counted, nor is one a repack made by rolling packs
// together, which may hold the push's objects too: an object there counts
// as new, so a refusal stands. Loose objects count as they are.
func TestObjectsBefore(t *testing.T) {
	repo := filepath.Join(t.TempDir(), "r.git")
	git := bareGit(t, repo)
	objects := filepath.Join(repo, "objects")
	// Each object is named by a ref, so that repack packs it.
	object := func(name, body string) string {
		id := git(body, "hash-object", "-w", "--stdin")
		git("", "update-ref", "refs/t/"+name, id)
		return id
	}
	packed := object("packed", "packed before\n")
	git("", "repack", "-q", "-a", "-d")
	loose := object("loose", "loose before\n")
	has := objectsBefore([]string{objects})
	if !has(plumbing.NewHash(packed)) || !has(plumbing.NewHash(loose)) {
		t.Fatal("an object there before the push is not counted")
	}
	// The push's pack moves in.
	pushed := object("pushed", "the push's\n")
	git("", "repack", "-q", "-d")
	if _, err := os.Stat(filepath.Join(objects, pushed[:2], pushed[2:])); err == nil {
		t.Fatal("the push's object is still loose")
	}
	if has(plumbing.NewHash(pushed)) {
		t.Error("the push's own pack counts as there before")
	}
	// Housekeeping rolls every pack into one.
	git("", "repack", "-q", "-a", "-d")
	if has(plumbing.NewHash(pushed)) {
		t.Error("the push's object counts as there before once repacked")
	}
	if has(plumbing.NewHash(packed)) {
		t.Error("an object in a pack made after the push came counts as there before")
	}
}
