package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/treesnap"
)

// pushRPC sends bundle as a push over git.sock and returns the refusal as
// the client reads it (nil if accepted).
func pushRPC(t *testing.T, h *Host, tokenFile string, bundle []byte) *errdefs.Error {
	t.Helper()
	conn, ctx := dialHome(t, h.Home, "git.sock", strings.TrimSpace(readText(t, tokenFile)))
	stream, err := gitv1.NewGitServiceClient(conn).PushWorking(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{Size: int64(len(bundle))}}}); err != nil {
		t.Fatal(err)
	}
	for len(bundle) > 0 {
		n := min(len(bundle), 1<<20)
		if err := stream.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: bundle[:n]}}); err != nil {
			break // the server ended the call; its status says why
		}
		bundle = bundle[n:]
	}
	_, err = stream.CloseAndRecv()
	return grpcerr.FromStatus(err)
}

// beyondWorld is a task with one accepted push that each case builds on.
type beyondWorld struct {
	*gitWorld
	base string // the task's latest push
	n    int
}

func (b *beyondWorld) blob(t *testing.T, content string) string {
	t.Helper()
	return testGitIn(t, b.work, content, "hash-object", "-w", "--stdin")
}

// commit makes a commit on b.base whose tree is entries (mktree lines,
// "MODE TYPE ID\tNAME") and returns a bundle of it.
func (b *beyondWorld) commit(t *testing.T, entries ...string) string {
	t.Helper()
	tree := testGitIn(t, b.work, strings.Join(entries, "\n")+"\n", "mktree")
	c := testGit(t, b.work, "commit-tree", "-p", b.base, "-m", "case", tree)
	return b.bundle(t, c)
}

func (b *beyondWorld) bundle(t *testing.T, c string) string {
	t.Helper()
	b.n++
	ref := fmt.Sprintf("refs/tags/case%d", b.n) // a tag ref: it may name a tag object
	testGit(t, b.work, "update-ref", ref, c)
	return bundleFile(t, b.work, filepath.Dir(b.h.Home), fmt.Sprintf("case%d", b.n), ref, "^"+b.base)
}

func gitmodules(t *testing.T, b *beyondWorld, content string) string {
	return "100644 blob " + b.blob(t, content) + "\t.gitmodules"
}

