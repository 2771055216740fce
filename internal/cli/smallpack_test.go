package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// smallRepo is a worker's repository with a base commit (main) whose
// objects are packed with deltas, as fetch-main leaves them, and a bare
// "bus host" repository holding main only.
func smallRepo(t *testing.T, repack ...string) (work, host, base string) {
	t.Helper()
	dir := t.TempDir()
	work = filepath.Join(dir, "work")
	os.MkdirAll(work, 0o755)
	wtGit(t, work, "init", "-q", "-b", "main")
	for i := range 40 {
		writeFile(t, work, fmt.Sprintf("d%d/e/f%d.txt", i%4, i), strings.Repeat(fmt.Sprintf("line %d of a file\n", i), 40))
	}
	writeFile(t, work, "top.txt", "top\n")
	commitAll(t, work, "one")
	for i := range 5 { // history, so that the pack holds delta chains
		writeFile(t, work, fmt.Sprintf("d%d/e/f%d.txt", i%4, i), strings.Repeat(fmt.Sprintf("line %d of a file, take %d\n", i, i), 40))
		wtGit(t, work, "commit", "-q", "-am", fmt.Sprintf("base %d", i))
	}
	base = wtGit(t, work, "rev-parse", "HEAD")
	// A later branch, so that git's repack stores its newer trees whole
	// and main's as deltas against them: the reads below then resolve
	// delta chains.
	wtGit(t, work, "checkout", "-q", "-b", "later")
	for i := range 8 { // larger trees: git's repack makes the smaller ones deltas
		writeFile(t, work, fmt.Sprintf("d%d/e/later%d.txt", i%4, i), fmt.Sprintf("later %d\n", i))
		writeFile(t, work, fmt.Sprintf("d%d/later%d.txt", i%4, i), fmt.Sprintf("later %d\n", i))
		writeFile(t, work, fmt.Sprintf("later%d.txt", i), fmt.Sprintf("later %d\n", i))
		commitAll(t, work, fmt.Sprintf("later %d", i))
	}
	wtGit(t, work, "checkout", "-q", "main")
	wtGit(t, work, append(repack, "repack", "-q", "-a", "-d", "-f", "--depth=50", "--window=50")...)
	wtGit(t, work, "prune-packed")
	host = filepath.Join(dir, "host.git")
	wtGit(t, dir, "clone", "-q", "--bare", work, host)
	return work, host, base
}

// commitAll commits everything in the working tree at top.
func commitAll(t *testing.T, top, msg string) {
	t.Helper()
	wtGit(t, top, "add", "-A")
	wtGit(t, top, "commit", "-q", "-m", msg)
}

func writeFile(t *testing.T, top, name, body string) {
	t.Helper()
	p := filepath.Join(top, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// indexInto runs index-pack --strict on pack in repository host, as the
// bus host does, and returns the ids the pack held.
func indexInto(t *testing.T, host string, pack []byte) []string {
	t.Helper()
	cmd := exec.Command("git", "index-pack", "--stdin", "--strict", "--fix-thin")
	cmd.Dir = host
	cmd.Stdin = bytes.NewReader(pack)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("index-pack: %v\n%s", err, out)
	}
	name := strings.TrimPrefix(strings.TrimSpace(string(out)), "pack\t")
	idx, err := os.ReadFile(filepath.Join(host, "objects", "pack", "pack-"+name+".idx"))
	if err != nil {
		t.Fatal(err)
	}
	show := exec.Command("git", "show-index")
	show.Stdin = bytes.NewReader(idx)
	listed, err := show.Output()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(string(listed)), "\n") {
		ids = append(ids, strings.Fields(l)[1])
	}
	return ids
}

// The in-process pack holds every object HEAD has that main lacks, the
// bus host's index-pack --strict takes it without fixing it, and the
// repository is then whole.
func TestSmallPack(t *testing.T) {
	// Main's objects packed with deltas named by offset (as git writes
	// them) and by id (as a thin pack fixed by index-pack leaves them).
	t.Run("offset deltas", func(t *testing.T) { testSmallPack(t) })
	t.Run("id deltas", func(t *testing.T) { testSmallPack(t, "-c", "repack.useDeltaBaseOffset=false") })
}

