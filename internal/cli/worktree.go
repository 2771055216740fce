package cli

import (
	"bufio"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"github.com/go-git/go-git/v5/plumbing/format/index"
)

// push-working reads what it needs of the worker's repository in process
// (go-git, reads only), so that a push starts one git process, `bundle
// create`: HEAD, the main fetch-main recorded, and whether the working
// tree is provably clean. Whatever it cannot answer for sure here (a
// repository go-git cannot open, an index it cannot read, a file whose
// stat differs from the index) it leaves to git, as before.

// workRepo is a worker's repository opened for reads; nil when go-git
// cannot open it (git answers then).
type workRepo struct {
	g   *git.Repository
	top string // the working tree's top, "" for a bare repository
}

func openWorkRepo(dir string) *workRepo {
	g, err := git.PlainOpenWithOptions(dir, &git.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return nil
	}
	w := &workRepo{g: g}
	if wt, err := g.Worktree(); err == nil {
		w.top = wt.Filesystem.Root()
	}
	return w
}

// commit resolves ref (HEAD, or a full ref name) to the commit it names,
// "" when go-git cannot say (git is asked then).
func (w *workRepo) commit(ref string) string {
	if w == nil {
		return ""
	}
	r, err := w.g.Reference(plumbing.ReferenceName(ref), true)
	if err != nil {
		return ""
	}
	c, err := w.g.CommitObject(r.Hash())
	if err != nil {
		return ""
	}
	return c.Hash.String()
}

// hasCommit reports whether the repository holds commit id (false also
// when go-git cannot say).
func (w *workRepo) hasCommit(id string) bool {
	if w == nil {
		return false
	}
	_, err := w.g.CommitObject(plumbing.NewHash(id))
	return err == nil
}

// clean reports whether the working tree is provably what HEAD holds:
// the index's cached tree is valid and is HEAD's tree (nothing staged),
// every index entry's file has the stat data the index recorded and is
// not racily clean (nothing modified), and every file not in the index is
// ignored (nothing untracked). false means "not proven": `git status`
// then says what differs. Reading the index and one lstat per file costs
// less than starting git status, which does the same.
func (w *workRepo) clean(head string) bool {
	if w == nil || w.top == "" || head == "" {
		return false
	}
	cfg, err := w.g.Config()
	if err != nil || cfg.Raw.Section("core").Option("excludesFile") != "" {
		return false
	}
	idx, err := w.g.Storer.Index()
	if err != nil || idx.Cache == nil || len(idx.Cache.Entries) == 0 || idx.ModTime.IsZero() {
		return false
	}
	c, err := w.g.CommitObject(plumbing.NewHash(head))
	if err != nil {
		return false
	}
	root := idx.Cache.Entries[0]
	if root.Path != "" || root.Entries != len(idx.Entries) || root.Hash != c.TreeHash {
		return false
	}
	tracked := make(map[string]bool, len(idx.Entries))
	dirs := map[string]bool{"": true}
	for _, e := range idx.Entries {
		if e.Stage != 0 || e.SkipWorktree || e.IntentToAdd || e.Mode == filemode.Submodule {
			return false
		}
		// (go-git names stage 1 "Merged"; a merged entry is stage 0.)
		p := filepath.Join(w.top, filepath.FromSlash(e.Name))
		same, racy := sameStat(p, e, idx.ModTime.UnixNano())
		if !same || racy && !sameContent(p, e) {
			return false
		}
		tracked[e.Name] = true
		for d := path.Dir(e.Name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var ps []gitignore.Pattern
	if info, err := os.ReadFile(filepath.Join(w.gitDir(), "info", "exclude")); err == nil {
		ps = append(ps, parseIgnore(string(info), nil)...)
	}
	return w.noUntracked("", ps, tracked, dirs)
}

// gitDir is the repository's git directory (where info/exclude lives).
func (w *workRepo) gitDir() string {
	if fi, err := os.Stat(filepath.Join(w.top, ".git")); err == nil && fi.IsDir() {
		return filepath.Join(w.top, ".git")
	}
	// A linked worktree or a submodule: .git is a file; info/exclude is
	// the common directory's, which this does not chase: no exclude read
	// means at worst "not proven".
	return filepath.Join(w.top, ".git")
}

// noUntracked walks directory dir (slash-separated, relative to the top)
// and reports whether every entry not in the index is ignored.
func (w *workRepo) noUntracked(dir string, ps []gitignore.Pattern, tracked, dirs map[string]bool) bool {
	abs := filepath.Join(w.top, filepath.FromSlash(dir))
	var domain []string
	if dir != "" {
		domain = strings.Split(dir, "/")
	}
	if b, err := os.ReadFile(filepath.Join(abs, ".gitignore")); err == nil {
		ps = append(ps[:len(ps):len(ps)], parseIgnore(string(b), domain)...)
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
		if name == ".git" {
			if dir == "" {
				continue
			}
			return false // a repository inside: git status decides
		}
		if e.IsDir() {
			if dirs[p] {
				if !w.noUntracked(p, ps, tracked, dirs) {
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

// sameStat reports whether p's lstat is the stat data e recorded, and
// whether the entry is racily clean: modified in the same clock tick the
// index was written or later, which stat data cannot tell from unmodified
// (its content is compared then, as git does).
func sameStat(p string, e *index.Entry, indexNano int64) (same, racy bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return false, false
	}
	switch e.Mode {
	case filemode.Regular, filemode.Executable:
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			return false, false
		}
		if (st.Mode&0o100 != 0) != (e.Mode == filemode.Executable) {
			return false, false
		}
	case filemode.Symlink:
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			return false, false
		}
	default:
		return false, false
	}
	mtime := st.Mtim.Nano()
	same = uint32(st.Size) == e.Size && mtime == e.ModifiedAt.UnixNano() &&
		st.Ctim.Nano() == e.CreatedAt.UnixNano() && uint32(st.Ino) == e.Inode
	return same, mtime >= indexNano
}

// sameContent reports whether p holds the blob e names.
func sameContent(p string, e *index.Entry) bool {
	var body []byte
	var err error
	if e.Mode == filemode.Symlink {
		var target string
		target, err = os.Readlink(p)
		body = []byte(target)
	} else {
		body, err = os.ReadFile(p)
	}
	if err != nil {
		return false
	}
	return plumbing.ComputeHash(plumbing.BlobObject, body) == e.Hash
}
