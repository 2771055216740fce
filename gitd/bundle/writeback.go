package bundle

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// writebackEvery is how many bytes fed to index-pack between two requests
// to start writing its pack to disk.
const writebackEvery = 1 << 20

// writeback gets the pack index-pack writes onto the disk while it is
// written, so that the fsync that makes it durable (Migrate's, or git's
// own) finds little left to write: index-pack may run with
// core.fsync=none, and a 7 MB pack written back only at that fsync cost
// the push 20 ms after index-pack, on a disk that sat idle while it ran.
//
// It only ever asks the kernel to start writing (sync_file_range
// SYNC_FILE_RANGE_WRITE, which waits for no I/O to finish), and then,
// for a pack of a MiB or more, fsyncs the finished pack and index beside
// the push's checks. None of it is what makes the push durable: Migrate
// fsyncs every file it links, as before, and finds them clean. It reads
// no byte and opens only the files index-pack made in the quarantine,
// read-only, never following a link. Migrate and Remove wait for it, so
// it never outlives its quarantine.
type writeback struct {
	pack string // the quarantine's pack directory
	poke chan struct{}
	// large is set once writebackEvery bytes went to index-pack.
	large atomic.Bool
	// final gets the pack's name once index-pack wrote it ("": it did
	// not), and ends the goroutine.
	final chan string
	done  chan struct{}
}

func startWriteback(packDir string) *writeback {
	w := &writeback{pack: packDir, poke: make(chan struct{}, 1), final: make(chan string, 1), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *writeback) run() {
	defer close(w.done)
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for {
		select {
		case <-w.poke:
			if f == nil {
				f = w.openTmpPack()
			}
			if f != nil {
				unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
			}
		case name := <-w.final:
			// A pack under writebackEvery is left whole to Migrate's
			// fsyncs: written with them, it costs nothing more, where an
			// fsync of its own here would cost a disk flush (a journal
			// commit, on a file system with a journal) more, which
			// pushes side by side wait for.
			if name != "" && w.large.Load() {
				base := filepath.Join(w.pack, "pack-"+name)
				syncQuietly([]string{base + ".pack", base + ".idx"})
			}
			return
		}
	}
}

// openTmpPack opens the pack index-pack is writing (pack/tmp_pack_*),
// nil if there is none yet.
func (w *writeback) openTmpPack() *os.File {
	ents, err := os.ReadDir(w.pack)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "tmp_pack_") && e.Type().IsRegular() {
			f, err := os.OpenFile(filepath.Join(w.pack, e.Name()), os.O_RDONLY|unix.O_NOFOLLOW, 0)
			if err == nil {
				return f
			}
		}
	}
	return nil
}

// finish ends the writeback once index-pack ended: the pack it wrote,
// pack-<name> (none if name is ""), is fsynced in the background.
func (w *writeback) finish(name string) { w.final <- name }

// wait returns once the goroutine ended.
func (w *writeback) wait() { <-w.done }

// syncQuietly fsyncs paths concurrently and ignores errors: whoever needs
// them durable fsyncs them again and sees the error then.
func syncQuietly(paths []string) { _ = SyncAll(paths) }

// pokeWriter asks w to start a writeback every writebackEvery bytes
// written through it.
type pokeWriter struct {
	dst  io.Writer
	w    *writeback
	left int
}

func (p *pokeWriter) Write(b []byte) (int, error) {
	n, err := p.dst.Write(b)
	p.left -= n
	if p.left <= 0 {
		p.left = writebackEvery
		p.w.large.Store(true)
		select {
		case p.w.poke <- struct{}{}:
		default:
		}
	}
	return n, err
}