func testSmallPack(t *testing.T, repack ...string) {
	work, host, base := smallRepo(t, repack...)
	// Commits of every kind a tree changes by: a modified file, a new
	// file in a new directory, a removed file, an executable, a symbolic
	// link, a file put back to main's content, a directory that becomes
	// a file, a blob moved to another path, a submodule's commit.
	writeFile(t, work, "d0/e/f0.txt", "changed\n")
	wtGit(t, work, "commit", "-q", "-am", "modify")
	writeFile(t, work, "new/deep/er/n.txt", "new\n")
	commitAll(t, work, "add deep")
	wtGit(t, work, "rm", "-q", "d1/e/f1.txt")
	wtGit(t, work, "commit", "-q", "-m", "remove")
	writeFile(t, work, "run.sh", "#!/bin/sh\n")
	os.Chmod(filepath.Join(work, "run.sh"), 0o755)
	os.Symlink("top.txt", filepath.Join(work, "link"))
	commitAll(t, work, "exec and link")
	wtGit(t, work, "checkout", "-q", base, "--", "d0/e/f0.txt")
	wtGit(t, work, "commit", "-q", "-m", "put back")
	wtGit(t, work, "rm", "-q", "-r", "d3")
	writeFile(t, work, "d3", "now a file\n")
	wtGit(t, work, "mv", "d2/e/f2.txt", "moved.txt")
	commitAll(t, work, "dir to file, move")
	wtGit(t, work, "update-index", "--add", "--cacheinfo", "160000,"+base+",sub")
	wtGit(t, work, "commit", "-q", "-m", "submodule")
	head := wtGit(t, work, "rev-parse", "HEAD")

	w := openWorkRepo(work)
	pack, err := w.smallPack(head, base)
	if err != nil {
		t.Fatal(err)
	}
	got := indexInto(t, host, pack)
	want := strings.Fields(wtGit(t, work, "rev-list", "--objects", "--no-object-names", head, "^"+base))
	have := map[string]bool{}
	for _, id := range got {
		have[id] = true
	}
	for _, id := range want {
		if !have[id] {
			t.Errorf("the pack lacks %s, which HEAD has and main does not", id)
		}
	}
	// Beyond what is new, only what main has too, sent again where a
	// tree went back to main's content or a blob moved.
	inMain := map[string]bool{}
	for _, id := range strings.Fields(wtGit(t, work, "rev-list", "--objects", "--no-object-names", base)) {
		inMain[id] = true
	}
	isNew := map[string]bool{}
	for _, id := range want {
		isNew[id] = true
	}
	extra := 0
	for _, id := range got {
		if !isNew[id] {
			extra++
			if !inMain[id] {
				t.Errorf("the pack holds %s, which HEAD does not have", id)
			}
		}
	}
	t.Logf("%d objects: %d new, %d of main's sent again", len(got), len(want), extra)
	wtGit(t, host, "update-ref", "refs/heads/work", head)
	wtGit(t, host, "fsck", "--strict", "--no-dangling")
}

// What the in-process pack does not handle is left to pack-objects
// (errNotSmall), and nothing else goes wrong.
func TestSmallPackLeavesTheRestToGit(t *testing.T) {
	t.Run("a merge", func(t *testing.T) {
		work, _, base := smallRepo(t)
		wtGit(t, work, "checkout", "-q", "-b", "side")
		writeFile(t, work, "side.txt", "side\n")
		commitAll(t, work, "side")
		wtGit(t, work, "checkout", "-q", "main")
		writeFile(t, work, "main.txt", "main\n")
		commitAll(t, work, "main")
		wtGit(t, work, "merge", "-q", "--no-edit", "side")
		notSmall(t, work, base)
	})
	t.Run("HEAD behind main", func(t *testing.T) {
		work, _, base := smallRepo(t)
		wtGit(t, work, "reset", "-q", "--hard", "HEAD~2")
		if _, err := openWorkRepo(work).smallPack(wtGit(t, work, "rev-parse", "HEAD"), base); !errors.Is(err, errNotSmall) {
			t.Fatalf("got %v, want errNotSmall", err)
		}
	})
	t.Run("more than the line of commits", func(t *testing.T) {
		work, _, base := smallRepo(t)
		var script strings.Builder
		for i := range smallPackCommits + 1 {
			fmt.Fprintf(&script, "commit refs/heads/main\ncommitter t <t@localhost> %d +0000\ndata 2\nc\n", 1700000000+i)
			if i == 0 {
				fmt.Fprintf(&script, "from %s\n", base)
			}
			fmt.Fprintf(&script, "M 100644 inline many.txt\ndata %d\n%d\n\n", len(fmt.Sprint(i))+1, i)
		}
		cmd := exec.Command("git", "fast-import", "--quiet")
		cmd.Dir = work
		cmd.Stdin = strings.NewReader(script.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("fast-import: %v\n%s", err, out)
		}
		notSmall(t, work, base)
	})
	t.Run("past the bytes", func(t *testing.T) {
		work, _, base := smallRepo(t)
		writeFile(t, work, "big.bin", strings.Repeat("0123456789abcdef", smallPackBytes/16+1))
		commitAll(t, work, "big")
		notSmall(t, work, base)
	})
	t.Run("a shallow repository", func(t *testing.T) {
		work, _, base := smallRepo(t)
		writeFile(t, work, "x.txt", "x\n")
		commitAll(t, work, "x")
		os.WriteFile(filepath.Join(work, ".git", "shallow"), []byte(base+"\n"), 0o644)
		notSmall(t, work, base)
	})
	t.Run("an object that does not read back to its id", func(t *testing.T) {
		work, _, base := smallRepo(t)
		writeFile(t, work, "x.txt", "x\n")
		commitAll(t, work, "x")
		blob := wtGit(t, work, "rev-parse", "HEAD:x.txt")
		other := filepath.Join(work, ".git", "objects", blob[:2], blob[2:])
		// Another blob's loose file under x.txt's name.
		writeFile(t, work, "y.txt", "y\n")
		y := wtGit(t, work, "hash-object", "-w", "y.txt")
		b, err := os.ReadFile(filepath.Join(work, ".git", "objects", y[:2], y[2:]))
		if err != nil {
			t.Fatal(err)
		}
		os.Chmod(other, 0o644)
		if err := os.WriteFile(other, b, 0o644); err != nil {
			t.Fatal(err)
		}
		notSmall(t, work, base)
	})
}

func notSmall(t *testing.T, work, base string) {
	t.Helper()
	pack, err := openWorkRepo(work).smallPack(wtGit(t, work, "rev-parse", "HEAD"), base)
	if !errors.Is(err, errNotSmall) {
		t.Fatalf("got %d bytes, %v; want errNotSmall", len(pack), err)
	}
}