// Every rule of gitd/beyondgit.go refuses its push with its reason (or,
// where git 2.39 under bundle.StrictFlag refuses first, with git's message
// id), naming the object, and leaves the store as it was.
func TestBeyondGitRefusals(t *testing.T) {
	w := newGitWorld(t, hostOpts{})
	w.commit(t, "a.txt", "one\n")
	b := &beyondWorld{gitWorld: w, base: w.as(t, w.worker, "push-working", "--repo", w.work)}
	target := b.blob(t, "../../outside\n")
	sub := b.base // any commit id serves as a gitlink's target

	cases := []struct {
		name string
		// want is the reason, or git's fsck message id where git refuses first.
		want string
		make func(t *testing.T) string
	}{
		{"CR in a submodule path (CVE-2025-48384)", "GITMODULES_CONTROL_CHAR", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"sub\"]\n\tpath = \"sub\r\"\n\turl = https://example.com/sub\n"),
				"120000 blob "+target+"\tsub")
		}},
		{"control character in a submodule name", "GITMODULES_CONTROL_CHAR", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"a\x01b\"]\n\tpath = ab\n\turl = https://example.com/sub\n"))
		}},
		{".gitattributes symlink", "gitattributesSymlink", func(t *testing.T) string {
			return b.commit(t, "120000 blob "+target+"\t.gitattributes")
		}},
		{".gitignore symlink, NTFS case and trailing dots", "gitignoreSymlink", func(t *testing.T) string {
			return b.commit(t, "120000 blob "+target+"\t.GitIgnore..")
		}},
		{".mailmap symlink, NTFS stream", "mailmapSymlink", func(t *testing.T) string {
			return b.commit(t, "120000 blob "+target+"\t.mailmap:x")
		}},
		{".gitattributes symlink, NTFS short name", "gitattributesSymlink", func(t *testing.T) string {
			return b.commit(t, "120000 blob "+target+"\tGITATT~1")
		}},
		{".gitattributes symlink, NTFS fall-back short name", "gitattributesSymlink", func(t *testing.T) string {
			return b.commit(t, "120000 blob "+target+"\tgi7d29~9")
		}},
		{".gitignore symlink, HFS+ ignorable code point", "gitignoreSymlink", func(t *testing.T) string {
			return b.commit(t, "120000 blob "+target+"\t.git\u200cignore")
		}},
		{"nested submodule names", "SUBMODULE_NAME_NESTED", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"a\"]\n\tpath = a\n\turl = ./a\n[submodule \"a/hooks\"]\n\tpath = b\n\turl = ./b\n"))
		}},
		{"submodule path with ..", "SUBMODULE_PATH_ESCAPES", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"s\"]\n\tpath = x/../../y\n\turl = ./s\n"))
		}},
		{"submodule name with ..", "gitmodulesName", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"../s\"]\n\tpath = s\n\turl = ./s\n"))
		}},
		{"submodule path with a trailing dot", "SUBMODULE_PATH_TRAILING", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"s\"]\n\tpath = s.\n\turl = ./s\n"))
		}},
		{"submodule path with a trailing space", "SUBMODULE_PATH_TRAILING", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"s\"]\n\tpath = \"dir /s\"\n\turl = ./s\n"))
		}},
		{"entry name over 4096 bytes", "TREE_ENTRY_NAME_TOO_LONG", func(t *testing.T) string {
			return b.commit(t, "100644 blob "+target+"\t"+strings.Repeat("n", 4097))
		}},
		{"mode 100664", "badFilemode", func(t *testing.T) string {
			return b.commit(t, "100664 blob "+target+"\tf")
		}},
		{"unparseable .gitmodules", "gitmodulesParse", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"s\"\n\tpath = s\n"))
		}},
		{"submodule URL port not a number", "GITMODULES_URL", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"s\"]\n\tpath = s\n\turl = https://example.com:x1/s\n"))
		}},
		{"submodule URL with a newline", "gitmodulesUrl", func(t *testing.T) string {
			return b.commit(t, gitmodules(t, b, "[submodule \"s\"]\n\tpath = s\n\turl = https://example.com/s%0aevil\n"))
		}},
		{"gitlink named .gitmodules", "gitmodulesBlob", func(t *testing.T) string {
			return b.commit(t, "160000 commit "+sub+"\t.gitmodules")
		}},
		{"trailing bytes after the pack", "PACK_TRAILING_BYTES", func(t *testing.T) string {
			c := testGit(t, w.work, "commit-tree", "-p", b.base, "-m", "junk", testGit(t, w.work, "rev-parse", b.base+"^{tree}"))
			f := b.bundle(t, c)
			fh, err := os.OpenFile(f, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			fh.WriteString("junk after the pack")
			fh.Close()
			return f
		}},
		{"bundle ref naming a tag", "BUNDLE_REF_NOT_COMMIT", func(t *testing.T) string {
			c := testGit(t, w.work, "commit-tree", "-p", b.base, "-m", "tagged", testGit(t, w.work, "rev-parse", b.base+"^{tree}"))
			tag := testGitIn(t, w.work, fmt.Sprintf("object %s\ntype commit\ntag v1\ntagger A <a@b> 1 +0000\n\nv1\n", c), "hash-object", "-t", "tag", "-w", "--stdin")
			return b.bundle(t, tag)
		}},
		{"bundle ref naming a tree", "BUNDLE_REF_NOT_COMMIT", func(t *testing.T) string {
			tree := testGitIn(t, w.work, "100644 blob "+target+"\tt\n", "mktree")
			b.n++
			f := filepath.Join(filepath.Dir(w.h.Home), fmt.Sprintf("case%d.bundle", b.n))
			pack := testGitPack(t, w.work, tree)
			if err := os.WriteFile(f, append([]byte(fmt.Sprintf("# v2 git bundle\n%s refs/heads/tree\n\n", tree)), pack...), 0o644); err != nil {
				t.Fatal(err)
			}
			return f
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.make(t)
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			before := storeSnapshot(t, w.h)
			e := pushRPC(t, w.h, w.worker, data)
			if e == nil {
				t.Fatalf("accepted")
			}
			if string(e.Reason) != tc.want && !strings.Contains(e.Message, tc.want+":") {
				t.Fatalf("refused with %s %q: %s; want %s", e.Kind, e.Reason, e.Message, tc.want)
			}
			if e.Kind.String() != "InvalidArgument" {
				t.Fatalf("code %s, want InvalidArgument: %s", e.Kind, e.Message)
			}
			if d := treesnap.Diff(before, storeSnapshot(t, w.h)); d != "" {
				t.Fatalf("store changed:\n%s", d)
			}
		})
	}
}

