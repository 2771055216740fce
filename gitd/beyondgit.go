package gitd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/format/idxfile"
	"github.com/go-git/go-git/v5/plumbing/format/packfile"

	"github.com/bushost/bushost/gitd/bundle"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitid"
)

// The beyond-git walk (issue 13). index-pack --strict in git 2.39 refuses
// what git 2.39's fsck knows (bundle.StrictFlag raises the ids it has but
// reports as info). Later git releases refuse more, and some objects that
// every git accepts attack whoever checks the commit out. After index-pack,
// the push's new trees (objects of the quarantine's pack that the
// repository does not already hold) and the .gitmodules blobs they name
// (unless the pool held them before: walkBeyondGit) are read here, in Go,
// against the rules below; the first broken rule refuses the push, naming
// the object and a stable reason.
//
// Every rule cites where it comes from. Rules git 2.39 also enforces under
// bundle.StrictFlag stay here too: the walk must not depend on which git
// the host runs.

// beyondRule is one row of the table.
type beyondRule struct {
	Reason errdefs.Reason
	// Source is the advisory or git commit the rule comes from.
	Source string
	// What the rule refuses, as the refusal says it.
	What string
}

// The rules, by reason. A tree rule is checked on every entry of a new
// tree (checkEntry), a .gitmodules rule on every new .gitmodules blob
// (checkGitmodules); the last two are checked on the pack and the bundle
// header (packJunk, refNotCommit).
var beyondRules = map[errdefs.Reason]beyondRule{
	errdefs.GitmodulesControlChar: {errdefs.GitmodulesControlChar,
		"CVE-2025-48384 (GHSA-vwqx-4fm8-6qc9, fixed in git 2.50.1): a trailing carriage return in a submodule path is lost when git writes and re-reads its config, so a checkout writes through a symlink of the same name",
		"a .gitmodules submodule name or path with a carriage return or other control character"},
	errdefs.DotfileSymlink: {errdefs.DotfileSymlink,
		"git 2.32.0, fsck gitattributesSymlink/gitignoreSymlink/mailmapSymlink (git reads these files with O_NOFOLLOW in the worktree; a symlink reads a file outside it), with the NTFS and HFS+ spellings of CVE-2014-9390",
		".gitattributes, .gitignore or .mailmap as a symlink, under any name NTFS or HFS+ treats as the same"},
	errdefs.SubmoduleNameNested: {errdefs.SubmoduleNameNested,
		"CVE-2019-1387, git commit a8dee3ca610f5a1d403634492136c887f83b59d2 (\"Disallow dubiously-nested submodule git directories\"): the git directory of submodule a/hooks would be a's hooks directory",
		"a submodule name that is a path prefix of another (a and a/hooks)"},
	errdefs.SubmodulePathEscapes: {errdefs.SubmodulePathEscapes,
		"CVE-2018-11235, git commit ed8b10f631c9a71df3351d46187bf7f3fa4f9b7e (\"fsck: check .gitmodules content\"), extended to paths",
		"a submodule name or path with a .. component"},
	errdefs.SubmodulePathTrailing: {errdefs.SubmodulePathTrailing,
		"CVE-2019-1352/CVE-2019-1353 (git 2.24.1): Windows drops a trailing space or dot, so \"sub.\" checks out as \"sub\"",
		"a submodule path with a component that ends in a space or a dot"},
	errdefs.TreeEntryNameTooLong: {errdefs.TreeEntryNameTooLong,
		"newer git's fsck largePathname (\"contains excessively large pathname\", 4096 bytes)",
		"a tree entry name over 4096 bytes"},
	errdefs.TreeEntryMode: {errdefs.TreeEntryMode,
		"git fsck badFilemode (info in git 2.39, raised by bundle.StrictFlag): git writes only 100644, 100755, 120000, 40000 and 160000",
		"a tree entry mode other than the five git writes"},
	errdefs.GitmodulesParse: {errdefs.GitmodulesParse,
		"git fsck gitmodulesParse (info in git 2.39, raised by bundle.StrictFlag) and gitmodulesLarge",
		"a .gitmodules git cannot parse"},
	errdefs.GitmodulesURL: {errdefs.GitmodulesURL,
		"CVE-2020-5260 (git 2.26.1, a newline in a URL given to a credential helper) and CVE-2024-52006 (git 2.48.1, credential URLs newer git refuses, a port that is not a number)",
		"a submodule URL with a newline or carriage return, or a port that is not a number"},
	errdefs.GitmodulesGitlink: {errdefs.GitmodulesGitlink,
		"git fsck gitmodulesBlob/gitmodulesMissing (CVE-2018-11235): .gitmodules must be a file; a gitlink by that name hides a submodule configuration from fsck",
		"a gitlink (mode 160000) named .gitmodules, under any spelling"},
	errdefs.PackTrailingBytes: {errdefs.PackTrailingBytes,
		"git index-pack (\"pack has junk at the end\"): bytes after the pack's checksum are no part of any object",
		"bytes after the end of the bundle's pack"},
	errdefs.BundleRefNotCommit: {errdefs.BundleRefNotCommit,
		"bushost's own rule (docs/git-service.md): a push moves refs/work/<task> to a commit",
		"a bundle ref that names a tree, blob or tag"},
}

