package cli

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/format/packfile"

	"github.com/bushost/bushost/internal/gitobj"
)

// A small push is packed in process, without pack-objects. What git's
// pack-objects spends on ten commits is mostly not the ten commits: it
// marks the whole tree of the base uninteresting (every subtree of main
// inflated) and searches for deltas, about 10 ms before the first byte of
// the pack, while the bus host waits. Here the commits from HEAD down to
// the base are read, each one's tree compared with its parent's (only the
// subtrees that differ are read), and what differs is written whole, each
// object deflated, no delta: a pack the bus host indexes without fixing a
// thin pack. Anything this does not handle for sure (a merge, a history
// that does not reach the base in a short line, an object past the
// bounds, a repository with alternates, grafts or a shallow history, an
// object that does not read back to its id) leaves the push to
// pack-objects, as before (docs/git-service.md, "Pushing").

const (
	// smallPackCommits bounds the line of commits from HEAD to the base.
	smallPackCommits = 256
	// smallPackObjects and smallPackBytes bound what is sent: past them
	// deltas are worth pack-objects' time.
	smallPackObjects = 4096
	smallPackBytes   = 1 << 20
	// smallPackRead bounds the bytes inflated for the whole walk (the
	// parents' trees and delta bases included).
	smallPackRead = 8 << 20
	// smallPackDepth bounds a delta chain followed in a pack.
	smallPackDepth = 4096
	// smallPackPacks bounds the packs opened (a descriptor and a mapping
	// each): git's gc --auto repacks at 50.
	smallPackPacks = 256
)

// errNotSmall is a push this does not pack: pack-objects does.
var errNotSmall = errors.New("not a small push")

// objType is a git object's type, numbered as in a pack.
type objType int

const (
	objCommit objType = 1
	objTree   objType = 2
	objBlob   objType = 3
	objTag    objType = 4
	objOfs    objType = gitobj.EntryOfsDelta
	objRef    objType = gitobj.EntryRefDelta
)

var typeNames = map[objType]string{objCommit: "commit", objTree: "tree", objBlob: "blob", objTag: "tag"}

// smallPack returns the pack of head's history that base's lacks (head
// descends from base), or errNotSmall when pack-objects should make it.
func (w *workRepo) smallPack(head, base string) ([]byte, error) {
	s, err := w.objectStore()
	if err != nil {
		return nil, err
	}
	defer s.close()
	type commit struct{ id, tree, data string }
	var line []commit
	for c := head; c != base; {
		if len(line) == smallPackCommits {
			return nil, errNotSmall
		}
		data, err := s.readAs(c, objCommit)
		if err != nil {
			return nil, err
		}
		tree, parents, err := parseCommit(data)
		if err != nil {
			return nil, err
		}
		if len(parents) != 1 {
			return nil, errNotSmall
		}
		line = append(line, commit{c, tree, string(data)})
		c = parents[0]
	}
	if len(line) == 0 {
		return nil, errNotSmall
	}
	bdata, err := s.readAs(base, objCommit)
	if err != nil {
		return nil, err
	}
	parentTree, _, err := parseCommit(bdata)
	if err != nil {
		return nil, err
	}
	p := &packList{sent: map[string]bool{}, s: s}
	for i := len(line) - 1; i >= 0; i-- {
		c := line[i]
		if err := p.add(c.id, objCommit, []byte(c.data)); err != nil {
			return nil, err
		}
		if err := p.tree(c.tree, parentTree, 0); err != nil {
			return nil, err
		}
		parentTree = c.tree
	}
	return p.write()
}

// packList is what a small pack holds, in order.
type packList struct {
	s     *objectStore
	sent  map[string]bool
	objs  []packObj
	bytes int
}

type packObj struct {
	typ  objType
	data []byte
}

func (p *packList) add(id string, typ objType, data []byte) error {
	p.sent[id] = true
	p.objs = append(p.objs, packObj{typ, data})
	p.bytes += len(data)
	if len(p.objs) > smallPackObjects || p.bytes > smallPackBytes {
		return errNotSmall
	}
	return nil
}