// testGitPack is a pack of the objects reachable from rev (a tree too).
func testGitPack(t *testing.T, repo, rev string) []byte {
	t.Helper()
	return []byte(testGitInRaw(t, repo, rev+"\n", "pack-objects", "--stdout", "-q", "--revs"))
}

// What git and the walk must still take: an email without @, a commit with
// two signatures, a name like .Ňit, a submodule URL ./-upstream.
func TestBeyondGitBenign(t *testing.T) {
	w := newGitWorld(t, hostOpts{})
	w.commit(t, "a.txt", "one\n")
	b := &beyondWorld{gitWorld: w, base: w.as(t, w.worker, "push-working", "--repo", w.work)}
	file := b.blob(t, "content\n")
	tree := testGit(t, w.work, "rev-parse", b.base+"^{tree}")
	cases := []struct {
		name string
		make func(t *testing.T) string // returns the commit to push
	}{
		{"email without @", func(t *testing.T) string {
			return testGitIn(t, w.work, fmt.Sprintf("tree %s\nparent %s\nauthor A <nobody> 1 +0000\ncommitter A <nobody> 1 +0000\n\nno at\n", tree, b.base),
				"hash-object", "-t", "commit", "-w", "--stdin")
		}},
		{"two signatures", func(t *testing.T) string {
			sig := func(h string) string {
				return h + " -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n"
			}
			return testGitIn(t, w.work, fmt.Sprintf("tree %s\nparent %s\nauthor A <a@b> 1 +0000\ncommitter A <a@b> 1 +0000\n%s%s\nsigned twice\n",
				tree, b.base, sig("gpgsig"), sig("gpgsig-sha256")), "hash-object", "-t", "commit", "-w", "--stdin")
		}},
		{"a name like .\u0147it", func(t *testing.T) string {
			tr := testGitIn(t, w.work, "100644 blob "+file+"\t.\u0147it\n120000 blob "+file+"\t.\u0147itignore\n", "mktree")
			return testGit(t, w.work, "commit-tree", "-p", b.base, "-m", "N caron", tr)
		}},
		{"submodule URL ./-upstream", func(t *testing.T) string {
			tr := testGitIn(t, w.work, gitmodules(t, b, "[submodule \"up\"]\r\n\tpath = up\r\n\turl = ./-upstream\r\n")+"\n160000 commit "+b.base+"\tup\n", "mktree")
			return testGit(t, w.work, "commit-tree", "-p", b.base, "-m", "submodule", tr)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.make(t)
			f := b.bundle(t, c)
			got := w.as(t, w.worker, "push-working", "--bundle", f)
			if got != c {
				t.Fatalf("pushed %s, want %s", got, c)
			}
			b.base = c
		})
	}
}

// testGitInRaw is testGitIn without trimming (binary output).
func testGitInRaw(t testing.TB, dir, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(cleanEnv(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}