// refuseBeyond is the refusal of rule r for object id.
func refuseBeyond(r errdefs.Reason, id plumbing.Hash, format string, a ...any) error {
	rule := beyondRules[r]
	return errdefs.InvalidArgument(r, "object %s: %s: %s", id, rule.What, fmt.Sprintf(format, a...)).
		With("object", id.String()).With("source", rule.Source)
}

// maxGitmodulesBytes bounds a .gitmodules read into memory.
const maxGitmodulesBytes = 1 << 20

// maxEntryName is the longest tree entry name accepted.
const maxEntryName = 4096

// startBeyondGit starts the walk on a push's quarantined pack in a
// goroutine of its own, on a second handle on the pack, and returns what
// waits for its answer (nil: the walk found nothing to refuse). The push
// goes on with its checks, its lock and moving the pack in meanwhile, and
// waits before the push is recorded: a refused push is rolled back like
// one the broker refuses, so the walk costs a push its CPU, not its time.
// The walk ends soon after ctx does (each tree and commit read checks
// it).
//
// What the walk lets through for being there before (a tree it would
// refuse, a .gitmodules of the pool's, an object no pushed commit
// reaches) it asks about before the push holds its task's lock, while
// another push to the task may be between moving its pack in and having
// it undone: that pack answers, then goes. So the answer is asked again
// once the push holds the lock (the caller waits for the walk only then),
// of what the repository and its pool hold now, the push's own files
// (q.Added) left out (TestAttackWalkTrustsARefusedPushInFlight).
func (tx *writeTx) startBeyondGit(ctx context.Context, tip string) func() error {
	r, q, objs := tx.r, tx.q, tx.objs
	if objs.pack == nil {
		return func() error { return nil }
	}
	pack, err := objs.reopen()
	if err != nil {
		return func() error { return fmt.Errorf("beyond-git walk: %w", err) }
	}
	// The walk reads the repository's trees on a view of its own: a view
	// serves one goroutine.
	vw := r.open()
	// The pool is the last directory a task's repository sees.
	vis := r.visible()
	own, pooled := objectsBefore(vis[:len(vis)-1]), objectsBefore(vis[len(vis)-1:])
	// What the walk let through, for the second asking; the walk's
	// goroutine writes them, walked reads them once it is done.
	var trees, blobs, others []plumbing.Hash
	noted := func(in func(plumbing.Hash) bool, into *[]plumbing.Hash) func(plumbing.Hash) bool {
		return func(h plumbing.Hash) bool {
			if in(h) {
				*into = append(*into, h)
				return true
			}
			return false
		}
	}
	there := func(h plumbing.Hash) bool { return own(h) || pooled(h) }
	has, pooledBlob, before := noted(there, &trees), noted(pooled, &blobs), noted(there, &others)
	type walkResult struct {
		later []plumbing.Hash
		err   error
	}
	done := make(chan walkResult, 1)
	go func() {
		defer pack.Close()
		p := pushedPack{pack: pack, idx: objs.idx, repo: vw, tip: plumbing.NewHash(tip),
			has: has, pooled: pooledBlob, before: before, bounds: r.st.treeBounds()}
		later, err := walkBeyondGit(ctx, p)
		done <- walkResult{later, err}
	}()
	var result error
	waited := false
	return func() error {
		if !waited {
			res := <-done
			result, waited = res.err, true
			if result == nil {
				result = stillBefore(r, q, objs.repo, trees, blobs, others, &res.later)
			}
			if result == nil {
				// Read here, by the push's goroutine, the one that
				// uses the repository's view.
				result = checkGitmodulesIn(objs.repo, res.later)
			}
		}
		return result
	}
}

