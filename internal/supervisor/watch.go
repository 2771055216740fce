package supervisor

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// watcher turns file events under the watched trees into a "dirty" signal.
// It does not decide what changed: the commit step asks git, so events from
// the supervisor's own resets (which leave the trees equal to HEAD) and from
// ignored files end in no commit and no restart.
type watcher struct {
	trees  []string
	ignore []string
	w      *fsnotify.Watcher
	log    *slog.Logger
	// dirty holds at most one pending signal; more events while it is full
	// add nothing.
	dirty chan struct{}
	done  chan struct{}
}

func newWatcher(root string, trees, ignore []string, log *slog.Logger) (*watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	w := &watcher{ignore: ignore, w: fw, log: log, dirty: make(chan struct{}, 1), done: make(chan struct{})}
	for _, t := range trees {
		t = filepath.Join(root, t)
		w.trees = append(w.trees, t)
		if err := w.addTree(t); err != nil {
			fw.Close()
			return nil, err
		}
	}
	go w.run()
	return w, nil
}

func (w *watcher) close() {
	w.w.Close()
	<-w.done
}

// addTree watches dir and every directory below it, except ignored ones,
// which can hold more files than inotify has watches. fsnotify does not
// recurse on its own. The walk is walkTree's: bounded descriptors at any
// depth, a batch of a directory's names at a time whatever its width. A
// directory that cannot be watched (out of inotify watches, a path past
// PATH_MAX) is not entered, and said once per call, not once per
// directory.
func (w *watcher) addTree(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := w.w.Add(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	skipped, first, firstErr := 0, "", error(nil)
	skip := func(p string, err error) {
		skipped++
		if skipped == 1 {
			first, firstErr = p, err
		}
	}
	err = walkTree(fd, walkFuncs{
		visit: func(_ int, rel, name string, st *unix.Stat_t, _ int) (bool, error) {
			if st.Mode&unix.S_IFMT != unix.S_IFDIR || ignoredName(name, w.ignore) {
				return false, nil
			}
			p := filepath.Join(dir, rel)
			if err := w.w.Add(p); err != nil {
				if !errors.Is(err, fs.ErrNotExist) {
					skip(p, err)
				}
				return false, nil
			}
			return true, nil
		},
		dirErr: func(rel string, err error) error {
			// Vanished, or made unreadable by the agent while we walked:
			// no reason to stop watching the rest.
			if !errors.Is(err, unix.ENOENT) {
				skip(filepath.Join(dir, rel), err)
			}
			return nil
		},
	})
	if err != nil {
		w.log.Warn("watch: the walk stopped (the tree changed under it)", "dir", dir, "err", err)
	}
	if skipped > 0 {
		w.log.Warn("watch: skipping directories", "count", skipped, "first", shortPath(first), "err", firstErr)
	}
	return nil
}

func (w *watcher) signal() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// ignored reports whether p lies in a directory the agent's commits never
// include (a nested .git, node_modules, ...).
func (w *watcher) ignored(p string) bool {
	for _, t := range w.trees {
		if p == t {
			return false
		}
		if rel, ok := strings.CutPrefix(p, t+string(filepath.Separator)); ok {
			// Relative to its tree: a watched tree may itself be named
			// like an ignored directory.
			return ignored(filepath.ToSlash(rel), w.ignore)
		}
	}
	return true
}

func (w *watcher) run() {
	defer close(w.done)
	for {
		select {
		case ev, ok := <-w.w.Events:
			if !ok {
				return
			}
			if w.ignored(ev.Name) {
				continue
			}
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					// Files may have landed in it before its watch existed;
					// the commit step finds them through git.
					if err := w.addTree(ev.Name); err != nil {
						w.log.Warn("watch new directory", "dir", ev.Name, "err", err)
					}
				}
			}
			w.signal()
		case err, ok := <-w.w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.log.Warn("file events overflowed; rescanning the watched trees")
				w.rescan()
				continue
			}
			w.log.Warn("watcher", "err", err)
		}
	}
}

// rescan re-adds every directory (adding an existing watch is harmless) and
// signals, since any event may have been lost.
func (w *watcher) rescan() {
	for _, t := range w.trees {
		if err := w.addTree(t); err != nil {
			w.log.Warn("rescan", "tree", t, "err", err)
		}
	}
	w.signal()
}
