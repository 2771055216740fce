package integration

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestPushWorkingAgainstGit is a differential test of push-working
// against git itself. A seeded generator builds, on one worker's
// repository, case after case: commits of trees with sub-directories,
// symbolic links, executable files and gitlinks; a storage layout (loose,
// `git gc`, `git repack`, packed-refs); HEAD detached or on a branch
// whose name has slashes; an index of version 2, 3 or 4; ignore rules
// (nested .gitignore files, .git/info/exclude, negations, `dir/**`,
// `[!x]`, `[[:upper:]]`, trailing-slash rules, escaped characters); and a
// work-tree state (clean, modified, staged, deleted, untracked, ignored,
// files named HEAD, objects/ and refs/ at the top). Each case is pushed
// to one task, a fast-forward of the last, and must hold what git says:
// the push is accepted, its work ref is `git rev-parse HEAD`, and the
// uncommitted changes it warns of are as many as `git status` lists (none
// for a clean tree).
//
// The fixed cases come first, one per fault the generator found in the
// client's in-process reading of the repository (issue 36): the ignore
// cases on a tree of plain files, each with one untracked file only, the
// one git and go-git's matcher disagree on; then
// pushdiffCases() random ones (seed printed on failure: rerun one with
// BUSHOST_PUSHDIFF_SEED).
func TestPushWorkingAgainstGit(t *testing.T) {
	// The daemon without -race: what is under test is the client (built
	// with -race) against git, and the race runtime would make each case
	// cost several times the CPU.
	w := newGitWorld(t, hostOpts{Plain: true})
	d := &diffRepo{t: t, w: w, home: t.TempDir()}
	fixed := []struct {
		name string
		make func(d *diffRepo)
	}{
		// git's wildmatch: dir/** matches what is in dir, not dir itself.
		{"ignore-dir-starstar", func(d *diffRepo) {
			d.git("rm", "-r", "-q", "--ignore-unmatch", "--", "dir")
			os.RemoveAll(filepath.Join(d.w.work, "dir"))
			d.write(".gitignore", "dir/**\n")
			d.commitAll()
			d.write("dir", "a file named dir\n")
		}},
		// [!x] is "any but x", not a class of '!' and 'x'.
		{"ignore-negated-class", func(d *diffRepo) {
			d.write(".gitignore", "f[!x]\n")
			d.commitAll()
			d.write("fx", "untracked\n")
		}},
		// [[:upper:]] is one upper-case letter.
		{"ignore-upper-class", func(d *diffRepo) {
			d.write(".gitignore", "[[:upper:]]\n")
			d.commitAll()
			d.write("u]", "untracked\n")
		}},
		// The work tree's top holds files named HEAD, objects/ and refs/
		// (HEAD naming HEAD's parent): a reader that takes the top for a
		// git directory pushes the parent.
		{"top-named-like-a-git-dir", func(d *diffRepo) {
			d.commitRandom(2)
			parent := d.git("rev-parse", "HEAD~1")
			d.write("HEAD", parent+"\n")
			d.write("objects/info/packs", "\n")
			d.write("refs/heads/"+d.branch(), parent+"\n")
		}},
		// A blob whose id is that of the gitlink the parent commit had at
		// the same path must still be sent.
		{"blob-with-a-gitlinks-id", func(d *diffRepo) {
			d.write("gl", "gitlink and blob\n")
			id := d.git("hash-object", "gl")
			os.Remove(filepath.Join(d.w.work, "gl"))
			d.git("update-index", "--add", "--cacheinfo", "160000,"+id+",gl")
			d.git("commit", "-q", "-m", "gitlink")
			d.git("update-index", "--force-remove", "gl")
			d.write("gl", "gitlink and blob\n")
			d.commitAll()
		}},
	}
	for _, fc := range fixed {
		d.reset()
		d.rng = rand.New(rand.NewPCG(0, uint64(len(fc.name))))
		fc.make(d)
		d.check(fc.name)
	}
	seeds := pushdiffCases()
	if s := os.Getenv("BUSHOST_PUSHDIFF_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("BUSHOST_PUSHDIFF_SEED=%q: %v", s, err)
		}
		seeds = []uint64{n}
	}
	for _, seed := range seeds {
		d.reset()
		d.rng = rand.New(rand.NewPCG(seed, 36))
		d.randomCase()
		d.check(fmt.Sprintf("seed %d", seed))
	}
	t.Logf("%d fixed and %d generated cases, %d failed", len(fixed), len(seeds), d.failed)
	w.h.FsckProject(t, w.business, w.project)
}

