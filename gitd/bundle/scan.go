package bundle

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitobj"
)

// Limits bound the inflated size of each object a pack may carry, by type.
// A zero field is no bound for that type. They are checked while the pack
// streams in, before git reads the entry they refuse: a hostile pack of a
// megabyte may inflate to gigabytes, and index-pack allocates an object's
// whole size as soon as it reads the entry's header.
type Limits struct {
	BlobBytes   int64 // --max-object-bytes
	CommitBytes int64 // --max-commit-bytes, for commits and tags
	TreeBytes   int64 // --max-tree-bytes
	// Objects bounds the entries of one pack (--max-pack-objects): git's
	// index-pack keeps some hundred bytes per object, and this scanner 32,
	// so a pack of tiny objects would otherwise cost memory by its count.
	Objects int64
	// InflatedBytes bounds the sum of the inflated sizes the pack's
	// entries declare, a delta counted by its result (--max-push-inflated):
	// each object within its own bound, a pack of a few hundred KB of
	// deltas against one base still declares gigabytes, which index-pack
	// would build and hash one after another.
	InflatedBytes int64
}

// Enabled reports whether any bound is set.
func (l Limits) Enabled() bool {
	return l.BlobBytes > 0 || l.CommitBytes > 0 || l.TreeBytes > 0 || l.Objects > 0 || l.InflatedBytes > 0
}

// forType returns the bound of an object type and the flag that sets it.
func (l Limits) forType(t objType) (int64, string) {
	switch t {
	case objCommit, objTag:
		return l.CommitBytes, "--max-commit-bytes"
	case objTree:
		return l.TreeBytes, "--max-tree-bytes"
	case objBlob:
		return l.BlobBytes, "--max-object-bytes"
	}
	return l.largest()
}

// largest is the bound of an object whose type is not known yet (a delta's
// data, a delta against a base still unresolved): the loosest of the three.
func (l Limits) largest() (int64, string) {
	if l.BlobBytes <= 0 || l.CommitBytes <= 0 || l.TreeBytes <= 0 {
		return 0, ""
	}
	n, flag := l.BlobBytes, "--max-object-bytes"
	if l.TreeBytes > n {
		n, flag = l.TreeBytes, "--max-tree-bytes"
	}
	if l.CommitBytes > n {
		n, flag = l.CommitBytes, "--max-commit-bytes"
	}
	return n, flag
}

// smallest is the size under which an object passes whatever its type.
func (l Limits) smallest() int64 {
	n := int64(-1)
	for _, v := range []int64{l.BlobBytes, l.CommitBytes, l.TreeBytes} {
		if v > 0 && (n < 0 || v < n) {
			n = v
		}
	}
	return n
}

type objType byte

// Pack entry types (gitformat-pack(5)).
const (
	objCommit   objType = 1
	objTree     objType = 2
	objBlob     objType = 3
	objTag      objType = 4
	objOfsDelta objType = gitobj.EntryOfsDelta
	objRefDelta objType = gitobj.EntryRefDelta
	objUnknown  objType = 0 // a delta whose base's type is not known
)

func (t objType) String() string {
	switch t {
	case objCommit:
		return "commit"
	case objTree:
		return "tree"
	case objBlob:
		return "blob"
	case objTag:
		return "tag"
	case objOfsDelta, objRefDelta:
		return "delta"
	}
	return "object"
}

// BaseTypes answers the type of objects the repository already holds, by
// id ("commit", "tree", "blob", "tag"; absent from the map: not there). The
// scanner asks it, once at the end of the pack, for the bases of large
// deltas sent against the repository (a thin pack's REF_DELTA entries).
type BaseTypes func(ids []string) (map[string]string, error)

// scanner reads a pack stream, checks every entry's inflated size against
// its Limits, and passes on to dst only the bytes it has approved: an entry
// header reaches git only after its size passed, so git never allocates an
// object the limits refuse (gitobj's stream.go says why this is not
// go-git's packfile.Scanner). The pack's trailing checksum is held back until
// the whole pack passed: index-pack resolves deltas only after it, so a
// delta's result, whose type may be known only at the end, is checked before
// git builds it.
type scanner struct {
	lim   Limits
	bases BaseTypes
	rec   *recorder
	br    *bufio.Reader
	z     *gitobj.Inflater

	entries []entry        // in pack order, so by ascending offset
	refBase map[int]string // base id of each REF_DELTA entry of unknown type
	pending []int          // large deltas of unknown type, checked at the end
	// inflated sums the declared inflated sizes so far (Limits.InflatedBytes).
	inflated int64
	// refCounted: the REF_DELTA bases already counted in inflated.
	refCounted map[string]bool
}

