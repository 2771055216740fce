package gitd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"

	"github.com/bushost/bushost/internal/gitobj"
)

// view is one request's reads of a repository's objects: its own, then
// its pool's, and never anything else. Packed objects are read through
// the daemon's mapped pack indexes (packindex.go) and go-git's pack
// reader; loose ones from their files. A view serves one goroutine (its
// delta-base cache is its own).
type view struct {
	r    repo
	dirs []viewDir // front, then r.visible(), own first
	// front are object directories read before r's own: a landing's
	// quarantine (openWith).
	// maxObject bounds EncodedObject: a larger object is not read here.
	maxObject int64
	// packs are the pack indexes listed when the view was opened (or last
	// reloaded): a housekeeping repack that replaced them since makes a
	// read miss (the object moved to a new pack, or the pack is gone);
	// reload then lists them afresh, once per change.
	packs string
	bases cache.Object // delta bases, shared by the view's reads
	front []string
}

// viewDir is one object directory of a view and its packs.
type viewDir struct {
	objects string
	packs   []viewPack
}

// viewPack is a pack of a view, its index mapped on the first read that
// looks there (a repository between housekeeping runs may hold many packs,
// and most reads find what they want in the first few).
type viewPack struct {
	path string     // the .idx
	idx  *packIndex // nil until mapped
	bad  bool       // unreadable: a read skips it, and a reload lists afresh
	pack string     // the .pack beside it
}

// index maps p's index once.
func (p *viewPack) index() *packIndex {
	if p.idx == nil && !p.bad {
		ix, err := indexes.get(p.path)
		if err != nil {
			p.bad = true // removed meanwhile, or corrupt
			return nil
		}
		p.idx = ix
	}
	return p.idx
}

// open returns a view of r for reads.
func (r repo) open() *view {
	v := &view{r: r, maxObject: r.st.limits.MaxObjectBytes, bases: cache.NewObjectLRU(viewBaseCache)}
	v.list()
	return v
}

// openWith returns a view of r that reads the object directories front
// (a quarantine of r's) before r's own.
func (r repo) openWith(front ...string) *view {
	v := r.open()
	v.front = front
	v.list()
	return v
}

// visible is the object directories v reads, in order.
func (v *view) visible() []string {
	if len(v.front) == 0 {
		return v.r.visible()
	}
	return append(v.front[:len(v.front):len(v.front)], v.r.visible()...)
}

// viewBaseCache bounds the delta bases one view keeps.
const viewBaseCache = 16 * cache.MiByte

// list reads r's object directories' packs into the view.
func (v *view) list() {
	var names strings.Builder
	v.dirs = v.dirs[:0]
	for _, dir := range v.visible() {
		d := viewDir{objects: dir}
		for _, idx := range indexNames(dir, &names) {
			pack := strings.TrimSuffix(idx, ".idx") + ".pack"
			d.packs = append(d.packs, viewPack{path: filepath.Join(dir, "pack", idx), pack: filepath.Join(dir, "pack", pack)})
		}
		v.dirs = append(v.dirs, d)
	}
	v.packs = names.String()
}

// indexNames lists the pack indexes of the object directory dir, and
// writes them to list, then a "/".
func indexNames(dir string, list *strings.Builder) []string {
	ents, _ := os.ReadDir(filepath.Join(dir, "pack"))
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".idx") {
			out = append(out, e.Name())
			list.WriteString(e.Name())
		}
	}
	list.WriteByte('/')
	return out
}

// packList names the pack indexes of the object directories dirs.
func packList(dirs []string) string {
	var b strings.Builder
	for _, dir := range dirs {
		indexNames(dir, &b)
	}
	return b.String()
}

// maxReloads bounds the reloads of one read (packs may keep changing
// while pushes land).
const maxReloads = 3

// reload lists v's packs again when they changed since, and says whether
// they did (then a failed read is worth a retry).
func (v *view) reload() bool {
	if packList(v.visible()) == v.packs {
		return false
	}
	v.list()
	return true
}

