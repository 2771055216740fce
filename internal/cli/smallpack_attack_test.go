package cli

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/adler32"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/gitobj"
)

// Attacks on the in-process pack and the cleanliness proof by a worker
// that writes any bytes into its repository: the push must be packed
// right or left to pack-objects (errNotSmall), never hang or crash, and
// "clean" must never be said of a tree git status lists changes in.

// attackCommit commits x.txt on top of main in work and returns HEAD.
func attackCommit(t *testing.T, work string) string {
	t.Helper()
	writeFile(t, work, "x.txt", "x\n")
	commitAll(t, work, "x")
	return wtGit(t, work, "rev-parse", "HEAD")
}

// smallPackSoon runs smallPack and fails the test when it has not
// returned in a minute (a hang: a failure, not a timing).
func smallPackSoon(t *testing.T, work, head, base string) ([]byte, error) {
	t.Helper()
	type res struct {
		pack []byte
		err  error
	}
	done := make(chan res, 1)
	go func() {
		p, err := openWorkRepo(work).smallPack(head, base)
		done <- res{p, err}
	}()
	select {
	case r := <-done:
		return r.pack, r.err
	case <-time.After(time.Minute):
		t.Fatal("smallPack hangs")
		return nil, nil
	}
}

// mkfifo makes a FIFO at p; the test's end opens its other side, so that
// a reader blocked on it returns.
func mkfifo(t *testing.T, p string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
}

func TestAttackSmallPackFIFO(t *testing.T) {
	// A FIFO where a loose object would be, for an object that is packed
	// (git reads packs first, and never opens it).
	t.Run("loose object", func(t *testing.T) {
		work, _, base := smallRepo(t)
		head := attackCommit(t, work)
		mkfifo(t, filepath.Join(work, ".git", "objects", base[:2], base[2:]))
		if _, err := smallPackSoon(t, work, head, base); !errors.Is(err, errNotSmall) {
			t.Fatalf("got %v, want errNotSmall", err)
		}
	})
	t.Run("pack index", func(t *testing.T) {
		work, _, base := smallRepo(t)
		head := attackCommit(t, work)
		mkfifo(t, filepath.Join(work, ".git", "objects", "pack", "pack-0000000000000000000000000000000000000000.idx"))
		if _, err := smallPackSoon(t, work, head, base); !errors.Is(err, errNotSmall) {
			t.Fatalf("got %v, want errNotSmall", err)
		}
	})
	t.Run("loose commit read by clean", func(t *testing.T) {
		work, _, base := smallRepo(t)
		mkfifo(t, filepath.Join(work, ".git", "objects", base[:2], base[2:]))
		done := make(chan bool, 1)
		go func() {
			w := openWorkRepo(work)
			done <- w.hasCommit(base) || w.clean(base)
		}()
		select {
		case got := <-done:
			if got {
				t.Fatal("a FIFO read as the commit")
			}
		case <-time.After(time.Minute):
			t.Fatal("clean hangs")
		}
	})
	t.Run("pack", func(t *testing.T) {
		work, _, base := smallRepo(t)
		head := attackCommit(t, work)
		packs, _ := filepath.Glob(filepath.Join(work, ".git", "objects", "pack", "pack-*.pack"))
		for _, p := range packs {
			os.Rename(p, p+".away")
			mkfifo(t, p)
		}
		if _, err := smallPackSoon(t, work, head, base); !errors.Is(err, errNotSmall) {
			t.Fatalf("got %v, want errNotSmall", err)
		}
	})
}