// pushdiffCases are the random cases' seeds: 60 in the suite (a case
// costs about 0.8 s of CPU, most of it git's and the daemon's), 30 with
// -short, 2,000 under `make soak` (BUSHOST_SOAK=1).
func pushdiffCases() []uint64 {
	n := 200
	if testing.Short() {
		n = 30
	}
	if os.Getenv("BUSHOST_SOAK") != "" {
		n = 2000
	}
	s := make([]uint64, n)
	for i := range s {
		s[i] = uint64(i + 1)
	}
	return s
}

// diffRepo is the worker's repository the cases are made in.
type diffRepo struct {
	t      *testing.T
	w      *gitWorld
	home   string // HOME for git: no user's excludes or config
	rng    *rand.Rand
	n      int // files written, for unique content
	failed int
}

// git runs git in the work tree and returns its output trimmed.
func (d *diffRepo) git(args ...string) string {
	d.t.Helper()
	out, err := d.gitErr(args...)
	if err != nil {
		d.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

func (d *diffRepo) gitErr(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = d.w.work
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "HOME=" + d.home,
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=tester", "GIT_AUTHOR_EMAIL=tester@localhost",
		"GIT_COMMITTER_NAME=tester", "GIT_COMMITTER_EMAIL=tester@localhost"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (d *diffRepo) write(name, body string) {
	d.t.Helper()
	p := filepath.Join(d.w.work, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		d.t.Fatal(err)
	}
}

// branch is the branch HEAD names, "" when detached.
func (d *diffRepo) branch() string {
	out, err := d.gitErr("symbolic-ref", "-q", "--short", "HEAD")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// reset leaves the work tree as HEAD has it, nothing untracked or
// ignored, the index rewritten at version 2.
func (d *diffRepo) reset() {
	d.git("reset", "-q", "--hard")
	d.git("clean", "-q", "-f", "-f", "-d", "-x")
	d.git("update-index", "--index-version", "2")
	os.Remove(filepath.Join(d.w.work, ".git", "info", "exclude"))
}

func (d *diffRepo) commitAll() {
	d.git("add", "-A")
	d.git("commit", "-q", "--allow-empty", "-m", fmt.Sprintf("case %d", d.n))
}

// check pushes HEAD and compares what push-working did and said with
// what git says of the repository.
func (d *diffRepo) check(name string) {
	t := d.t
	t.Helper()
	head := d.git("rev-parse", "HEAD")
	status, err := d.gitErr("status", "--porcelain", "-z", "--no-renames")
	if err != nil {
		t.Fatalf("%s: git status: %v\n%s", name, err, status)
	}
	changes := strings.Count(status, "\x00")
	out, errs, code := d.w.h.Run(t, nil, "--token-file", d.w.worker, "push-working", "--repo", d.w.work)
	fail := func(format string, args ...any) {
		t.Helper()
		d.failed++
		t.Errorf("%s: "+format+"\ngit status:\n%s\nlayout: %s", append([]any{name}, append(args, strings.ReplaceAll(status, "\x00", "\n"), d.layout())...)...)
	}
	if code != 0 {
		fail("push refused (exit %d): %s", code, errs)
		return
	}
	if got := strings.TrimSpace(out); got != head {
		fail("push-working printed %q, HEAD is %s", got, head)
	}
	if got := d.w.ref(t, "refs/work/t1"); got != head {
		fail("refs/work/t1 is %s, HEAD is %s", got, head)
	}
	warned := 0
	if m := uncommittedWarning.FindStringSubmatch(errs); m != nil {
		warned, _ = strconv.Atoi(m[1])
	}
	if warned != changes {
		fail("warned of %d uncommitted change(s), git status lists %d (stderr %q)", warned, changes, errs)
	}
}

var uncommittedWarning = regexp.MustCompile(`has (\d+) uncommitted change`)

// layout describes the repository for a failure's message.
func (d *diffRepo) layout() string {
	var parts []string
	head, _ := os.ReadFile(filepath.Join(d.w.work, ".git", "HEAD"))
	parts = append(parts, "HEAD "+strings.TrimSpace(string(head)))
	if _, err := os.Stat(filepath.Join(d.w.work, ".git", "packed-refs")); err == nil {
		parts = append(parts, "packed-refs")
	}
	packs, _ := filepath.Glob(filepath.Join(d.w.work, ".git", "objects", "pack", "*.pack"))
	parts = append(parts, fmt.Sprintf("%d packs", len(packs)))
	if b, err := os.ReadFile(filepath.Join(d.w.work, ".git", "index")); err == nil && len(b) > 8 {
		parts = append(parts, fmt.Sprintf("index v%d", b[7]))
	}
	return strings.Join(parts, ", ")
}

// The generator's vocabulary. Directories and file names, gitlinks (sm*
// only: nothing else is written under them), ignore patterns and the
// names of untracked files that the patterns do or do not match.
var (
	diffDirs   = []string{"", "", "src", "src/lib", "docs", "a/b/c", "dir", "sub", "build"}
	diffNames  = []string{"f.txt", "main.go", "README", "x.log", "keep.log", "Up", "run.sh", "data.bin", "fa", "fx", "#hash", "!bang", "trail "}
	diffIgnore = []string{
		"*.log", "!keep.log", "build/", "dir/**", "f[!x]", "[[:upper:]]*", "[[:upper:]]", "\\#hash", "\\!bang",
		"a/**/b", "/rooted", "docs/*.txt", "trail\\ ", "**/deep", "*.[oa]", "x?y", "nested/", "sub/*", "!sub/keep",
		"out", "/out/", "*", "!*/", "!*.go", "[a-c]*", "**", "ignored/", "tmp*",
	}
	diffUntracked = []string{
		"x.log", "keep.log", "build/out", "build", "dir", "dir/in", "fa", "fx", "Up", "low", "u]", "#hash", "!bang",
		"a/b", "a/x/b", "rooted", "sub/rooted", "docs/r.txt", "docs/x/r.txt", "trail", "trail ", "deep", "q/deep",
		"m.o", "m.c", "xzy", "nested", "nested/f", "sub/keep", "sub/other", "out", "out/x", "ignored/y", "tmp1", "b.go",
	}
)

func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

// randomCase makes one generated case on top of the last.
func (d *diffRepo) randomCase() {
	r := d.rng
	// HEAD: a branch whose name may have slashes, or detached.
	switch r.IntN(4) {
	case 0:
		d.git("checkout", "-q", "--detach")
	case 1:
		d.git("checkout", "-q", "-B", fmt.Sprintf("work/%d/x", r.IntN(3)))
	case 2:
		d.git("checkout", "-q", "-B", "feature")
	}
	// Ignore rules committed, and .git/info/exclude.
	if r.IntN(2) == 0 {
		for range 1 + r.IntN(3) {
			dir := pick(r, diffDirs)
			var rules []string
			for range 1 + r.IntN(4) {
				rules = append(rules, pick(r, diffIgnore))
			}
			d.write(path.Join(dir, ".gitignore"), strings.Join(rules, "\n")+"\n")
		}
	}
	d.commitRandom(1 + r.IntN(3))
	if r.IntN(3) == 0 {
		d.write(".git/info/exclude", pick(r, diffIgnore)+"\n"+pick(r, diffIgnore)+"\n")
	}
	// The storage layout.
	switch r.IntN(6) {
	case 0:
		d.git("gc", "-q")
	case 1:
		d.git("repack", "-q", "-a", "-d")
	case 2:
		d.git("repack", "-q", "-d")
	case 3:
		d.git("pack-refs", "--all")
	}
	// The work tree's state; one case in three is left clean.
	if r.IntN(3) > 0 {
		d.dirty()
	}
	// The index's version (4 compresses paths; 3 carries intent-to-add).
	d.git("update-index", "--index-version", strconv.Itoa(2+r.IntN(3)))
}

// commitRandom makes n commits of random changes: files in
// sub-directories, executable files, symbolic links, gitlinks.
func (d *diffRepo) commitRandom(n int) {
	r := d.rng
	for range n {
		for range 1 + r.IntN(4) {
			d.n++
			name := path.Join(pick(r, diffDirs), pick(r, diffNames))
			p := filepath.Join(d.w.work, filepath.FromSlash(name))
			os.RemoveAll(p)
			switch r.IntN(6) {
			case 0:
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.Symlink(pick(r, []string{"f.txt", "../README", "/etc/passwd", "nowhere"}), p); err != nil {
					d.t.Fatal(err)
				}
			case 1:
				d.write(name, fmt.Sprintf("#!/bin/sh\necho %d\n", d.n))
				os.Chmod(p, 0o755)
			default:
				d.write(name, strings.Repeat(fmt.Sprintf("line %d\n", d.n), 1+r.IntN(50)))
			}
		}
		if r.IntN(4) == 0 { // a tracked file goes
			if files := strings.Fields(d.git("ls-files", "--", "*.txt")); len(files) > 0 {
				d.git("rm", "-q", "--", pick(r, files))
			}
		}
		d.git("add", "-A")
		if r.IntN(4) == 0 { // a gitlink, its directory empty as git leaves it
			gl := path.Join(pick(r, []string{"", "src", "a/b"}), fmt.Sprintf("sm%d", r.IntN(4)))
			if out, err := d.gitErr("ls-files", "--error-unmatch", "--", gl); err != nil || out == "" {
				id := d.git("rev-parse", "HEAD")
				if r.IntN(2) == 0 { // an id no object of this repository has
					id = fmt.Sprintf("%040x", r.Uint64())
				}
				os.RemoveAll(filepath.Join(d.w.work, filepath.FromSlash(gl)))
				d.git("update-index", "--add", "--cacheinfo", "160000,"+id+","+gl)
				os.MkdirAll(filepath.Join(d.w.work, filepath.FromSlash(gl)), 0o755)
			}
		}
		d.git("commit", "-q", "--allow-empty", "-m", fmt.Sprintf("case %d", d.n))
	}
}

// dirty changes the work tree as a worker leaves it before a push.
func (d *diffRepo) dirty() {
	r := d.rng
	files := strings.Split(d.git("ls-files", "-z"), "\x00")
	regular := files[:0:0]
	for _, f := range files {
		if fi, err := os.Lstat(filepath.Join(d.w.work, f)); err == nil && fi.Mode().IsRegular() {
			regular = append(regular, f)
		}
	}
	for range 1 + r.IntN(3) {
		switch r.IntN(7) {
		case 0: // modified
			if len(regular) > 0 {
				d.write(pick(r, regular), "modified\n")
			}
		case 1: // staged
			if len(regular) > 0 {
				f := pick(r, regular)
				d.write(f, "staged\n")
				d.git("add", "-f", "--", f)
			}
		case 2: // deleted
			if len(regular) > 0 {
				os.Remove(filepath.Join(d.w.work, pick(r, regular)))
			}
		case 3: // files named like a git directory's at the top
			d.write("HEAD", d.git("rev-parse", "HEAD~1")+"\n")
			d.write("objects/info/packs", "\n")
			d.write("refs/heads/feature", d.git("rev-parse", "HEAD~1")+"\n")
		case 4: // intent to add
			d.write("intent.txt", "intent\n")
			d.git("add", "-f", "-N", "intent.txt")
		default: // untracked or ignored, as the rules decide
			for range 1 + r.IntN(4) {
				name := path.Join(pick(r, []string{"", "", "src", "sub", "a"}), pick(r, diffUntracked))
				if _, err := os.Lstat(filepath.Join(d.w.work, filepath.FromSlash(name))); err == nil {
					continue
				}
				if p := filepath.Join(d.w.work, filepath.FromSlash(path.Dir(name))); !isDirOrAbsent(p) {
					continue
				}
				d.write(name, "untracked\n")
			}
		}
	}
}

// isDirOrAbsent: a file may be written beneath p.
func isDirOrAbsent(p string) bool {
	for ; p != "/"; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err == nil {
			return fi.IsDir()
		}
	}
	return true
}
