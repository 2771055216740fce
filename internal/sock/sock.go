// Package sock serves gRPC on the bus host's Unix sockets: it makes the
// socket with the right mode, and tells each call which process is on the
// other end (SO_PEERCRED), so that the broker can log it. It never trusts
// anything the peer says about itself.
package sock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/bushost/bushost/internal/authz"
)

// Listen makes a Unix socket at path with the given mode and, when gid
// is not -1, group. A stale socket file (nobody listening) is replaced;
// any other file there is an error.
//
// The socket is made under a restrictive umask and then opened up to
// mode, so there is no moment where it is wider than asked. The mode and
// group are set through a descriptor opened on the name without
// following a link and checked to be a socket of this process's user
// with no other name: whoever may write the socket's directory (a home's
// owner, when root serves in it) cannot swap the name for a link, symbolic
// or hard, between the bind and the chmod and have root change the mode
// or group of a file of its choice.
func Listen(path string, mode os.FileMode, gid int) (net.Listener, error) {
	if _, err := os.Lstat(path); err == nil {
		// Stale unless a process serves it (DialNoFollow connects); a
		// name that is no socket is refused, never removed.
		c, err := DialNoFollow(context.Background(), path)
		var notSock *notSocketError
		switch {
		case errors.As(err, &notSock):
			return nil, fmt.Errorf("listen %s: %w", path, err)
		case err == nil:
			c.Close()
			return nil, fmt.Errorf("listen %s: another process is serving it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := setMode(path, mode, gid); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return l, nil
}

// DialNoFollow connects to the Unix socket at path as its name is: opened
// without following a link, checked to be a socket, and dialled through
// that descriptor. Root dialling a name in a directory another user may
// write (a home's owner) thus connects to no socket of a link's choosing.
func DialNoFollow(ctx context.Context, path string) (net.Conn, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: &os.PathError{Op: "open", Path: path, Err: err}}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, &notSocketError{path: path, mode: st.Mode}
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", fd))
}

type notSocketError struct {
	path string
	mode uint32
}

func (e *notSocketError) Error() string {
	if e.mode&unix.S_IFMT == unix.S_IFLNK {
		return e.path + " is a link: what it names is not dialled"
	}
	return fmt.Sprintf("%s is not a socket (mode %o)", e.path, e.mode)
}

// setMode gives the socket at path its mode and group through a
// descriptor that names it, never through the name again.
func setMode(path string, mode os.FileMode, gid int) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the socket: %w", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat the socket: %w", err)
	}
	// One name: a hard link to another of this user's sockets (where the
	// host lets anyone link files of others: fs.protected_hardlinks=0) is
	// a socket of this user too, but not the one just bound.
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK || int(st.Uid) != os.Geteuid() || st.Nlink != 1 {
		return fmt.Errorf("the name was replaced after the bind (now mode %o, owner %d, %d names): refused to change it", st.Mode, st.Uid, st.Nlink)
	}
	// An O_PATH descriptor takes no fchmod; its /proc name reaches the
	// inode it holds without resolving the path again.
	self := fmt.Sprintf("/proc/self/fd/%d", fd)
	if gid >= 0 {
		if err := os.Chown(self, -1, gid); err != nil {
			return fmt.Errorf("give it to group %d: %w", gid, err)
		}
	}
	if err := os.Chmod(self, mode); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return nil
}

// AuthInfo is the peer credential of a Unix socket connection.
type AuthInfo struct {
	credentials.CommonAuthInfo
	Peer authz.Peer
	fds  *fdQueue // descriptors passed on the connection (PassFDs)
}

// AuthType implements credentials.AuthInfo.
func (AuthInfo) AuthType() string { return "peercred" }

// PeerCred is a grpc TransportCredentials that reads SO_PEERCRED at
// handshake. It adds no encryption: the socket's mode is the protection.
// With PassFDs, a connection also takes descriptors its peer passes with
// SCM_RIGHTS, for calls that name them (fdpass.go).
type PeerCred struct{ PassFDs bool }

// ServerHandshake implements credentials.TransportCredentials.
func (p PeerCred) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cred, err := peerCred(c)
	if cc, ok := c.(*countedConn); ok {
		cred, err = cc.cred, nil // read at accept
	}
	if err != nil {
		return nil, nil, fmt.Errorf("peercred: %w", err)
	}
	ai := AuthInfo{
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity},
		Peer:           authz.Peer{PID: cred.Pid, UID: int32(cred.Uid), GID: int32(cred.Gid)},
	}
	if p.PassFDs {
		if u := unixConn(c); u != nil {
			ai.fds = &fdQueue{uid: cred.Uid}
			c = &fdConn{Conn: c, u: u, q: ai.fds, oob: make([]byte, syscall.CmsgSpace(4*fdsPerRead))}
		}
	}
	return c, ai, nil
}

// ClientHandshake implements credentials.TransportCredentials; the server
// side is the only one that uses PeerCred.
func (PeerCred) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, AuthInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

// Info implements credentials.TransportCredentials.
func (PeerCred) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}

// Clone implements credentials.TransportCredentials.
func (p PeerCred) Clone() credentials.TransportCredentials { return p }

// OverrideServerName implements credentials.TransportCredentials.
func (PeerCred) OverrideServerName(string) error { return nil }

// PeerFromContext returns the calling process of a gRPC call served with
// PeerCred; ok is false if there is none.
func PeerFromContext(ctx context.Context) (authz.Peer, bool) {
	ai, ok := authInfo(ctx)
	return ai.Peer, ok
}

func authInfo(ctx context.Context) (AuthInfo, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return AuthInfo{}, false
	}
	ai, ok := p.AuthInfo.(AuthInfo)
	return ai, ok
}
