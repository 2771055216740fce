package cli

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/safepath"
)

// push-working reads what it needs of the worker's repository in process,
// so that a push starts one git process, `bundle create`: HEAD, the main
// fetch-main recorded, and whether the working tree is provably clean.
// Whatever it cannot answer for sure here (a ref or object stored in a way
// this does not read, an index of another version, a file whose stat
// differs from the index) it leaves to git, as before. It reads the files
// itself rather than through go-git's Repository: that package and what
// it pulls in (78 packages) cost every bushost command 1.3 ms of start-up.

// workRepo is a worker's repository opened for reads; nil when none was
// found (git answers then).
type workRepo struct {
	top    string // the working tree's top, "" for a bare repository
	gitDir string // its git directory (HEAD, index)
	common string // the common directory (refs, objects, config)
}

// openWorkRepo finds the repository dir is in, as git does: dir or the
// nearest parent holding .git (a directory, or a file naming one), or dir
// itself when it is a bare repository.
func openWorkRepo(dir string) *workRepo {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil
	}
	if isGitDir(abs) {
		return &workRepo{gitDir: abs, common: commonDir(abs)}
	}
	for d := abs; ; d = filepath.Dir(d) {
		dot := filepath.Join(d, ".git")
		if fi, err := os.Stat(dot); err == nil {
			if fi.IsDir() {
				return &workRepo{top: d, gitDir: dot, common: commonDir(dot)}
			}
			b, err := readRegular(dot, smallFile)
			rest, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir: ")
			if err != nil || !ok {
				return nil
			}
			if !filepath.IsAbs(rest) {
				rest = filepath.Join(d, rest)
			}
			return &workRepo{top: d, gitDir: rest, common: commonDir(rest)}
		}
		if filepath.Dir(d) == d {
			return nil
		}
	}
}

// smallFile bounds what is read of a worker's ref, config or excludes
// file.
const smallFile = 16 << 20

// readRegular reads the file at path, which must be a regular file of
// at most max bytes. The worker may have put anything there: a link to
// /dev/zero reads without end, and a FIFO blocks its open.
func readRegular(path string, max int64) ([]byte, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err == nil && int64(len(b)) > max {
		err = fmt.Errorf("%s: larger than %d bytes", path, max)
	}
	return b, err
}

func isGitDir(d string) bool {
	for _, name := range []string{"HEAD", "objects", "refs"} {
		if _, err := os.Stat(filepath.Join(d, name)); err != nil {
			return false
		}
	}
	return true
}

// commonDir is a git directory's common directory (a linked worktree's
// names it in the file commondir).
func commonDir(gitDir string) string {
	b, err := readRegular(filepath.Join(gitDir, "commondir"), smallFile)
	if err != nil {
		return gitDir
	}
	c := strings.TrimSpace(string(b))
	if !filepath.IsAbs(c) {
		c = filepath.Join(gitDir, c)
	}
	return c
}

// commit resolves ref (HEAD, or a full ref name) to the object id it
// names, "" when this cannot say (git is asked then). It reads refs only,
// no object: bundle create refuses a HEAD that is no commit, and the
// server checks the type again.
func (w *workRepo) commit(ref string) string {
	if w == nil {
		return ""
	}
	for depth := 0; depth < 5; depth++ {
		dir := w.common
		if ref == "HEAD" {
			dir = w.gitDir
		}
		b, err := readRegular(filepath.Join(dir, filepath.FromSlash(ref)), smallFile)
		if errors.Is(err, fs.ErrNotExist) && ref != "HEAD" {
			return w.packedRef(ref)
		}
		if err != nil {
			return ""
		}
		v := strings.TrimSpace(string(b))
		if target, ok := strings.CutPrefix(v, "ref: "); ok {
			// A name git would refuse (outside refs/, a ".." in it)
			// is not read: it may name a file beyond the repository.
			if !strings.HasPrefix(target, "refs/") || strings.Contains(target, "..") || path.Clean(target) != target {
				return ""
			}
			ref = target
			continue
		}
		if isObjectID(v) {
			return v
		}
		return ""
	}
	return ""
}

// packedRef looks ref up in packed-refs.
func (w *workRepo) packedRef(ref string) string {
	b, err := readRegular(filepath.Join(w.common, "packed-refs"), 1<<30)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if id, name, ok := strings.Cut(line, " "); ok && name == ref && isObjectID(id) {
			return id
		}
	}
	return ""
}