// tree adds tree t and what it holds that parent tree pt (at the same
// path, "" for none) does not: an entry that is pt's at the same name is
// in the parent commit's history already, so in the base's or in this
// pack. depth bounds the recursion with the object bound.
func (p *packList) tree(t, pt string, depth int) error {
	if t == pt || p.sent[t] {
		return nil
	}
	if depth > smallPackObjects {
		return errNotSmall
	}
	data, err := p.s.readAs(t, objTree)
	if err != nil {
		return err
	}
	if err := p.add(t, objTree, data); err != nil {
		return err
	}
	ents, err := parseTree(data)
	if err != nil {
		return err
	}
	var old map[string]treeEntry
	if pt != "" {
		pdata, err := p.s.readAs(pt, objTree)
		if err != nil {
			return err
		}
		pents, err := parseTree(pdata)
		if err != nil {
			return err
		}
		old = make(map[string]treeEntry, len(pents))
		for _, e := range pents {
			old[e.name] = e
		}
	}
	for _, e := range ents {
		pe, had := old[e.name]
		if e.mode == "160000" || (had && pe.id == e.id) {
			continue // a submodule's commit is no object of this repository
		}
		if e.mode == "40000" {
			sub := ""
			if had && pe.mode == "40000" {
				sub = pe.id
			}
			if err := p.tree(e.id, sub, depth+1); err != nil {
				return err
			}
			continue
		}
		if p.sent[e.id] {
			continue
		}
		data, err := p.s.readAs(e.id, objBlob)
		if err != nil {
			return err
		}
		if err := p.add(e.id, objBlob, data); err != nil {
			return err
		}
	}
	return nil
}

// write is the pack of the list: version 2, every object whole and
// deflated, the SHA-1 trailer.
func (p *packList) write() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString("PACK")
	binary.Write(&buf, binary.BigEndian, uint32(2))
	binary.Write(&buf, binary.BigEndian, uint32(len(p.objs)))
	// Stored, not compressed: the pack is at most smallPackBytes, goes
	// over a local socket, and is repacked by the bus host's
	// housekeeping; deflating small objects one by one costs more time
	// than anything it saves.
	z, _ := zlib.NewWriterLevel(nil, zlib.NoCompression)
	for _, o := range p.objs {
		buf.Write(gitobj.AppendEntryHeader(nil, int(o.typ), uint64(len(o.data))))
		z.Reset(&buf)
		if _, err := z.Write(o.data); err != nil {
			return nil, err
		}
		if err := z.Close(); err != nil {
			return nil, err
		}
	}
	sum := sha1.Sum(buf.Bytes())
	buf.Write(sum[:])
	return buf.Bytes(), nil
}

// treeEntry is one entry of a tree object.
type treeEntry struct {
	mode, name, id string
}

func parseTree(data []byte) ([]treeEntry, error) {
	var ents []treeEntry
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		nul := bytes.IndexByte(data, 0)
		if sp <= 0 || nul < sp || len(data) < nul+1+gitobj.HashLen {
			return nil, fmt.Errorf("%w: a malformed tree", errNotSmall)
		}
		ents = append(ents, treeEntry{mode: string(data[:sp]), name: string(data[sp+1 : nul]), id: hex.EncodeToString(data[nul+1 : nul+1+gitobj.HashLen])})
		data = data[nul+1+gitobj.HashLen:]
	}
	return ents, nil
}

// parseCommit returns a commit's tree and parents, read as git reads
// them: the tree on the first line, the parents on the lines right after
// it. A "tree" or "parent" header further down is no link (fsck lets it
// pass); taken for one, it would pack a tree HEAD does not have instead
// of the one it has.
func parseCommit(data []byte) (tree string, parents []string, err error) {
	line, data, _ := bytes.Cut(data, []byte("\n"))
	t, ok := bytes.CutPrefix(line, []byte("tree "))
	if !ok || !isObjectID(string(t)) {
		return "", nil, fmt.Errorf("%w: a commit without a tree", errNotSmall)
	}
	for {
		line, rest, _ := bytes.Cut(data, []byte("\n"))
		p, ok := bytes.CutPrefix(line, []byte("parent "))
		if !ok {
			return string(t), parents, nil
		}
		if !isObjectID(string(p)) {
			return "", nil, fmt.Errorf("%w: a malformed parent", errNotSmall)
		}
		parents = append(parents, string(p))
		data = rest
	}
}