// stillBefore asks again, under the push's task lock, about what the walk
// let through for being there before: a tree no longer there outside the
// push's own files is read from the repository (the push's pack, moved in
// by now) and checked, its refusal stands; a .gitmodules the pool no
// longer holds is checked like one of the task's (added to later);
// an object no pushed commit reaches that is gone refuses the push.
func stillBefore(r repo, q *bundle.Quarantine, repo objectStore, trees, blobs, others []plumbing.Hash, later *[]plumbing.Hash) error {
	if len(trees) == 0 && len(blobs) == 0 && len(others) == 0 {
		return nil
	}
	skip := map[string]bool{}
	for _, p := range q.Added() {
		skip[filepath.Clean(p)] = true
	}
	vis := r.visible()
	there := objectsIn(vis, skip)
	pooled := objectsIn(vis[len(vis)-1:], skip)
	for _, h := range trees {
		if there(h) {
			continue
		}
		// The push's pack holds it (the walk read it there), within the
		// push's tree bound; the view refuses to read past its own.
		obj, err := repo.EncodedObject(plumbing.TreeObject, h)
		if err != nil {
			return fmt.Errorf("beyond-git walk: read tree %s: %w", h, err)
		}
		if err := checkTree(obj, map[plumbing.Hash]plumbing.Hash{}); err != nil {
			return err
		}
	}
	for _, h := range blobs {
		if !pooled(h) {
			*later = append(*later, h)
		}
	}
	for _, h := range others {
		if !there(h) {
			return unreachable(h)
		}
	}
	return nil
}

// checkGitmodulesIn checks .gitmodules blobs that a push's new trees name
// and that the task's repository holds from an earlier push (walkBeyondGit
// leaves them to it), read from the repository, their size first.
func checkGitmodulesIn(repo objectStore, ids []plumbing.Hash) error {
	for _, id := range ids {
		size, err := repo.EncodedObjectSize(id)
		if err != nil {
			return fmt.Errorf("beyond-git walk: read .gitmodules %s: %w", id, err)
		}
		if size > maxGitmodulesBytes {
			return refuseBeyond(errdefs.GitmodulesParse, id, "it is %d bytes, over %d", size, maxGitmodulesBytes)
		}
		obj, err := repo.EncodedObject(plumbing.AnyObject, id)
		if err != nil {
			return fmt.Errorf("beyond-git walk: read .gitmodules %s: %w", id, err)
		}
		if err := checkGitmodulesBlob(obj); err != nil {
			return err
		}
	}
	return nil
}

// objectsBefore answers the walk's "was this object here before the
// push?" for the object directories dirs, as they are when it is called.
// The walk asks only about a tree that fails a check or a .gitmodules it
// names, and the answer must not count the push: the push moves its pack
// in while the walk runs, and housekeeping may roll that pack into a new
// one meanwhile. So it reads only the pack indexes there are now (before
// the pack moves in): a pack repacked away since is no answer, nor is an
// index it cannot read, and the object then counts as the push's, so a
// refusal stands. Loose objects count as they are: a push's objects never
// become loose.
func objectsBefore(dirs []string) func(plumbing.Hash) bool {
	return objectsIn(dirs, nil)
}

// objectsIn is objectsBefore, the pack indexes named in skip left out.
func objectsIn(dirs []string, skip map[string]bool) func(plumbing.Hash) bool {
	var before []string
	for _, idx := range packIndexes(dirs) {
		if !skip[filepath.Clean(idx)] {
			before = append(before, idx)
		}
	}
	return func(h plumbing.Hash) bool {
		hex := h.String()
		for _, d := range dirs {
			if _, err := os.Lstat(filepath.Join(d, hex[:2], hex[2:])); err == nil {
				return true
			}
		}
		for _, idx := range before {
			if ok, err := idxHas(idx, h); err == nil && ok {
				return true
			}
		}
		return false
	}
}

// pushedPack is what the walk reads: the push's pack (its index), the
// repository behind it, the pushed commit, and the repository's answers
// to "was this object here before the push?".
type pushedPack struct {
	pack *packfile.Packfile
	idx  *idxfile.MemoryIndex
	repo objectStore // the repository and its pool, for the trees the pack lacks
	tip  plumbing.Hash
	// has: a tree that fails a rule but was there before (walkBeyondGit);
	// pooled: a .gitmodules the pool held before; before: an object no
	// pushed commit reaches that was there before (a delta base
	// index-pack --fix-thin appended).
	has, pooled, before func(plumbing.Hash) bool
	bounds              treeBounds
}