func isObjectID(s string) bool {
	if len(s) != 40 || s == strings.Repeat("0", 40) {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// looseObject returns the start of loose object id's inflated content
// (its header and up to 64 bytes in all), false when it is not loose.
func (w *workRepo) looseObject(id string) ([]byte, bool) {
	if !isObjectID(id) {
		return nil, false
	}
	f, err := openRegular(filepath.Join(w.common, "objects", id[:2], id[2:]))
	if err != nil {
		return nil, false
	}
	defer f.Close()
	z, err := zlib.NewReader(f)
	if err != nil {
		return nil, false
	}
	defer z.Close()
	var head [64]byte
	n, _ := io.ReadFull(z, head[:])
	return head[:n], n > 0
}

// hasCommit reports whether the repository holds commit id as a loose
// object (false also when it is packed: git is asked then).
func (w *workRepo) hasCommit(id string) bool {
	if w == nil {
		return false
	}
	b, ok := w.looseObject(id)
	return ok && bytes.HasPrefix(b, []byte("commit "))
}

// clean reports whether the working tree is provably what HEAD holds:
// the index's cached tree is valid and is HEAD's tree (nothing staged),
// every index entry's file has the stat data the index recorded, its
// content compared when racily clean (nothing modified), and every file
// not in the index is ignored (nothing untracked). false means "not
// proven": `git status` then says what differs. It does what git status
// does, in process: read the index, lstat every file (in parallel, as
// git's core.preloadIndex), read the directories.
func (w *workRepo) clean(head string) bool {
	if w == nil || w.top == "" || head == "" {
		return false
	}
	// A configured excludes or attributes file is not read here, nor a
	// config included (it may configure one): git status decides.
	for _, c := range []string{filepath.Join(w.common, "config"), filepath.Join(w.gitDir, "config.worktree")} {
		b, err := readRegular(c, smallFile)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false // a config not read is not proven either
		}
		b = bytes.ToLower(b)
		for _, k := range []string{"excludesfile", "attributesfile", "include"} {
			if bytes.Contains(b, []byte(k)) {
				return false
			}
		}
	}
	idx, err := readIndex(filepath.Join(w.gitDir, "index"))
	if err != nil || !idx.treeValid {
		return false
	}
	if tree, ok := w.treeOf(head); !ok || tree != idx.tree {
		return false
	}
	tracked := make(map[string]bool, len(idx.entries))
	dirs := map[string]bool{"": true}
	for _, e := range idx.entries {
		if e.stage != 0 || e.extended || e.mode == filemode.Submodule {
			return false
		}
		tracked[e.name] = true
		for d := path.Dir(e.name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var racy atomic.Bool
	if !w.statAll(idx, &racy) {
		return false
	}
	var ps []gitignore.Pattern
	if info, err := readRegular(filepath.Join(w.common, "info", "exclude"), smallFile); err == nil {
		ps = append(ps, parseIgnore(string(info), nil)...)
	}
	attrs := false
	if !w.noUntracked("", ps, tracked, dirs, &attrs) {
		return false
	}
	// A racily clean file's content was compared as it is; git compares
	// it as attributes convert it (text, eol, ident, a filter), and the
	// two differ. Where attributes may apply, git status decides.
	if _, err := os.Lstat(filepath.Join(w.common, "info", "attributes")); err == nil {
		attrs = true
	}
	return !(racy.Load() && attrs)
}

// statAll checks every entry's stat data (racy is set when one's content
// was compared), spread over the CPUs but one, which is left to the push
// this runs beside. Each entry is looked up in its directory, opened once
// for the entries of that directory beside each other in the index's
// order, rather than from the top: a lookup of one name, not of the whole
// path.
func (w *workRepo) statAll(idx *gitIndex, racy *atomic.Bool) bool {
	n := max(runtime.GOMAXPROCS(0)-1, 1)
	if len(idx.entries) < 256 {
		n = 1
	}
	var bad atomic.Bool
	var wg sync.WaitGroup
	per := (len(idx.entries) + n - 1) / n
	for i := 0; i < len(idx.entries); i += per {
		part := idx.entries[i:min(i+per, len(idx.entries))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !w.statPart(part, idx.modNano, &bad, racy) {
				bad.Store(true)
			}
		}()
	}
	wg.Wait()
	return !bad.Load()
}

// statPart checks the stat data of entries, which are in the index's
// order, until one differs or another part found one that does (bad).
func (w *workRepo) statPart(entries []*idxEntry, indexNano int64, bad, racy *atomic.Bool) bool {
	top, err := unix.Open(w.top, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(top)
	dir, fd := "", -1
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	for _, e := range entries {
		if bad.Load() {
			return true
		}
		d, name := path.Split(e.name)
		if fd < 0 || d != dir {
			if fd >= 0 {
				unix.Close(fd)
			}
			// No directory from the top down may be a symbolic link:
			// git takes an entry beyond one as deleted, and the link
			// may lead to the very files the index recorded.
			if fd, err = safepath.OpenBeneath(top, d, unix.O_RDONLY|unix.O_DIRECTORY); err != nil {
				return false
			}
			dir = d
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return false
		}
		same, isRacy := sameStat(&st, e, indexNano)
		if isRacy {
			racy.Store(true)
		}
		if !same || isRacy && !sameContent(filepath.Join(w.top, filepath.FromSlash(e.name)), e) {
			return false
		}
	}
	return true
}

// treeOf reads the tree of commit id from its loose object (a fresh
// commit is one); false when it is packed.
func (w *workRepo) treeOf(id string) (string, bool) {
	b, ok := w.looseObject(id)
	if !ok || !bytes.HasPrefix(b, []byte("commit ")) {
		return "", false
	}
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return "", false
	}
	b = b[i+1:]
	if len(b) < 46 || !bytes.HasPrefix(b, []byte("tree ")) || !isObjectID(string(b[5:45])) {
		return "", false
	}
	return string(b[5:45]), true
}

// noUntracked walks directory dir (slash-separated, relative to the top)
// and reports whether every entry not in the index is ignored; attrs is
// set when a .gitattributes file is met.
func (w *workRepo) noUntracked(dir string, ps []gitignore.Pattern, tracked, dirs map[string]bool, attrs *bool) bool {
	abs := filepath.Join(w.top, filepath.FromSlash(dir))
	var domain []string
	if dir != "" {
		domain = strings.Split(dir, "/")
	}
	// git does not follow a .gitignore that is a symbolic link (it warns
	// and reads none): one that is not a plain file is not read here.
	if f, err := os.OpenFile(filepath.Join(abs, ".gitignore"), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0); err == nil {
		fi, err := f.Stat()
		var b []byte
		if err == nil && fi.Mode().IsRegular() {
			b, err = io.ReadAll(f)
		}
		f.Close()
		if err != nil || !fi.Mode().IsRegular() {
			return false
		}
		ps = append(ps[:len(ps):len(ps)], parseIgnore(string(b), domain)...)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	ents, err := os.ReadDir(abs)
	if err != nil {
		return false
	}
	m := gitignore.NewMatcher(ps)
	for _, e := range ents {
		name := e.Name()
		p := name
		if dir != "" {
			p = dir + "/" + name
		}
		if name == ".gitattributes" {
			*attrs = true
		}
		if name == ".git" {
			if dir == "" {
				continue
			}
			return false // a repository inside: git status decides
		}
		if e.IsDir() {
			if dirs[p] {
				if !w.noUntracked(p, ps, tracked, dirs, attrs) {
					return false
				}
				continue
			}
			if !m.Match(append(domain[:len(domain):len(domain)], name), true) {
				return false
			}
			continue
		}
		if !tracked[p] && !m.Match(append(domain[:len(domain):len(domain)], name), false) {
			return false
		}
	}
	return true
}

func parseIgnore(text string, domain []string) []gitignore.Pattern {
	var ps []gitignore.Pattern
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || len(strings.TrimSpace(line)) == 0 {
			continue
		}
		ps = append(ps, gitignore.ParsePattern(line, domain))
	}
	return ps
}

// sameStat reports whether st (an lstat) is the stat data e recorded, and
// whether the entry is racily clean: modified in the same clock tick the
// index was written or later, which stat data cannot tell from unmodified
// (its content is compared then, as git does).
func sameStat(st *unix.Stat_t, e *idxEntry, indexNano int64) (same, racy bool) {
	switch e.mode {
	case filemode.Regular, filemode.Executable:
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return false, false
		}
		if (st.Mode&0o100 != 0) != (e.mode == filemode.Executable) {
			return false, false
		}
	case filemode.Symlink:
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return false, false
		}
	default:
		return false, false
	}
	mtime := st.Mtim.Nano()
	same = uint32(st.Size) == e.size && uint32(st.Mtim.Sec) == e.mtimeSec && uint32(st.Mtim.Nsec) == e.mtimeNsec &&
		uint32(st.Ctim.Sec) == e.ctimeSec && uint32(st.Ctim.Nsec) == e.ctimeNsec && uint32(st.Ino) == e.ino
	return same, mtime >= indexNano
}

// sameContent reports whether p holds the blob e names. The worker may
// have swapped the file since its lstat: only a regular file is read,
// not through a link nor blocking on a FIFO, and no more of it than the
// size the index recorded (and a byte to tell a longer one).
func sameContent(p string, e *idxEntry) bool {
	var body []byte
	var err error
	if e.mode == filemode.Symlink {
		var target string
		target, err = os.Readlink(p)
		body = []byte(target)
	} else {
		var f *os.File
		if f, err = os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0); err != nil {
			return false
		}
		defer f.Close()
		if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
			return false
		}
		body, err = io.ReadAll(io.LimitReader(f, int64(e.size)+1))
	}
	if err != nil {
		return false
	}
	return plumbing.ComputeHash(plumbing.BlobObject, body).String() == e.hash
}