// objectStore reads a worker's objects in process: loose ones from their
// files, packed ones through each pack's mapped index (internal/gitobj).
type objectStore struct {
	dir    string // <common>/objects
	packs  []*storePack
	listed bool
	read   int           // bytes inflated so far
	z      io.ReadCloser // the one inflater, reset for each object
	br     *bufio.Reader // the one buffer under it
	// seen holds what was read, by id and by pack entry: a parent's tree
	// is read again as the next commit's parent, and the delta chains of
	// one directory's trees share their bases. Bounded by smallPackRead.
	seen    map[string]object
	entries map[entryKey]object
}

type object struct {
	typ  objType
	data []byte
}

type entryKey struct {
	p   *storePack
	off int64
}

type storePack struct {
	idx *gitobj.Index
	f   *os.File
}

// objectStore opens the repository's objects, or errNotSmall when they
// are not all here (alternates) or its history is not what its commits
// say (grafts, a shallow clone), or it hashes other than with SHA-1.
func (w *workRepo) objectStore() (*objectStore, error) {
	if w == nil {
		return nil, errNotSmall
	}
	for _, f := range []string{"objects/info/alternates", "info/grafts", "shallow"} {
		if _, err := os.Lstat(filepath.Join(w.common, f)); err == nil {
			return nil, fmt.Errorf("%w: %s", errNotSmall, f)
		}
	}
	if b, err := readRegular(filepath.Join(w.common, "config"), smallFile); err != nil || bytes.Contains(bytes.ToLower(b), []byte("objectformat")) {
		return nil, fmt.Errorf("%w: the object format", errNotSmall)
	}
	return &objectStore{dir: filepath.Join(w.common, "objects"), seen: map[string]object{}, entries: map[entryKey]object{}}, nil
}

func (s *objectStore) close() {
	for _, p := range s.packs {
		p.f.Close()
	}
}

// readAs reads object id, which must be of type want, and checks that
// its content hashes to id.
func (s *objectStore) readAs(id string, want objType) ([]byte, error) {
	if o, ok := s.seen[id]; ok {
		if o.typ != want {
			return nil, fmt.Errorf("%w: %s is a %s, not a %s", errNotSmall, id, typeNames[o.typ], typeNames[want])
		}
		return o.data, nil
	}
	h, err := hex.DecodeString(id)
	if err != nil || len(h) != gitobj.HashLen {
		return nil, fmt.Errorf("%w: object id %q", errNotSmall, id)
	}
	typ, data, err := s.loose(id)
	if errors.Is(err, os.ErrNotExist) {
		typ, data, err = s.packed([gitobj.HashLen]byte(h), 0)
	}
	if err != nil {
		return nil, err
	}
	if typ != want {
		return nil, fmt.Errorf("%w: %s is a %s, not a %s", errNotSmall, id, typeNames[typ], typeNames[want])
	}
	sum := sha1.New()
	fmt.Fprintf(sum, "%s %d\x00", typeNames[typ], len(data))
	sum.Write(data)
	if !bytes.Equal(sum.Sum(nil), h) {
		return nil, fmt.Errorf("%w: %s does not read back to its id", errNotSmall, id)
	}
	s.seen[id] = object{typ, data}
	return data, nil
}

