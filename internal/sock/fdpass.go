package sock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/metadata"
)

// Descriptor passing beside gRPC (docs/git-service.md, "Pushing a bundle
// file"): a client on a Unix socket may pass an open file with SCM_RIGHTS
// on the very connection its gRPC call runs on, and name it in the call's
// metadata (PassedFDKey: the descriptor's number in the order the client
// passed them on that connection, from 1). The server's connection
// (PeerCred{PassFDs: true}) reads with recvmsg, keeps what arrives in a
// small per-connection queue and numbers it the same way; the call takes
// its file from there. Bytes on a stream socket are in order and a
// descriptor arrives with the bytes sent with it, so a descriptor passed
// before the call's first message is in the queue by the time the handler
// reads that message: nothing waits for it.
//
// A socket or an anonymous inode (io_uring, epoll) is closed as it
// arrives (held, it could keep its own connection open: holdsOthers). A file that nobody claims is closed when its
// connection closes; a
// connection holds at most MaxPendingFDs unclaimed, the connections of one
// uid (SO_PEERCRED) MaxHeldFDsPerUID together, and the process MaxHeldFDs
// in all: past any, a descriptor is closed as it arrives (its push then
// falls back to the byte stream). The share per uid is what keeps one
// session from taking the process's room: with --max-conns-per-uid
// connections of MaxPendingFDs each, one uid alone could otherwise hold
// every slot for as long as it keeps its connections, and every other
// session's descriptor would be closed on arrival.

// PassedFDKey is the request metadata that names the passed descriptor of
// a call (its number on the connection, decimal). PushFDKey is the response
// header by which the server says it took it ("accepted").
const (
	PassedFDKey = "bushost-passed-fd"
	PushFDKey   = "bushost-push-fd"
	// FDAccepted is PushFDKey's value when the server took the file.
	FDAccepted = "accepted"
)

const (
	// MaxPendingFDs bounds the unclaimed descriptors of one connection.
	MaxPendingFDs = 2
	// MaxHeldFDsPerUID bounds the unclaimed descriptors of all
	// connections of one uid together.
	MaxHeldFDsPerUID = 8
	// MaxHeldFDs bounds the unclaimed descriptors of all connections of
	// the process together.
	MaxHeldFDs = 64
	// fdsPerRead is the room for descriptors in one recvmsg: the kernel
	// closes any a message carries beyond it.
	fdsPerRead = 2
)

// heldFDs counts the unclaimed descriptors of the process, heldByUID
// those of each uid (under heldMu).
var (
	heldFDs   atomic.Int64
	heldMu    sync.Mutex
	heldByUID = map[uint32]int{}
)

// hold counts one more unclaimed descriptor of uid, or reports false if
// uid's share or the process's room is full.
func hold(uid uint32) bool {
	heldMu.Lock()
	defer heldMu.Unlock()
	if heldByUID[uid] >= MaxHeldFDsPerUID || heldFDs.Load() >= MaxHeldFDs {
		return false
	}
	heldByUID[uid]++
	heldFDs.Add(1)
	return true
}

// unhold counts one unclaimed descriptor of uid less.
func unhold(uid uint32) {
	heldMu.Lock()
	defer heldMu.Unlock()
	if heldByUID[uid]--; heldByUID[uid] <= 0 {
		delete(heldByUID, uid)
	}
	heldFDs.Add(-1)
}

// fdQueue is one connection's passed descriptors, numbered as they came.
type fdQueue struct {
	uid     uint32 // the peer's (SO_PEERCRED), whose share it counts in
	mu      sync.Mutex
	n       uint64 // descriptors that arrived, kept or not
	pending map[uint64]*os.File
	closed  bool
}

func (q *fdQueue) add(fd int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.n++
	if q.closed || len(q.pending) >= MaxPendingFDs || holdsOthers(fd) || !hold(q.uid) {
		syscall.Close(fd)
		return
	}
	if q.pending == nil {
		q.pending = map[uint64]*os.File{}
	}
	q.pending[q.n] = os.NewFile(uintptr(fd), "passed-fd-"+strconv.FormatUint(q.n, 10))
}

