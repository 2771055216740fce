package broker

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/safepath"
)

// A checkpoint file anchors the log outside the database (issue 13): the
// broker appends the head its commit left to it, one "SEQ HASH" line per
// commit, fsynced before the commit's callers hear back, so that no
// acknowledged event is missing from it; and it anchors nothing another
// writer appended that it did not prove first (proof.go). Whoever can rewrite the database (and rehash
// the whole chain, or delete its last events) cannot make the log agree
// with heads already shipped off the machine. docs/broker.md says how an
// operator ships the file and acts on a mismatch.

// Head is one recorded head of the log: event Seq had hash Hash.
type Head struct {
	Seq  int64
	Hash string
}

func (h Head) String() string { return fmt.Sprintf("%d %s", h.Seq, h.Hash) }

// maxHeadLine bounds one line of a checkpoint file ("SEQ HASH").
const maxHeadLine = 128

// ParseHead reads "SEQ HASH" or "SEQ:HASH".
func ParseHead(s string) (Head, error) {
	s = strings.TrimSpace(s)
	seq, hash, ok := strings.Cut(s, " ")
	if !ok {
		seq, hash, ok = strings.Cut(s, ":")
	}
	n, err := strconv.ParseInt(seq, 10, 64)
	if !ok || err != nil || n < 1 || !isSHA256Hex(hash) {
		return Head{}, fmt.Errorf("%q is not a head: want SEQ HASH (a positive number and a hex SHA-256)", clip(s))
	}
	return Head{Seq: n, Hash: hash}, nil
}

// ReadHeads reads a checkpoint file's lines in order. A last line without
// its newline is a write torn by a crash and is left out.
func ReadHeads(r io.Reader) ([]Head, error) {
	var heads []Head
	br := bufio.NewReaderSize(r, 4096)
	for n := 1; ; n++ {
		line, err := br.ReadSlice('\n')
		if err == io.EOF {
			return heads, nil
		}
		if err == bufio.ErrBufferFull || len(line) > maxHeadLine {
			return nil, fmt.Errorf("line %d is longer than a head", n)
		}
		if err != nil {
			return nil, err
		}
		h, err := ParseHead(string(bytes.TrimSuffix(line, []byte("\n"))))
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		heads = append(heads, h)
	}
}

// checkpoint is the open checkpoint file.
type checkpoint struct {
	path string
	mu   sync.Mutex
	f    *os.File
	last Head
	// failed is set when an append failed: the broker takes no new events
	// until an append of want, the head it could not record, succeeds.
	failed error
	want   Head
}

// openCheckpoint opens (creating, 0600) the file at path for appending and
// returns it with the heads it already holds.
func openCheckpoint(path string) (*checkpoint, []Head, error) {
	// Opened once from /, following no link, the file and every directory
	// on the way ours or root's and writable by no one else: another
	// user's file (or a link to one) could stop the broker from starting,
	// or feed it heads.
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint file: %w", err)
	}
	h, err := safepath.OpenFile(abs, os.Geteuid(), unix.O_RDWR|unix.O_APPEND|unix.O_CREAT)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint file: %w", err)
	}
	f, err := h.File()
	h.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint file: %w", err)
	}
	heads, err := ReadHeads(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("checkpoint file %s: %w", path, err)
	}
	// A torn last line: end it, so that the next head starts a line.
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		var last [1]byte
		if _, err := f.ReadAt(last[:], fi.Size()-1); err == nil && last[0] != '\n' {
			if _, err := f.Write([]byte("\n")); err != nil {
				f.Close()
				return nil, nil, fmt.Errorf("checkpoint file %s: %w", path, err)
			}
		}
	}
	c := &checkpoint{path: path, f: f}
	if len(heads) > 0 {
		c.last = heads[len(heads)-1]
	}
	return c, heads, nil
}

// record appends h (unless it is the last head recorded) and syncs it to
// disk. A failure latches until a later record succeeds.
func (c *checkpoint) record(h Head) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h == c.last || h.Seq == 0 {
		c.failed = nil
		return nil
	}
	_, err := c.f.WriteString(h.String() + "\n")
	if err == nil {
		err = c.f.Sync()
	}
	if err != nil {
		c.failed, c.want = err, h
		return err
	}
	c.last, c.failed = h, nil
	return nil
}

func (c *checkpoint) close() error { return c.f.Close() }

// appendRefusal is what the callers of a write hear while the checkpoint
// cannot be appended to. committed says their events are in the log
// already (the append after their commit failed): they are told so.
func (c *checkpoint) appendRefusal(err error, committed bool) error {
	also := ""
	if committed {
		also = "; this call's event is in the log, but unacknowledged until its head is recorded"
	}
	return errdefs.Unavailable(errdefs.LogCheckpointAppend,
		"cannot append the log's head to the checkpoint file %s (%v): the broker takes no new events until it can%s", c.path, err, also).
		With("path", c.path).Retry(5 * time.Second).Wrap(err)
}

// catchUp records the head an earlier append failed to record (never the
// database's head, which this broker may not have written); it returns
// the refusal while the file still cannot be written.
func (b *Broker) catchUp() error {
	c := b.cp
	c.mu.Lock()
	failed, want := c.failed, c.want
	c.mu.Unlock()
	if failed == nil {
		return nil
	}
	if err := c.record(want); err != nil {
		return c.appendRefusal(err, false)
	}
	return nil
}

// anchor returns the last head recorded: the head this broker last wrote
// or proved (a head it failed to record is proven again, from its own
// signatures).
func (c *checkpoint) anchor() Head {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Halted returns why the broker refuses to serve (a log that does not match
// its checkpoint), or nil.
func (b *Broker) Halted() error {
	if e := b.halted.Load(); e != nil {
		return e
	}
	return nil
}

// isSHA256Hex: 64 lowercase hex digits (a head's hash, not a git object).
func isSHA256Hex(s string) bool {
	return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == ""
}