// entry is what the scanner keeps of each pack entry: 24 bytes, where
// index-pack keeps several times that.
type entry struct {
	off, base int64 // base: an OFS_DELTA's base offset, else -1
	size      int64 // inflated size; a delta's result size
	typ       objType
}

// recorder sits between the source and the scanner's buffered reader: it
// keeps what it read until the scanner approves it, and writes the approved
// part to git each time the scanner needs more input.
type recorder struct {
	src     io.Reader
	dst     io.Writer
	held    []byte // source bytes from offset flushed on
	flushed int64  // bytes written to dst
	read    int64  // bytes read from src
	safe    int64  // bytes the scanner approved
	werr    error  // dst failed: git is gone
}

func (r *recorder) Read(p []byte) (int, error) {
	if err := r.flush(); err != nil {
		return 0, err
	}
	n, err := r.src.Read(p)
	r.held = append(r.held, p[:n]...)
	r.read += int64(n)
	return n, err
}

// flush writes the approved bytes held to dst.
func (r *recorder) flush() error {
	if r.werr != nil {
		return r.werr
	}
	n := r.safe - r.flushed
	if n <= 0 {
		return nil
	}
	if _, err := r.dst.Write(r.held[:n]); err != nil {
		r.werr = &writeError{err}
		return r.werr
	}
	r.flushed += n
	// Keep the buffer's capacity: slide the held tail to its front.
	r.held = r.held[:copy(r.held, r.held[n:])]
	return nil
}

// writeError is git's stdin failing: git exited, and its own error says why.
type writeError struct{ err error }