// treeBounds are the bounds on what a commit's tree expands to, and the
// daemon's memory of tree sizes.
type treeBounds struct {
	maxPaths, maxDepth int64
	known              *treeSizes
}

// walkBeyondGit walks what the push brings, from its commit: the commits
// of the pack it reaches, and from each one's tree every tree once (a
// tree the pack lacks is the repository's, read there or known by its
// size). It refuses a commit whose tree expands past the tree bounds
// (treeWalk, TREE_TOO_LARGE), checks each of the pack's trees against
// the table, and then the .gitmodules blobs they name, and finally
// refuses an object of the pack that no pushed commit reaches
// (PACK_UNREACHABLE_OBJECTS) unless it was there before (the delta bases
// index-pack --fix-thin appends to a thin pack are).
//
// A tree of the pack that fails a rule but that the repository (or its
// pool) already holds entered before, and was walked then (or is the
// pool's), so it is not the push's. A blob is not like that: one that
// entered under another name (notes.txt) was checked by nobody as a
// .gitmodules, neither by git's fsck nor by the walk, which look only at
// blobs a tree names .gitmodules
// (TestAttackGitmodulesBlobFromAnEarlierPush). So every .gitmodules blob a
// new tree names is checked, wherever it is, unless the pool held it
// before the push (pooled: main's, or landed work's, which every root
// tree of a project with submodules names again); those the pack lacks
// (the task's repository holds them) are returned as later, for the
// caller to read from the repository.
//
// Each read checks ctx: a cancelled push's walk ends within a read.
func walkBeyondGit(ctx context.Context, p pushedPack) (later []plumbing.Hash, err error) {
	if p.pack == nil {
		return nil, nil
	}
	inPack := func(h plumbing.Hash) bool {
		ok, err := p.idx.Contains(h)
		return err == nil && ok
	}
	reached := map[plumbing.Hash]bool{}
	// The pushed commits: the pack's, down from the tip.
	type pushed struct{ commit, tree plumbing.Hash }
	var commits []pushed
	queue := []plumbing.Hash{p.tip}
	for len(queue) > 0 {
		h := queue[0]
		queue = queue[1:]
		if reached[h] || !inPack(h) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		obj, err := p.pack.Get(h)
		if err != nil {
			return nil, fmt.Errorf("beyond-git walk: read commit %s: %w", h, err)
		}
		tree, parents, err := commitLinks(obj)
		if err != nil {
			return nil, fmt.Errorf("beyond-git walk: %w", err)
		}
		reached[h] = true
		commits = append(commits, pushed{h, tree})
		queue = append(queue, parents...)
	}
	gitmodules := map[plumbing.Hash]plumbing.Hash{} // blob -> tree naming it
	w := treeWalk{ctx: ctx, isNew: inPack, maxPaths: p.bounds.maxPaths, maxDepth: p.bounds.maxDepth, known: p.bounds.known,
		read: func(h plumbing.Hash) ([]byte, error) {
			var obj plumbing.EncodedObject
			var err error
			if inPack(h) {
				obj, err = p.pack.Get(h)
			} else {
				obj, err = p.repo.EncodedObject(plumbing.TreeObject, h)
			}
			if err != nil {
				return nil, fmt.Errorf("beyond-git walk: read tree %s: %w", h, err)
			}
			data, err := readTree(obj)
			if err != nil {
				return nil, fmt.Errorf("beyond-git walk: read tree %s: %w", h, err)
			}
			return data, nil
		},
		visit: func(h plumbing.Hash, data []byte) error {
			reached[h] = true
			var broken error // the first rule broken; every entry is marked
			err := treeEntries(h, data, func(mode, name []byte, id plumbing.Hash) error {
				if string(mode) != "160000" && inPack(id) {
					reached[id] = true
				}
				if broken == nil {
					broken = checkEntry(h, string(mode), name, id, gitmodules)
				}
				return nil
			})
			if err == nil {
				err = broken
			}
			if err != nil && p.has(h) {
				return nil // not the push's: it entered the repository before
			}
			return err
		}}
	for _, c := range commits {
		if err := w.check(c.commit, c.tree); err != nil {
			return nil, err
		}
	}
	for blob := range gitmodules {
		if p.pooled(blob) {
			continue // the pool's, there before the push
		}
		obj, err := p.pack.Get(blob)
		if errors.Is(err, plumbing.ErrObjectNotFound) {
			later = append(later, blob) // the task's, from an earlier push
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("beyond-git walk: read .gitmodules %s: %w", blob, err)
		}
		if err := checkGitmodulesBlob(obj); err != nil {
			return nil, err
		}
	}
	if n, err := p.idx.Count(); err != nil || n != int64(len(reached)) {
		if err := unreached(ctx, p, reached); err != nil {
			return nil, err
		}
	}
	return later, nil
}