// gitIndex is what clean needs of .git/index.
type gitIndex struct {
	entries   []*idxEntry
	modNano   int64  // the index file's mtime
	tree      string // the cached tree's root (TREE extension)
	treeValid bool
}

type idxEntry struct {
	ctimeSec, ctimeNsec, mtimeSec, mtimeNsec uint32
	ino, size                                uint32
	mode                                     filemode.FileMode
	hash, name                               string
	stage                                    int
	extended                                 bool // skip-worktree or intent-to-add (v3)
}

// readIndex reads an index of version 2 or 3 (git's default) and its
// cached tree's root; any other version is an error (git status then).
// go-git's decoder reads every field through reflection and took 8 ms
// for 5,000 entries; this takes a fraction of it.
func readIndex(p string) (*gitIndex, error) {
	f, err := openRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	bad := errors.New("index not understood here")
	if len(b) < 12+20 || string(b[:4]) != "DIRC" {
		return nil, bad
	}
	be := binary.BigEndian
	version := be.Uint32(b[4:])
	if version != 2 && version != 3 {
		return nil, bad
	}
	n := int(be.Uint32(b[8:]))
	if n > len(b)/62 { // an entry takes 62 bytes at least: the count lies
		return nil, bad
	}
	idx := &gitIndex{modNano: fi.ModTime().UnixNano(), entries: make([]*idxEntry, 0, n)}
	body := b[:len(b)-20]
	off := 12
	for i := 0; i < n; i++ {
		if off+62 > len(body) {
			return nil, bad
		}
		e := body[off:]
		flags := be.Uint16(e[60:])
		ent := &idxEntry{
			ctimeSec: be.Uint32(e[0:]), ctimeNsec: be.Uint32(e[4:]),
			mtimeSec: be.Uint32(e[8:]), mtimeNsec: be.Uint32(e[12:]),
			ino: be.Uint32(e[20:]), mode: filemode.FileMode(be.Uint32(e[24:])),
			size: be.Uint32(e[36:]), hash: hex.EncodeToString(e[40:60]),
			stage: int(flags>>12) & 3,
		}
		start := 62
		if flags&0x4000 != 0 {
			if version < 3 || off+64 > len(body) {
				return nil, bad
			}
			ent.extended = be.Uint16(e[62:]) != 0
			start = 64
		}
		end := bytes.IndexByte(e[start:], 0)
		if end < 0 {
			return nil, bad
		}
		ent.name = string(e[start : start+end])
		// The entry is padded with 1-8 NULs to a multiple of 8 bytes.
		off += (start + end + 8) &^ 7
		idx.entries = append(idx.entries, ent)
	}
	for off+8 <= len(body) {
		sig, size := string(body[off:off+4]), int(be.Uint32(body[off+4:]))
		off += 8
		if off+size > len(body) {
			return nil, bad
		}
		if sig == "TREE" {
			// The root: "" NUL, entry count (-1: invalid), ' ', subtrees,
			// '\n', then its id when valid.
			t := body[off : off+size]
			if len(t) > 0 && t[0] == 0 {
				if nl := bytes.IndexByte(t, '\n'); nl > 0 {
					count, _, _ := strings.Cut(string(t[1:nl]), " ")
					if c, err := strconv.Atoi(count); err == nil && c == n && len(t) >= nl+21 {
						idx.tree, idx.treeValid = hex.EncodeToString(t[nl+1:nl+21]), true
					}
				}
			}
		}
		off += size
	}
	return idx, nil
}