func (e *writeError) Error() string { return "write to git: " + e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// scanPack copies the pack from src to dst, checking it as it goes.
func scanPack(src io.Reader, dst io.Writer, lim Limits, bases BaseTypes) error {
	rec := &recorder{src: src, dst: dst}
	s := &scanner{lim: lim, bases: bases, rec: rec, br: bufio.NewReaderSize(rec, 64<<10), z: gitobj.NewInflater(32 << 10)}
	if err := s.scan(); err != nil {
		return err
	}
	// Everything read so far passed: release it, the trailer with it, and
	// pass on whatever follows as is (index-pack judges it).
	rec.safe = rec.read
	if err := rec.flush(); err != nil {
		return err
	}
	_, err := io.Copy(dst, src)
	return err
}

// consumed is the offset in the pack of the scanner's next byte.
func (s *scanner) consumed() int64 { return s.rec.read - int64(s.br.Buffered()) }

func (s *scanner) scan() error {
	var hdr [12]byte
	if _, err := io.ReadFull(s.br, hdr[:]); err != nil {
		return packErr(err, "pack header")
	}
	if string(hdr[:4]) != "PACK" {
		return &PackError{Msg: "no pack after the bundle header"}
	}
	if v := binary.BigEndian.Uint32(hdr[4:8]); v != 2 && v != 3 {
		return &PackError{Msg: fmt.Sprintf("pack version %d (want 2 or 3)", v)}
	}
	count := binary.BigEndian.Uint32(hdr[8:12])
	if s.lim.Objects > 0 && int64(count) > s.lim.Objects {
		return errdefs.ResourceExhausted(errdefs.PackTooManyObjects,
			"the pack holds %d objects, over the limit of %d (bushostd --max-pack-objects)", count, s.lim.Objects).
			With("limit", s.lim.Objects).With("size", count)
	}
	s.rec.safe = s.consumed()
	for i := 0; i < int(count); i++ {
		if err := s.entry(i); err != nil {
			return err
		}
	}
	return s.resolvePending()
}

// entry checks pack entry i (0-based) and reads past it.
func (s *scanner) entry(i int) error {
	off := s.consumed()
	h, err := gitobj.ReadEntry(s.br)
	if errors.Is(err, gitobj.ErrEntryHeader) {
		return &PackError{Msg: fmt.Sprintf("entry %d at offset %d: %v", i+1, off, err)}
	}
	if err != nil {
		return packErr(err, fmt.Sprintf("entry %d", i+1))
	}
	typ, size := objType(h.Type), int64(h.Size)
	if h.Size >= 1<<63 {
		return &PackError{Msg: fmt.Sprintf("entry %d at offset %d: size header too long", i+1, off)}
	}
	base, baseOff := objUnknown, int64(-1)
	var baseID string
	switch typ {
	case objCommit, objTree, objBlob, objTag:
		if lim, flag := s.lim.forType(typ); lim > 0 && size > lim {
			return tooLarge(i, off, typ, size, lim, flag)
		}
		if err := s.addInflated(i, off, size); err != nil {
			return err
		}
	case objOfsDelta:
		if rel := h.Back; rel <= 0 || rel > off {
			return &PackError{Msg: fmt.Sprintf("entry %d at offset %d: delta base offset out of the pack", i+1, off)}
		}
		baseOff = off - h.Back
		base = s.typeAt(baseOff)
	case objRefDelta:
		baseID = hex.EncodeToString(h.Base[:])
	default:
		return &PackError{Msg: fmt.Sprintf("entry %d at offset %d has unknown type %d", i+1, off, typ)}
	}
	if typ == objOfsDelta || typ == objRefDelta {
		// index-pack holds a delta's data whole until it resolves it.
		if lim, flag := s.lim.largest(); lim > 0 && size > lim {
			return tooLarge(i, off, typ, size, lim, flag)
		}
	}
	// The header passed: git may read it.
	s.rec.safe = s.consumed()
	baseSize, result, err := s.inflate(i, off, size, typ == objOfsDelta || typ == objRefDelta)
	if err != nil {
		return err
	}
	e := entry{off: off, base: baseOff, size: size, typ: typ}
	if typ == objOfsDelta || typ == objRefDelta {
		// Counted before the trailer reaches git, so before index-pack
		// builds any delta's result.
		if err := s.addInflated(i, off, result); err != nil {
			return err
		}
		// A REF_DELTA's base is read by index-pack, and one the
		// repository holds is appended to the pack (--fix-thin): it counts
		// too, once, by the size the delta declares for it (index-pack
		// refuses a delta whose base is of another size). Else a few
		// bytes of deltas would make it inflate and store again every
		// large object of the repository.
		if typ == objRefDelta && !s.refCounted[baseID] {
			if s.refCounted == nil {
				s.refCounted = map[string]bool{}
			}
			s.refCounted[baseID] = true
			if err := s.addInflated(i, off, baseSize); err != nil {
				return err
			}
		}
		e.typ, e.size = base, result
		if lim, flag := s.lim.forType(base); base != objUnknown && lim > 0 && result > lim {
			return tooLarge(i, off, base, result, lim, flag)
		}
		if lim, flag := s.lim.largest(); lim > 0 && result > lim {
			return tooLarge(i, off, typ, result, lim, flag)
		}
		if base == objUnknown {
			if baseID != "" {
				if s.refBase == nil {
					s.refBase = map[int]string{}
				}
				s.refBase[i] = baseID
			}
			if small := s.lim.smallest(); small >= 0 && result > small {
				s.pending = append(s.pending, i)
			}
		}
	}
	s.entries = append(s.entries, e)
	return nil
}

// addInflated adds entry i's declared inflated size to the pack's sum and
// refuses the pack once the sum is over Limits.InflatedBytes.
func (s *scanner) addInflated(i int, off, size int64) error {
	s.inflated += size
	if lim := s.lim.InflatedBytes; lim > 0 && s.inflated > lim {
		return errdefs.ResourceExhausted(errdefs.PushInflatedTooLarge,
			"the pushed objects inflate to more than %d bytes (bushostd --max-push-inflated): %d bytes by pack entry %d (offset %d), counting each delta by its result; push the history in parts, or ask the host to raise the bound",
			lim, s.inflated, i+1, off).
			With("limit", lim).With("size", s.inflated).With("entry", i+1).With("flag", "--max-push-inflated")
	}
	return nil
}

// typeAt is the type of the entry at offset off, objUnknown if none starts
// there or its type is not known yet.
func (s *scanner) typeAt(off int64) objType {
	if i, ok := s.indexAt(off); ok {
		return s.entries[i].typ
	}
	return objUnknown
}

func (s *scanner) indexAt(off int64) (int, bool) {
	i := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].off >= off })
	return i, i < len(s.entries) && s.entries[i].off == off
}