// where is an object found: a pack and its offset, or a loose file.
type where struct {
	pack   *viewPack
	offset int64
	loose  string
}

// locate finds h in v's packs, then among its loose objects.
func (v *view) locate(h plumbing.Hash) (where, error) {
	for i := range v.dirs {
		d := &v.dirs[i]
		for j := range d.packs {
			p := &d.packs[j]
			ix := p.index()
			if ix == nil {
				continue
			}
			if off, err := ix.FindOffset(h); err == nil {
				return where{pack: p, offset: off}, nil
			} else if !errors.Is(err, plumbing.ErrObjectNotFound) {
				return where{}, err
			}
		}
	}
	hex := h.String()
	for _, d := range v.dirs {
		path := filepath.Join(d.objects, hex[:2], hex[2:])
		if _, err := os.Lstat(path); err == nil {
			return where{loose: path}, nil
		}
	}
	return where{}, plumbing.ErrObjectNotFound
}

// retry runs read, then again after each reload that found the packs
// changed, at most maxReloads times.
func (v *view) retry(read func() error) error {
	for i := 0; ; i++ {
		err := read()
		if err == nil || errors.Is(err, errUndecided) || i == maxReloads || !v.reload() {
			return err
		}
	}
}

// HasEncodedObject is nil when r may read h.
func (v *view) HasEncodedObject(h plumbing.Hash) error {
	return v.retry(func() error {
		_, err := v.locate(h)
		return err
	})
}

// EncodedObjectSize is h's size from its header.
func (v *view) EncodedObjectSize(h plumbing.Hash) (int64, error) {
	var n int64
	err := v.retry(func() error {
		var err error
		n, _, err = v.header(h)
		return err
	})
	if err != nil {
		return 0, plumbing.ErrObjectNotFound
	}
	return n, nil
}

// header is h's size and where it is.
func (v *view) header(h plumbing.Hash) (int64, where, error) {
	w, err := v.locate(h)
	if err != nil {
		return 0, w, err
	}
	if w.loose != "" {
		_, n, err := gitobj.LooseHeader(w.loose)
		return n, w, err
	}
	var n int64
	err = v.withPack(w.pack, func(p *packfile.Packfile) error {
		var err error
		n, err = p.GetSizeByOffset(w.offset)
		return err
	})
	return n, w, err
}

// EncodedObject reads h, refusing (errUndecided) one over the view's
// bound before reading it; one of another type than t (unless AnyObject)
// is not found.
func (v *view) EncodedObject(t plumbing.ObjectType, h plumbing.Hash) (plumbing.EncodedObject, error) {
	var obj plumbing.EncodedObject
	err := v.retry(func() error {
		n, w, err := v.header(h)
		if err != nil {
			return err
		}
		if v.maxObject > 0 && n > v.maxObject {
			return errUndecided
		}
		if w.loose != "" {
			obj, err = gitobj.ReadLoose(w.loose, n)
		} else {
			err = v.withPack(w.pack, func(p *packfile.Packfile) error {
				var err error
				obj, err = p.Get(h)
				return err
			})
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if t != plumbing.AnyObject && obj.Type() != t {
		return nil, plumbing.ErrObjectNotFound
	}
	return obj, nil
}

// withPack runs read on a go-git reader of p's pack, opened for it: with
// no filesystem, the reader returns objects read whole (bounded by the
// size checked before), so nothing reads the pack once it is closed.
func (v *view) withPack(p *viewPack, read func(*packfile.Packfile) error) error {
	f, err := osfs.Default.Open(p.pack)
	if err != nil {
		if os.IsNotExist(err) {
			return plumbing.ErrObjectNotFound // repacked away: reload
		}
		return err
	}
	pf := packfile.NewPackfileWithCache(p.idx, nil, f, v.bases, 0)
	defer pf.Close()
	return read(pf)
}