// holdsOthers reports whether fd is of a kind that can hold other open
// files: a socket (with descriptors in flight to it), or an anonymous
// inode such as io_uring (its registered files) or epoll, which fstat
// shows with no file type. None is a bundle, and one held unclaimed can
// keep a connection open after its client is gone (the connection's own
// other end, passed on it, or held through it: the server then never reads
// end-of-file), so it is closed as it arrives. Regular files, directories,
// FIFOs and devices are kept, for the call to refuse naming what they are.
func holdsOthers(fd int) bool {
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil {
		return true
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFDIR, syscall.S_IFIFO, syscall.S_IFCHR, syscall.S_IFBLK:
		return false
	}
	return true
}

// take removes and returns descriptor seq; nil if it did not arrive or
// was dropped.
func (q *fdQueue) take(seq uint64) *os.File {
	q.mu.Lock()
	defer q.mu.Unlock()
	f := q.pending[seq]
	if f != nil {
		delete(q.pending, seq)
		unhold(q.uid)
	}
	return f
}

func (q *fdQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for k, f := range q.pending {
		f.Close()
		unhold(q.uid)
		delete(q.pending, k)
	}
}

// fdConn is a server connection that reads with recvmsg and queues the
// descriptors that come with the bytes.
type fdConn struct {
	net.Conn
	u   *net.UnixConn
	q   *fdQueue
	oob []byte
}

func (c *fdConn) Read(b []byte) (int, error) {
	n, oobn, _, _, err := c.u.ReadMsgUnix(b, c.oob)
	if n < 0 {
		n = 0 // recvmsg's -1 on an error: a Read never returns one
	}
	if oobn > 0 {
		// Go reads with MSG_CMSG_CLOEXEC, so no child inherits these
		// before they are claimed.
		if msgs, perr := syscall.ParseSocketControlMessage(c.oob[:oobn]); perr == nil {
			for _, m := range msgs {
				fds, rerr := syscall.ParseUnixRights(&m)
				if rerr != nil {
					continue
				}
				for _, fd := range fds {
					c.q.add(fd)
				}
			}
		}
	}
	return n, err
}

func (c *fdConn) Close() error {
	c.q.close()
	return c.Conn.Close()
}

// unixConn finds the *net.UnixConn under wrappers that expose it with
// NetConn.
func unixConn(c net.Conn) *net.UnixConn {
	for i := 0; i < 8 && c != nil; i++ {
		if u, ok := c.(*net.UnixConn); ok {
			return u
		}
		w, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = w.NetConn()
	}
	return nil
}

// ErrNoFD is a call that named a passed descriptor the connection does not
// hold: not a Unix socket, a server that does not take descriptors, a
// number never passed, or one closed at a bound.
var ErrNoFD = errors.New("no such passed descriptor on this connection")

// PassedFD returns the file the call's metadata names (PassedFDKey) and
// true, or false if the call names none. The caller owns the file and must
// close it; it is what the client had open, nothing reopened, and it is
// still to be checked (CheckPassedFile).
func PassedFD(ctx context.Context) (*os.File, bool, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(PassedFDKey)
	if len(v) == 0 {
		return nil, false, nil
	}
	seq, err := strconv.ParseUint(v[0], 10, 32)
	if err != nil || seq == 0 || len(v) > 1 {
		return nil, true, fmt.Errorf("%s: %q is not a descriptor number", PassedFDKey, v[0])
	}
	ai, ok := authInfo(ctx)
	if !ok || ai.fds == nil {
		return nil, true, ErrNoFD
	}
	f := ai.fds.take(seq)
	if f == nil {
		return nil, true, ErrNoFD
	}
	return f, true, nil
}

// FDConn is a client connection that can pass a descriptor with its next
// write.
type FDConn struct {
	*net.UnixConn
	mu   sync.Mutex
	next *os.File // to pass with the next write
	sent uint64   // descriptors handed to Pass
}

// Pass arranges for f to travel with the connection's next write and
// returns its number on the connection, for PassedFDKey. The caller keeps
// f open until the call that names it ends.
func (c *FDConn) Pass(f *os.File) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent++
	c.next = f
	return c.sent
}

func (c *FDConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	f := c.next
	c.next = nil
	if f == nil {
		c.mu.Unlock()
		return c.UnixConn.Write(b)
	}
	// The lock is held across the write so that Pass's number matches the
	// order of the descriptors on the wire.
	defer c.mu.Unlock()
	n, _, err := c.UnixConn.WriteMsgUnix(b, syscall.UnixRights(int(f.Fd())), nil)
	if n < 0 {
		n = 0
	}
	if err != nil || n == len(b) {
		return n, err
	}
	m, err := c.UnixConn.Write(b[n:])
	return n + m, err
}