// unreached refuses the first object of the pack that no pushed commit
// reaches and that was not there before.
func unreached(ctx context.Context, p pushedPack, reached map[plumbing.Hash]bool) error {
	iter, err := p.idx.Entries()
	if err != nil {
		return fmt.Errorf("beyond-git walk: %w", err)
	}
	defer iter.Close()
	for {
		e, err := iter.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("beyond-git walk: %w", err)
		}
		if reached[e.Hash] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !p.before(e.Hash) {
			return unreachable(e.Hash)
		}
	}
}

// unreachable is the refusal of an object of the pack no pushed commit
// reaches.
func unreachable(h plumbing.Hash) error {
	return errdefs.InvalidArgument(errdefs.PackUnreachable,
		"object %s of the pushed pack is reached by none of the pushed commits; push a bundle of the commit alone (git bundle create, or bushost push-working)", h).
		With("object", h.String())
}

// commitLinks reads a commit's tree and parents from its header.
func commitLinks(obj plumbing.EncodedObject) (tree plumbing.Hash, parents []plumbing.Hash, err error) {
	if obj.Type() != plumbing.CommitObject {
		return tree, nil, fmt.Errorf("object %s is a %s, not a commit", obj.Hash(), obj.Type())
	}
	rc, err := obj.Reader()
	if err != nil {
		return tree, nil, err
	}
	defer rc.Close()
	br := bufio.NewReader(rc)
	sawTree := false
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			// index-pack --strict parsed this commit: it has a tree
			// line and a header that ends in a blank line.
			return tree, nil, fmt.Errorf("commit %s: header cut short: %w", obj.Hash(), err)
		}
		key, val, _ := bytes.Cut(bytes.TrimSuffix(line, []byte{'\n'}), []byte{' '})
		switch {
		case len(line) == 1:
			if !sawTree {
				return tree, nil, fmt.Errorf("commit %s has no tree", obj.Hash())
			}
			return tree, parents, nil
		case string(key) == "tree" || string(key) == "parent":
			// git reads hex of either case here; the bus host takes no
			// id but a canonical one (gitid).
			if _, err := gitid.ParseObjectID(string(val)); err != nil {
				return tree, nil, errdefs.InvalidArgument(errdefs.ObjectIDInvalid,
					"commit %s names its %s by %v; git writes no such commit: make it again with git commit", obj.Hash(), key, err).
					With("object", obj.Hash().String())
			}
			if string(key) == "tree" {
				tree, sawTree = plumbing.NewHash(string(val)), true
			} else {
				parents = append(parents, plumbing.NewHash(string(val)))
			}
		}
	}
}

// The five modes git writes, as a tree spells them.
var gitModes = map[string]bool{"100644": true, "100755": true, "120000": true, "40000": true, "160000": true}

// checkTree reads one tree's raw entries and checks them; it adds the
// .gitmodules blobs it names.
func checkTree(obj plumbing.EncodedObject, gitmodules map[plumbing.Hash]plumbing.Hash) error {
	data, err := readTree(obj)
	if err != nil {
		return fmt.Errorf("beyond-git walk: read tree %s: %w", obj.Hash(), err)
	}
	return treeEntries(obj.Hash(), data, func(mode, name []byte, id plumbing.Hash) error {
		return checkEntry(obj.Hash(), string(mode), name, id, gitmodules)
	})
}