// inflate reads past an entry's zlib stream, which must inflate to exactly
// size bytes, approving its bytes as it goes. For a delta it returns the
// base and result sizes from the delta's own header.
func (s *scanner) inflate(i int, off, size int64, delta bool) (base, result int64, err error) {
	var out int64
	result = -1
	err = s.z.Inflate(s.br, func(b []byte) error {
		if delta && out == 0 && len(b) > 0 {
			base, result = gitobj.DeltaSizes(b)
		}
		out += int64(len(b))
		if out > size {
			return &PackError{Msg: fmt.Sprintf("entry %d at offset %d inflates past its declared %d bytes", i+1, off, size)}
		}
		s.rec.safe = s.consumed()
		return nil
	})
	if err != nil { // a *PackError of the callback's passes packErr as is
		return 0, 0, packErr(err, fmt.Sprintf("entry %d at offset %d", i+1, off))
	}
	if out != size {
		return 0, 0, &PackError{Msg: fmt.Sprintf("entry %d at offset %d inflates to %d bytes, not its declared %d", i+1, off, out, size)}
	}
	if delta && (result < 0 || base < 0) {
		return 0, 0, &PackError{Msg: fmt.Sprintf("entry %d at offset %d: delta without a header", i+1, off)}
	}
	return base, result, nil
}

// resolvePending checks the large deltas whose type was unknown when they
// were read. The bases of REF_DELTA entries are looked up in the
// repository, and types flow from them along OFS_DELTA chains in pack
// order. A delta whose base is not in the repository (an object of this
// pack named by id, which git's own packs never do) cannot be bounded by
// its type and is refused.
func (s *scanner) resolvePending() error {
	if len(s.pending) == 0 {
		return nil
	}
	ids := make([]string, 0, len(s.refBase))
	for _, id := range s.refBase {
		ids = append(ids, id)
	}
	known := map[string]string{}
	if len(ids) > 0 && s.bases != nil {
		var err error
		if known, err = s.bases(ids); err != nil {
			return fmt.Errorf("look up delta bases: %w", err)
		}
	}
	for i := range s.entries {
		e := &s.entries[i]
		if e.typ != objUnknown {
			continue
		}
		if id, ok := s.refBase[i]; ok {
			e.typ = typeNamed(known[id])
		} else if j, ok := s.indexAt(e.base); ok && e.base >= 0 {
			e.typ = s.entries[j].typ
		}
	}
	for _, i := range s.pending {
		e := s.entries[i]
		if e.typ == objUnknown {
			lim := s.lim.smallest()
			return errdefs.ResourceExhausted(errdefs.ObjectTooLarge,
				"pack entry %d (offset %d) is a delta of %d bytes against a base that is not in the repository, so its type and limit are unknown; the smallest object limit is %d bytes (send deltas against objects of the same pack by offset, as git does)",
				i+1, e.off, e.size, lim).With("limit", lim).With("size", e.size).With("entry", i+1)
		}
		if lim, flag := s.lim.forType(e.typ); lim > 0 && e.size > lim {
			return tooLarge(i, e.off, e.typ, e.size, lim, flag)
		}
	}
	return nil
}

func typeNamed(s string) objType {
	switch s {
	case "commit":
		return objCommit
	case "tree":
		return objTree
	case "blob":
		return objBlob
	case "tag":
		return objTag
	}
	return objUnknown
}

// tooLarge is the refusal of one entry: it names the entry (its position
// and offset in the pack, and its type; its id is not known before git
// hashed it, which is what the refusal prevents) and the limit.
func tooLarge(i int, off int64, t objType, size, lim int64, flag string) error {
	what := t.String()
	return errdefs.ResourceExhausted(errdefs.ObjectTooLarge, "pack entry %d (offset %d) is a %s of %d bytes, over the limit of %d bytes (bushostd %s)", i+1, off, what, size, lim, flag).
		With("limit", lim).With("size", size).With("type", what).With("entry", i+1).With("flag", flag)
}

// packErr names where a read of the pack failed. A source error that is
// not the pack's own (the stream was cut, over its size limit) is returned
// as is, for the caller to report.
func packErr(err error, where string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &PackError{Msg: where + ": pack ends early (truncated)"}
	}
	var we *writeError
	if errors.As(err, &we) {
		return err
	}
	if gitobj.Corrupt(err) {
		return &PackError{Msg: where + ": " + err.Error()}
	}
	return err
}