// FDDialer dials a Unix socket for gRPC (grpc.WithContextDialer) and keeps
// the connection it made last, to pass descriptors on.
type FDDialer struct {
	Path    string
	mu      sync.Mutex
	last    *FDConn
	pending *os.File // for a connection not dialled yet
}

// Dial implements grpc.WithContextDialer's function.
func (d *FDDialer) Dial(ctx context.Context, _ string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", d.Path)
	if err != nil {
		return nil, err
	}
	fc := &FDConn{UnixConn: c.(*net.UnixConn)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending != nil {
		fc.next, fc.sent, d.pending = d.pending, 1, nil
	}
	d.last = fc
	return fc, nil
}

// Pass arranges for f to travel with the next write on the connection
// (the one dialled last, or, before any, the first one dialled) and
// returns its number there, for PassedFDKey. A gRPC client connects at its
// first call, so a call that passes a file names 1 on a new connection,
// and the file goes with the connection's first bytes. The caller keeps f
// open until the call ends. If the connection is replaced meanwhile, the
// server does not find the number and declines; the caller then sends
// the bytes.
func (d *FDDialer) Pass(f *os.File) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last != nil {
		return d.last.Pass(f)
	}
	d.pending = f
	return 1
}

// File systems a passed file may live on: disk and memory file systems,
// where a read returns the file's bytes, whoever reads. Anything else
// (procfs, sysfs, debugfs, FUSE: files whose reads depend on the reader or
// on a process the client runs, or may block for ever) is not taken; the
// client sends such a file's bytes itself.
var passableFS = map[int64]string{
	0xEF53:     "ext4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0x858458F6: "ramfs",
	0x794C7630: "overlayfs",
	0x2FC12FC1: "zfs",
	0xF2F52010: "f2fs",
}

// PassedFile is what CheckPassedFile learnt of a file.
type PassedFile struct {
	Size int64
	st   syscall.Stat_t
}

// CheckPassedFile accepts f as a passed bundle only if it is a regular file
// on a disk or memory file system, open for reading (not O_PATH, not
// O_DIRECT), and returns its size now. Both ends use it: the client passes only what it
// accepts, the server takes only what it accepts.
func CheckPassedFile(f *os.File) (PassedFile, error) {
	var p PassedFile
	rc, err := f.SyscallConn()
	if err != nil {
		return p, err
	}
	var cerr error
	if err = rc.Control(func(fd uintptr) { cerr = checkPassed(int(fd), &p.st) }); err == nil {
		err = cerr
	}
	p.Size = p.st.Size
	return p, err
}

// checkPassed is CheckPassedFile's check of the descriptor fd, whose
// fstat it leaves in st.
func checkPassed(fd int, st *syscall.Stat_t) error {
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	switch {
	case err != nil:
		return err
	case flags&unix.O_PATH != 0:
		return errors.New("an O_PATH descriptor, which cannot be read")
	case flags&syscall.O_DIRECT != 0:
		return errors.New("an O_DIRECT descriptor, which reads only into aligned buffers")
	case flags&syscall.O_ACCMODE == syscall.O_WRONLY:
		return errors.New("a descriptor open for writing only")
	}
	if err := syscall.Fstat(fd, st); err != nil {
		return err
	}
	if t := st.Mode & syscall.S_IFMT; t != syscall.S_IFREG {
		return fmt.Errorf("not a regular file (%s)", fileType(t))
	}
	var fs syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &fs); err != nil {
		return err
	}
	if _, ok := passableFS[int64(fs.Type)]; !ok {
		return fmt.Errorf("a file on a file system of type %#x, not a disk or memory file system", fs.Type)
	}
	return nil
}

// Changed reports whether f's size, modification or change time differ
// from what CheckPassedFile saw.
func (p PassedFile) Changed(f *os.File) (bool, error) {
	fi, err := f.Stat() // fstat of f's descriptor
	if err != nil {
		return true, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Size != p.st.Size || st.Mtim != p.st.Mtim || st.Ctim != p.st.Ctim, nil
}

func fileType(t uint32) string {
	switch t {
	case syscall.S_IFDIR:
		return "a directory"
	case syscall.S_IFIFO:
		return "a FIFO or pipe"
	case syscall.S_IFSOCK:
		return "a socket"
	case syscall.S_IFCHR:
		return "a character device"
	case syscall.S_IFBLK:
		return "a block device"
	case syscall.S_IFLNK:
		return "a symbolic link"
	}
	return fmt.Sprintf("mode %#o", t)
}