// A commit whose header holds a second tree line after its committer:
// git takes the first line's tree (and fsck lets the extra header pass),
// so the pack must hold the first tree, and nothing of the second.
func TestAttackSmallPackCommitHeaders(t *testing.T) {
	work, host, base := smallRepo(t)
	mktree := func(name, body string) string {
		blob := wtGit(t, work, "hash-object", "-w", "--no-filters", writeTemp(t, body))
		cmd := exec.Command("sh", "-c", fmt.Sprintf(`(git ls-tree %s; printf '100644 blob %s\t%s\n') | git mktree`, base, blob, name))
		cmd.Dir = work
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	real, other := mktree("real.txt", "real\n"), mktree("other.txt", "other\n")
	for _, c := range []struct{ name, body string }{
		{"tree after committer", fmt.Sprintf("tree %s\nparent %s\nauthor t <t@l> 1 +0000\ncommitter t <t@l> 1 +0000\ntree %s\n\nm\n", real, base, other)},
		{"parent after committer", fmt.Sprintf("tree %s\nauthor t <t@l> 1 +0000\ncommitter t <t@l> 1 +0000\nparent %s\n\nm\n", real, base)},
	} {
		t.Run(c.name, func(t *testing.T) {
			head := wtGit(t, work, "hash-object", "-t", "commit", "-w", "--literally", writeTemp(t, c.body))
			pack, err := smallPackSoon(t, work, head, base)
			if errors.Is(err, errNotSmall) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Nothing HEAD does not have, and the bus host then holds all
			// HEAD has.
			reach := map[string]bool{}
			for _, id := range strings.Fields(wtGit(t, work, "rev-list", "--objects", "--no-object-names", head)) {
				reach[id] = true
			}
			for _, id := range indexInto(t, host, pack) {
				if !reach[id] {
					t.Errorf("the pack holds %s, which HEAD does not have", id)
				}
			}
			wtGit(t, host, "rev-list", "--objects", "--missing=error", head)
		})
	}
}

func writeTemp(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "body")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A pack index truncated by the worker while it is mapped: its pages
// fault on read, which must be a push for pack-objects, not a crash.
func TestAttackSmallPackTruncatedIndex(t *testing.T) {
	work, _, base := smallRepo(t)
	s, err := openWorkRepo(work).objectStore()
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if _, err := s.readAs(base, objCommit); err != nil { // maps the indexes
		t.Fatal(err)
	}
	idxs, _ := filepath.Glob(filepath.Join(work, ".git", "objects", "pack", "pack-*.idx"))
	for _, p := range idxs {
		if err := os.Truncate(p, 0); err != nil {
			t.Fatal(err)
		}
	}
	tree, _, err := parseCommit(s.seen[base].data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.readAs(tree, objTree); !errors.Is(err, errNotSmall) {
		t.Fatalf("got %v, want errNotSmall", err)
	}
}

// A worker's tree that clean must not prove clean while git status lists
// changes in it.
func TestAttackWorkRepoClean(t *testing.T) {
	setup := func(t *testing.T, linkIgnore bool) (dir, head string) {
		dir = t.TempDir()
		wtGit(t, dir, "init", "-q", "-b", "main")
		writeFile(t, dir, "a/b/c.txt", "c\n")
		writeFile(t, dir, "top.txt", "top\r\n")
		writeFile(t, dir, "ign", "*.secret\n")
		if linkIgnore {
			if err := os.Symlink("ign", filepath.Join(dir, ".gitignore")); err != nil {
				t.Fatal(err)
			}
		}
		commitAll(t, dir, "one")
		return dir, wtGit(t, dir, "rev-parse", "HEAD")
	}
	check := func(t *testing.T, dir, head string) {
		t.Helper()
		clean := openWorkRepo(dir).clean(head) // first: git status rewrites the index
		cmd := exec.Command("git", "status", "--porcelain")
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
		out, err := cmd.Output() // not its warnings
		if err != nil {
			t.Fatal(err)
		}
		status := strings.TrimSpace(string(out))
		if clean && status != "" {
			t.Fatalf("proven clean, but git status lists:\n%s", status)
		}
		t.Logf("git status:\n%s", status)
	}
	t.Run("a directory above a tracked one turned symbolic link", func(t *testing.T) {
		dir, head := setup(t, false)
		// a/b/c.txt still resolves, to the same inode, through the link;
		// git takes it as deleted. The link and the moved directory are
		// ignored through the worker's own exclude file.
		os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "a.real"))
		os.Symlink("a.real", filepath.Join(dir, "a"))
		os.WriteFile(filepath.Join(dir, ".git", "info", "exclude"), []byte("/a\n/a.real/\n"), 0o644)
		check(t, dir, head)
	})
	t.Run("a .gitignore that is a symbolic link", func(t *testing.T) {
		// git does not follow it (2.32 on): x.secret is untracked.
		dir, head := setup(t, true)
		writeFile(t, dir, "x.secret", "s\n")
		check(t, dir, head)
	})
	for _, c := range []struct{ name, ignore, file string }{
		{"a pattern's trailing space", "x.secret \n", "x.secret "},
		{"a pattern's escaped trailing space", "x.secret\\ \n", "x.secret"},
		{"a double star", "a/**/z.secret\n", "a/b/c/y.secret"},
		{"a negated directory", "/d/\n!/d/keep\n", "d/keep"},
		{"a bracket", "[a-\n", "[a-"},
		{"a backslash", "x\\y\n", "x\\y"},
		{"a dir-only pattern on a file", "x.secret/\n", "x.secret"},
	} {
		t.Run("ignore: "+c.name, func(t *testing.T) {
			dir, head := setup(t, false)
			os.WriteFile(filepath.Join(dir, ".git", "info", "exclude"), []byte(c.ignore), 0o644)
			writeFile(t, dir, c.file, "s\n")
			check(t, dir, head)
		})
	}
	t.Run("an attributes file configured through an include", func(t *testing.T) {
		dir, head := setup(t, false)
		os.WriteFile(filepath.Join(dir, ".git", "attrs"), []byte("*.txt text\n"), 0o644)
		os.WriteFile(filepath.Join(dir, ".git", "more.conf"), []byte("[core]\n\tattributesFile = "+filepath.Join(dir, ".git", "attrs")+"\n"), 0o644)
		f, _ := os.OpenFile(filepath.Join(dir, ".git", "config"), os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString("[include]\n\tpath = more.conf\n")
		f.Close()
		old := time.Unix(1000000000, 0)
		if err := os.Chtimes(filepath.Join(dir, ".git", "index"), old, old); err != nil {
			t.Fatal(err)
		}
		check(t, dir, head)
	})
	t.Run("a racily clean file git converts", func(t *testing.T) {
		// top.txt, committed with CRLF, is now a text file: git
		// compares it converted, once its stat data is racy.
		dir, head := setup(t, false)
		os.WriteFile(filepath.Join(dir, ".git", "info", "attributes"), []byte("*.txt text\n"), 0o644)
		old := time.Unix(1000000000, 0)
		if err := os.Chtimes(filepath.Join(dir, ".git", "index"), old, old); err != nil {
			t.Fatal(err)
		}
		check(t, dir, head)
	})
}

// A loose object whose deflated stream is padded with empty blocks: it
// inflates to the right object, but reading it costs what the worker
// chose, however small the object. Input past what any zlib writes for
// that size is a push for pack-objects.
func TestAttackSmallPackPaddedStream(t *testing.T) {
	work, _, base := smallRepo(t)
	head := attackCommit(t, work)
	blob := wtGit(t, work, "rev-parse", "HEAD:x.txt")
	obj := []byte("blob 2\x00x\n")
	var b bytes.Buffer
	b.Write([]byte{0x78, 0x01})
	for range 1 << 16 {
		b.Write([]byte{0, 0, 0, 0xff, 0xff}) // an empty stored block, not the last
	}
	b.Write([]byte{1, byte(len(obj)), 0, ^byte(len(obj)), 0xff})
	b.Write(obj)
	binary.Write(&b, binary.BigEndian, adler32.Checksum(obj))
	p := filepath.Join(work, ".git", "objects", blob[:2], blob[2:])
	os.Chmod(p, 0o644)
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := wtGit(t, work, "cat-file", "blob", blob); got != "x" {
		t.Fatalf("git reads the padded object as %q", got)
	}
	if _, err := smallPackSoon(t, work, head, base); !errors.Is(err, errNotSmall) {
		t.Fatalf("got %v, want errNotSmall", err)
	}
}

// The bound on what is read for an object holds for git's own packs at
// any compression, stored blocks included.
func TestAttackSmallPackStoredPack(t *testing.T) {
	testSmallPack(t, "-c", "pack.compression=0")
}

// A worker's repository with packs by the hundred: each would cost a
// descriptor and a mapping for the length of the push. Past a bound the
// push is pack-objects'.
func TestAttackSmallPackManyPacks(t *testing.T) {
	work, _, base := smallRepo(t)
	head := attackCommit(t, work)
	idxs, _ := filepath.Glob(filepath.Join(work, ".git", "objects", "pack", "pack-*.idx"))
	for i := range smallPackPacks + 1 {
		for _, ext := range []string{".idx", ".pack"} {
			to := filepath.Join(work, ".git", "objects", "pack", fmt.Sprintf("pack-%040d%s", i, ext))
			if err := os.Link(strings.TrimSuffix(idxs[0], ".idx")+ext, to); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := smallPackSoon(t, work, head, base); !errors.Is(err, errNotSmall) {
		t.Fatalf("got %v, want errNotSmall", err)
	}
}

// writeHostilePack puts pack-!.pack (sorted before git's own, so looked
// in first) holding body after its header, and an index naming each of
// ids at the offsets given (large ones in the 64-bit table).
func writeHostilePack(t *testing.T, work string, body []byte, ids []string, offs []uint64) {
	t.Helper()
	dir := filepath.Join(work, ".git", "objects", "pack")
	var pack bytes.Buffer
	pack.WriteString("PACK\x00\x00\x00\x02")
	binary.Write(&pack, binary.BigEndian, uint32(len(ids)))
	pack.Write(body)
	pack.Write(make([]byte, 20))
	if err := os.WriteFile(filepath.Join(dir, "pack-!.pack"), pack.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	type ent struct {
		h   []byte
		off uint64
	}
	var ents []ent
	for i, id := range ids {
		h, _ := hex.DecodeString(id)
		ents = append(ents, ent{h, offs[i]})
	}
	sort.Slice(ents, func(i, j int) bool { return bytes.Compare(ents[i].h, ents[j].h) < 0 })
	var idx bytes.Buffer
	idx.WriteString("\xfftOc\x00\x00\x00\x02")
	for b := range 256 {
		n := 0
		for _, e := range ents {
			if int(e.h[0]) <= b {
				n++
			}
		}
		binary.Write(&idx, binary.BigEndian, uint32(n))
	}
	for _, e := range ents {
		idx.Write(e.h)
	}
	idx.Write(make([]byte, 4*len(ents)))
	var large []uint64
	for _, e := range ents {
		if e.off >= 1<<31 {
			binary.Write(&idx, binary.BigEndian, uint32(1<<31|len(large)))
			large = append(large, e.off)
		} else {
			binary.Write(&idx, binary.BigEndian, uint32(e.off))
		}
	}
	for _, o := range large {
		binary.Write(&idx, binary.BigEndian, o)
	}
	idx.Write(make([]byte, 40))
	if err := os.WriteFile(filepath.Join(dir, "pack-!.idx"), idx.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Packs whose index and entries lie: each read must end in errNotSmall,
// promptly, without a panic.
func TestAttackSmallPackHostilePack(t *testing.T) {
	refDelta := func(base string, size byte) []byte {
		h, _ := hex.DecodeString(base)
		return append([]byte{byte(objRef)<<4 | size}, h...)
	}
	for _, c := range []struct {
		name string
		body func(tree string) []byte
		off  uint64
	}{
		{"an offset past the pack", func(string) []byte { return nil }, 1 << 30},
		{"a large offset past any file", func(string) []byte { return nil }, 1<<63 - 1},
		{"an offset into the header", func(string) []byte { return nil }, 4},
		{"an id delta on itself", func(tree string) []byte {
			return append(refDelta(tree, 0), 0x78, 0x01, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01)
		}, 12},
		{"an offset delta on itself", func(string) []byte { return []byte{byte(objOfs)<<4 | 0, 0} }, 12},
		{"an offset delta before the pack", func(string) []byte { return []byte{byte(objOfs)<<4 | 0, 0x7f} }, 12},
		{"a size header that never ends", func(string) []byte { return bytes.Repeat([]byte{0xff}, 64) }, 12},
		{"a size past the bound", func(string) []byte { return []byte{0xbf, 0xff, 0xff, 0xff, 0xff, 0x7f} }, 12},
		{"a stream that stops short", func(string) []byte { return []byte{byte(objTree)<<4 | 10, 0x78, 0x01} }, 12},
	} {
		t.Run(c.name, func(t *testing.T) {
			work, _, base := smallRepo(t)
			head := attackCommit(t, work)
			tree := wtGit(t, work, "rev-parse", base+"^{tree}")
			writeHostilePack(t, work, c.body(tree), []string{tree}, []uint64{c.off})
			_, err := smallPackSoon(t, work, head, base)
			if !errors.Is(err, errNotSmall) {
				t.Fatalf("got %v, want errNotSmall", err)
			}
			t.Log(err)
		})
	}
	// A delta of copies that each take 64 KiB of its base: 100,000 of
	// them, one byte each, declare 6.5 GB of result. Its declared size
	// is spent before it is applied, so it is never made.
	t.Run("a delta that makes far more than its bytes", func(t *testing.T) {
		work, _, base := smallRepo(t)
		head := attackCommit(t, work)
		tree := wtGit(t, work, "rev-parse", base+"^{tree}")
		deflate := func(b []byte) []byte {
			var z bytes.Buffer
			w := zlib.NewWriter(&z)
			w.Write(b)
			w.Close()
			return z.Bytes()
		}
		const copies = 100000
		blob := make([]byte, 1<<16)
		body := gitobj.AppendEntryHeader(nil, int(objBlob), uint64(len(blob)))
		body = append(body, deflate(blob)...)
		deltaAt := uint64(12 + len(body))
		delta := binary.AppendUvarint(nil, uint64(len(blob)))
		delta = binary.AppendUvarint(delta, copies<<16)
		delta = append(delta, bytes.Repeat([]byte{0x80}, copies)...) // copy 64 KiB from 0
		body = gitobj.AppendEntryHeader(body, int(objOfs), uint64(len(delta)))
		// How far back the blob is (right after the pack's header), as
		// git writes it: big-endian 7-bit groups, each but the last one
		// less, the high bit set on all but the last.
		back := deltaAt - 12
		ofs := []byte{byte(back & 0x7f)}
		for back >>= 7; back > 0; back >>= 7 {
			back--
			ofs = append([]byte{0x80 | byte(back&0x7f)}, ofs...)
		}
		body = append(body, ofs...)
		body = append(body, deflate(delta)...)
		writeHostilePack(t, work, body, []string{tree}, []uint64{deltaAt})
		if _, err := smallPackSoon(t, work, head, base); !errors.Is(err, errNotSmall) {
			t.Fatalf("got %v, want errNotSmall", err)
		}
	})
	t.Run("id deltas on each other", func(t *testing.T) {
		work, _, base := smallRepo(t)
		head := attackCommit(t, work)
		tree := wtGit(t, work, "rev-parse", base+"^{tree}")
		other := strings.Repeat("ab", 20)
		z := []byte{0x78, 0x01, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01}
		a := append(refDelta(other, 0), z...)
		b := append(refDelta(tree, 0), z...)
		writeHostilePack(t, work, append(a, b...), []string{tree, other}, []uint64{12, uint64(12 + len(a))})
		if _, err := smallPackSoon(t, work, head, base); !errors.Is(err, errNotSmall) {
			t.Fatalf("got %v, want errNotSmall", err)
		}
	})
}

// A racily clean file's content is read after its lstat: a worker that
// swaps a link to an endless device in between must not make the read
// endless (memory without bound), nor a FIFO block it.
func TestAttackWorkRepoCleanSwappedFile(t *testing.T) {
	dir := t.TempDir()
	e := &idxEntry{mode: 0o100644, size: 2, hash: "587be6b4c3f93f93c489c0111bba5596147a26cb"} // "x\n"
	os.Symlink("/dev/zero", filepath.Join(dir, "zero"))
	mkfifo(t, filepath.Join(dir, "fifo"))
	for _, name := range []string{"zero", "fifo"} {
		done := make(chan bool, 1)
		go func() { done <- sameContent(filepath.Join(dir, name), e) }()
		select {
		case same := <-done:
			if same {
				t.Fatalf("%s read as the blob", name)
			}
		case <-time.After(time.Minute):
			t.Fatalf("reading %s does not end", name)
		}
	}
}

// The repository's own small files (config, index, info/exclude, HEAD)
// made links to /dev/zero or FIFOs: git reads nothing or refuses them;
// reading them here must end too.
func TestAttackWorkRepoDeviceFiles(t *testing.T) {
	for _, name := range []string{"config", "index", "info/exclude", "HEAD"} {
		for _, kind := range []string{"zero", "fifo"} {
			t.Run(name+" "+kind, func(t *testing.T) {
				work, _, base := smallRepo(t)
				head := attackCommit(t, work)
				p := filepath.Join(work, ".git", filepath.FromSlash(name))
				os.Remove(p)
				if kind == "zero" {
					os.Symlink("/dev/zero", p)
				} else {
					mkfifo(t, p)
				}
				done := make(chan bool, 1)
				go func() {
					w := openWorkRepo(work)
					w.commit("HEAD")
					w.smallPack(head, base)
					done <- w.clean(head)
				}()
				select {
				case clean := <-done:
					// A config not read proves nothing; the others only
					// must not be read without end.
					if clean && name == "config" {
						t.Fatal("proven clean")
					}
				case <-time.After(time.Minute):
					t.Fatal("reading the repository does not end")
				}
			})
		}
	}
}

// An index whose header claims four billion entries, in 32 bytes.
func TestAttackWorkRepoIndexCount(t *testing.T) {
	dir := t.TempDir()
	wtGit(t, dir, "init", "-q", "-b", "main")
	writeFile(t, dir, "a.txt", "a\n")
	commitAll(t, dir, "one")
	head := wtGit(t, dir, "rev-parse", "HEAD")
	b := append([]byte("DIRC\x00\x00\x00\x02\xff\xff\xff\xff"), make([]byte, 20)...)
	if err := os.WriteFile(filepath.Join(dir, ".git", "index"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if openWorkRepo(dir).clean(head) {
		t.Fatal("proven clean")
	}
}

// A symbolic HEAD naming a file outside the repository: git refuses the
// name; read here, it would take another repository's commit (a file the
// worker may not read) for HEAD, and print it.
func TestAttackWorkRepoSymrefOutside(t *testing.T) {
	dir := t.TempDir()
	wtGit(t, dir, "init", "-q", "-b", "main")
	writeFile(t, dir, "a.txt", "a\n")
	commitAll(t, dir, "one")
	secret := strings.Repeat("5e", 20)
	writeFile(t, dir, "../outside/ref", secret+"\n")
	os.WriteFile(filepath.Join(dir, ".git", "HEAD"), []byte("ref: ../../outside/ref\n"), 0o644)
	if got := openWorkRepo(dir).commit("HEAD"); got == secret {
		t.Fatalf("HEAD read as %s, from outside the repository", got)
	}
	if err := exec.Command("git", "-C", dir, "rev-parse", "--verify", "HEAD").Run(); err == nil {
		t.Fatal("git takes the name")
	}
}