// checkEntry applies the tree rules to one entry.
func checkEntry(tree plumbing.Hash, mode string, name []byte, id plumbing.Hash, gitmodules map[plumbing.Hash]plumbing.Hash) error {
	if len(name) > maxEntryName {
		return refuseBeyond(errdefs.TreeEntryNameTooLong, tree, "an entry name is %d bytes", len(name))
	}
	if !gitModes[mode] {
		return refuseBeyond(errdefs.TreeEntryMode, tree, "entry %s has mode %s", quote(name), quote([]byte(mode)))
	}
	n := string(name)
	if mode == "120000" {
		for _, dot := range symlinkDotfiles {
			if isDotfile(n, dot.name, dot.short) {
				return refuseBeyond(errdefs.DotfileSymlink, tree, "entry %s is a symlink spelling .%s", quote(name), dot.name)
			}
		}
	}
	if isDotfile(n, "gitmodules", "gi7eba") {
		switch mode {
		case "160000":
			return refuseBeyond(errdefs.GitmodulesGitlink, tree, "entry %s is a gitlink", quote(name))
		case "100644", "100755":
			gitmodules[id] = tree
		}
	}
	return nil
}

// symlinkDotfiles are the files git opens with O_NOFOLLOW in a worktree,
// with the prefix of their NTFS 8.3 short names (git's own choices).
var symlinkDotfiles = []struct{ name, short string }{
	{"gitattributes", "gi7d29"},
	{"gitignore", "gi250a"},
	{"mailmap", "maba30"},
}

// isDotfile reports whether name is "."+dot as NTFS or HFS+ would open it.
func isDotfile(name, dot, short string) bool {
	// Most names cannot be one: every spelling starts with '.' (after
	// HFS+'s ignorable code points, all outside ASCII) or is an NTFS short
	// name with '~' in its first eight bytes.
	if name == "" || name[0] != '.' && name[0] < 0x80 && !strings.Contains(name[:min(len(name), 8)], "~") {
		return false
	}
	return isNTFSDot(name, dot, short) || isHFSDot(name, dot)
}

// isNTFSDot: NTFS ignores case and trailing spaces and dots, reads
// "NAME:stream" as NAME, and has 8.3 short names: the first six letters
// and ~1 to ~4, or git's fall-back prefix and ~N.
func isNTFSDot(name, dot, short string) bool {
	rest := func(s string) bool {
		if i := strings.IndexByte(s, ':'); i >= 0 {
			s = s[:i]
		}
		return strings.Trim(s, " .") == ""
	}
	if len(name) > len(dot) && name[0] == '.' && strings.EqualFold(name[1:1+len(dot)], dot) {
		return rest(name[1+len(dot):])
	}
	if len(name) >= 8 && strings.EqualFold(name[:6], dot[:6]) && name[6] == '~' && name[7] >= '1' && name[7] <= '4' {
		return rest(name[8:])
	}
	// The fall-back short name: up to six letters of the prefix, then ~
	// and a digit 1-9, then digits, eight characters in all.
	if len(name) < 8 {
		return false
	}
	tilde := false
	for i := 0; i < 8; i++ {
		c := name[i]
		switch {
		case tilde:
			if c < '0' || c > '9' {
				return false
			}
		case c == '~':
			i++
			if i >= 8 || name[i] < '1' || name[i] > '9' {
				return false
			}
			tilde = true
		case i >= 6 || c >= 0x80:
			return false
		case c|0x20 != short[i] && c != short[i]:
			return false
		}
	}
	return tilde && rest(name[8:])
}

// isHFSDot: HFS+ ignores case and a set of invisible code points anywhere
// in a name (CVE-2014-9390).
func isHFSDot(name, dot string) bool {
	var b strings.Builder
	for _, r := range name {
		if r == utf8.RuneError {
			return false
		}
		if hfsIgnorable(r) {
			continue
		}
		if r >= 0x80 {
			return false
		}
		b.WriteRune(r)
	}
	s := b.String()
	return len(s) == len(dot)+1 && s[0] == '.' && strings.EqualFold(s[1:], dot)
}

func hfsIgnorable(r rune) bool {
	return r >= 0x200c && r <= 0x200f || r >= 0x202a && r <= 0x202e || r >= 0x206a && r <= 0x206f || r == 0xfeff
}

// quote shows a name from a push safely: control bytes, quotes and
// invalid UTF-8 escaped, at most 80 bytes of it.
func quote(b []byte) string {
	if len(b) > 80 {
		return fmt.Sprintf("%q...", b[:80])
	}
	return fmt.Sprintf("%q", b)
}