// loose reads a loose object; os.ErrNotExist when there is none.
func (s *objectStore) loose(id string) (objType, []byte, error) {
	f, err := openRegular(filepath.Join(s.dir, id[:2], id[2:]))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil, err
	}
	if err != nil {
		return 0, nil, fmt.Errorf("%w: loose %s: %v", errNotSmall, id, err)
	}
	defer f.Close()
	z, err := s.inflater(f)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: loose %s: %v", errNotSmall, id, err)
	}
	var head [32]byte
	n, _ := io.ReadFull(z, head[:])
	nul := bytes.IndexByte(head[:n], 0)
	name, size, ok := strings.Cut(string(head[:max(nul, 0)]), " ")
	typ := objType(0)
	for t, s := range typeNames {
		if s == name {
			typ = t
		}
	}
	sz, err := strconv.Atoi(size)
	if nul < 0 || !ok || typ == 0 || err != nil || sz < 0 {
		return 0, nil, fmt.Errorf("%w: loose %s: a malformed header", errNotSmall, id)
	}
	if err := s.spend(sz); err != nil {
		return 0, nil, err
	}
	if fi, err := f.Stat(); err != nil || fi.Size() > deflatedMax(nul+1+sz) {
		return 0, nil, fmt.Errorf("%w: loose %s: longer than its size deflated", errNotSmall, id)
	}
	data := make([]byte, sz)
	got := copy(data, head[nul+1:n])
	if _, err := io.ReadFull(z, data[got:]); err != nil {
		return 0, nil, fmt.Errorf("%w: loose %s: %v", errNotSmall, id, err)
	}
	return typ, data, nil
}

// openRegular opens the regular file at path (gitobj.OpenRegular).
func openRegular(path string) (*os.File, error) {
	f, _, err := gitobj.OpenRegular(path)
	return f, err
}

func (s *objectStore) spend(n int) error {
	s.read += n
	if n > smallPackRead || s.read > smallPackRead {
		return errNotSmall
	}
	return nil
}

// packed reads object h from the first pack that holds it.
func (s *objectStore) packed(h [gitobj.HashLen]byte, depth int) (objType, []byte, error) {
	if !s.listed {
		s.listed = true
		idxs, _ := filepath.Glob(filepath.Join(s.dir, "pack", "pack-*.idx"))
		if len(idxs) > smallPackPacks {
			return 0, nil, fmt.Errorf("%w: %d packs", errNotSmall, len(idxs))
		}
		for _, path := range idxs {
			var ix *gitobj.Index
			// Open reads the fan-out it mapped: truncated meanwhile, it
			// faults too.
			if err := mapped(path, func() (err error) { ix, err = gitobj.Open(path); return err }); err != nil {
				return 0, nil, err
			}
			f, err := openRegular(strings.TrimSuffix(path, ".idx") + ".pack")
			if err != nil {
				return 0, nil, fmt.Errorf("%w: %v", errNotSmall, err)
			}
			s.packs = append(s.packs, &storePack{ix, f})
		}
	}
	for _, p := range s.packs {
		off, err := p.find(h)
		if err != nil {
			return 0, nil, err
		}
		if off >= 0 {
			return s.entry(p, off, depth)
		}
	}
	return 0, nil, fmt.Errorf("%w: %x is not here", errNotSmall, h)
}

// find is h's offset in pack p, -1 when p does not hold it.
func (p *storePack) find(h [gitobj.HashLen]byte) (off int64, err error) {
	err = mapped(p.idx.Path, func() error {
		pos := p.idx.Find(h)
		if pos < 0 {
			off = -1
			return nil
		}
		off, err = p.idx.Offset(pos)
		return err
	})
	return off, err
}

// mapped runs read, which reads the mapped index at path. The worker may
// truncate it while it is read: the read then faults, which is a push
// for pack-objects (errNotSmall), not a crash.
func mapped(path string, read func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault {
				panic(r)
			}
			err = fmt.Errorf("%w: %s: %v", errNotSmall, path, r)
		}
	}()
	if err := read(); err != nil {
		return fmt.Errorf("%w: %v", errNotSmall, err)
	}
	return nil
}

// entry reads the object at offset off of pack p, resolving its deltas.
func (s *objectStore) entry(p *storePack, off int64, depth int) (objType, []byte, error) {
	k := entryKey{p, off}
	if o, ok := s.entries[k]; ok {
		return o.typ, o.data, nil
	}
	typ, data, err := s.readEntry(p, off, depth)
	if err == nil {
		s.entries[k] = object{typ, data}
	}
	return typ, data, err
}

func (s *objectStore) readEntry(p *storePack, off int64, depth int) (objType, []byte, error) {
	if depth > smallPackDepth || off < 12 {
		return 0, nil, errNotSmall
	}
	var hdr [32]byte
	n, err := p.f.ReadAt(hdr[:], off)
	if n == 0 {
		return 0, nil, fmt.Errorf("%w: %v", errNotSmall, err)
	}
	e, ok := gitobj.ParseEntry(hdr[:n])
	if !ok || e.Size > smallPackRead {
		return 0, nil, errNotSmall
	}
	typ, at, size := objType(e.Type), off+int64(e.Len), int(e.Size)
	switch typ {
	case objCommit, objTree, objBlob, objTag:
		data, err := s.inflate(p, at, size)
		return typ, data, err
	case objOfs, objRef:
		if typ == objOfs && (e.Back <= 0 || e.Back >= off) {
			return 0, nil, errNotSmall
		}
		delta, err := s.inflate(p, at, size)
		if err != nil {
			return 0, nil, err
		}
		var btyp objType
		var base []byte
		if typ == objOfs {
			btyp, base, err = s.entry(p, off-e.Back, depth+1)
		} else {
			btyp, base, err = s.packed(e.Base, depth+1)
		}
		if err != nil {
			return 0, nil, err
		}
		return s.patch(btyp, base, delta)
	}
	return 0, nil, fmt.Errorf("%w: object type %d", errNotSmall, typ)
}

// patch applies delta to base. The size the delta says it makes is
// spent first: a delta's copies can make far more than its own bytes.
func (s *objectStore) patch(typ objType, base, delta []byte) (objType, []byte, error) {
	_, n := binary.Uvarint(delta) // the base's size
	if n <= 0 {
		return 0, nil, errNotSmall
	}
	size, m := binary.Uvarint(delta[n:])
	if m <= 0 || size > smallPackRead {
		return 0, nil, errNotSmall
	}
	if err := s.spend(int(size)); err != nil {
		return 0, nil, err
	}
	data, err := packfile.PatchDelta(base, delta)
	if err != nil || uint64(len(data)) != size {
		return 0, nil, fmt.Errorf("%w: a delta that does not apply: %v", errNotSmall, err)
	}
	return typ, data, nil
}

// inflater is the store's one zlib reader, reset to read from r (a new
// reader each time would allocate and clear its 32 KiB window).
func (s *objectStore) inflater(r io.Reader) (io.Reader, error) {
	if s.br == nil {
		s.br = bufio.NewReaderSize(r, 4096)
	} else {
		s.br.Reset(r)
	}
	r = s.br
	if s.z == nil {
		z, err := zlib.NewReader(r)
		s.z = z
		return z, err
	}
	return s.z, s.z.(zlib.Resetter).Reset(r, nil)
}

// deflatedMax bounds the deflated length of n bytes: zlib's own bound
// (n + n/4096 + n/16384 + 13, header and trailer in), with room. A
// stream the worker padded (empty blocks inflate to nothing) is read no
// further: the bytes inflated bound the bytes read.
func deflatedMax(n int) int64 { return int64(n) + int64(n)>>6 + 64 }

// inflate reads size bytes deflated at offset off of pack p.
func (s *objectStore) inflate(p *storePack, off int64, size int) ([]byte, error) {
	if err := s.spend(size); err != nil {
		return nil, err
	}
	z, err := s.inflater(io.NewSectionReader(p.f, off, deflatedMax(size)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotSmall, err)
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(z, data); err != nil {
		return nil, fmt.Errorf("%w: %v", errNotSmall, err)
	}
	return data, nil
}