// checkGitmodulesBlob parses one new .gitmodules and checks its submodules.
func checkGitmodulesBlob(obj plumbing.EncodedObject) error {
	id := obj.Hash()
	if obj.Size() > maxGitmodulesBytes {
		return refuseBeyond(errdefs.GitmodulesParse, id, "it is %d bytes, over %d", obj.Size(), maxGitmodulesBytes)
	}
	rc, err := obj.Reader()
	if err != nil {
		return fmt.Errorf("beyond-git walk: read .gitmodules %s: %w", id, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxGitmodulesBytes+1))
	if err != nil {
		return fmt.Errorf("beyond-git walk: read .gitmodules %s: %w", id, err)
	}
	subs, err := parseGitmodules(data)
	if err != nil {
		return refuseBeyond(errdefs.GitmodulesParse, id, "%v", err)
	}
	return checkSubmodules(id, subs)
}

// submodule is one [submodule "NAME"] section.
type submodule struct {
	name      string
	path, url []string // every value given, in order
}

// checkSubmodules applies the .gitmodules rules.
func checkSubmodules(id plumbing.Hash, subs []*submodule) error {
	for _, s := range subs {
		for _, v := range append([]string{s.name}, s.path...) {
			if i := strings.IndexFunc(v, isControl); i >= 0 {
				return refuseBeyond(errdefs.GitmodulesControlChar, id, "submodule %s has %s (byte %#02x)", quote([]byte(s.name)), quote([]byte(v)), v[i])
			}
			for _, c := range strings.FieldsFunc(v, func(r rune) bool { return r == '/' || r == '\\' }) {
				if c == ".." {
					return refuseBeyond(errdefs.SubmodulePathEscapes, id, "submodule %s has %s", quote([]byte(s.name)), quote([]byte(v)))
				}
			}
		}
		for _, p := range s.path {
			for _, c := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
				if strings.HasSuffix(c, " ") || strings.HasSuffix(c, ".") {
					return refuseBeyond(errdefs.SubmodulePathTrailing, id, "submodule %s has path %s", quote([]byte(s.name)), quote([]byte(p)))
				}
			}
		}
		for _, u := range s.url {
			if why := badURL(u); why != "" {
				return refuseBeyond(errdefs.GitmodulesURL, id, "submodule %s has url %s: %s", quote([]byte(s.name)), quote([]byte(u)), why)
			}
		}
	}
	for _, a := range subs {
		for _, b := range subs {
			if a != b && strings.HasPrefix(strings.ToLower(b.name), strings.ToLower(a.name)+"/") {
				return refuseBeyond(errdefs.SubmoduleNameNested, id, "submodule %s is inside submodule %s", quote([]byte(b.name)), quote([]byte(a.name)))
			}
		}
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// badURL says why newer git refuses u, or "".
func badURL(u string) string {
	if strings.ContainsAny(u, "\n\r") {
		return "a newline or carriage return"
	}
	if d, err := url.PathUnescape(u); err == nil && strings.ContainsAny(d, "\n\r") {
		return "a newline or carriage return, percent-encoded"
	}
	_, rest, ok := strings.Cut(u, "://")
	if !ok {
		return ""
	}
	host, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		host = host[i+1:]
	}
	if strings.HasPrefix(host, "[") {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return "an unterminated [IPv6] host"
		}
		host = host[end+1:]
		if host == "" {
			return ""
		}
		if host[0] != ':' {
			return "bytes after the [IPv6] host"
		}
		host = "x" + host
	}
	_, port, ok := strings.Cut(host, ":")
	if !ok {
		return ""
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return fmt.Sprintf("port %s is not a number", quote([]byte(port)))
		}
	}
	return ""
}

// packJunk gives "pack has junk at the end" from index-pack its own
// reason; any other error passes through.
func packJunk(err error) error {
	var pe *bundle.PackError
	if errors.As(err, &pe) && strings.Contains(pe.Msg, "pack has junk at the end") {
		return errdefs.InvalidArgument(errdefs.PackTrailingBytes, "%s: %s", beyondRules[errdefs.PackTrailingBytes].What, pe.Msg).
			With("source", beyondRules[errdefs.PackTrailingBytes].Source).Wrap(err)
	}
	return err
}

// refNotCommit is the refusal of a bundle ref that names typ, not a commit.
func refNotCommit(commit, typ string) error {
	return errdefs.InvalidArgument(errdefs.BundleRefNotCommit, "the bundle's ref names %s, a %s, not a commit", commit, typ).
		With("object", commit).With("type", typ)
}
