package sandbox

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// relayPair is the socket pair pid 1 sends the relay's socket over: child
// goes to the session as pid1.FDRelay, parent stays with the proxy.
func relayPair() (parent *net.UnixConn, child *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	child = os.NewFile(uintptr(fds[1]), "relay-child")
	pf := os.NewFile(uintptr(fds[0]), "relay-parent")
	c, err := net.FileConn(pf)
	pf.Close()
	if err != nil {
		child.Close()
		return nil, nil, err
	}
	return c.(*net.UnixConn), child, nil
}

// receiveRelay reads the one message pid 1 sends on the pair and returns
// the listener it carries, checked to be what pid 1 makes: a listening TCP
// socket on pid1.RelayAddr. Whatever else arrives (more descriptors, another
// kind of socket, a file) is closed and refused: the session's side of the
// pair is not to be trusted more than the session.
func receiveRelay(c *net.UnixConn, port int) (*net.TCPListener, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
	for _, m := range msgs {
		if r, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, r...)
		}
	}
	if n == 0 && len(fds) == 0 {
		return nil, io.EOF // pid 1 is gone without a word: it says why itself
	}
	if perr != nil || n != 1 || buf[0] != 'L' || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, errors.New("pid 1 sent no relay socket")
	}
	fd := fds[0]
	if err := checkRelaySocket(fd, port); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "relay")
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, err
	}
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		ln.Close()
		return nil, errors.New("the relay socket is not TCP")
	}
	return tl, nil
}

// checkRelaySocket requires fd to be a listening TCP socket bound to
// 127.0.0.1:port.
func checkRelaySocket(fd, port int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return errors.New("the relay descriptor is not a socket")
	}
	for _, o := range []struct {
		opt, want int
		what      string
	}{{unix.SO_DOMAIN, unix.AF_INET, "IPv4"}, {unix.SO_TYPE, unix.SOCK_STREAM, "a stream"},
		{unix.SO_PROTOCOL, unix.IPPROTO_TCP, "TCP"}, {unix.SO_ACCEPTCONN, 1, "listening"}} {
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, o.opt)
		if err != nil || v != o.want {
			return fmt.Errorf("the relay socket is not %s", o.what)
		}
	}
	sa, err := unix.Getsockname(fd)
	in4, ok := sa.(*unix.SockaddrInet4)
	if err != nil || !ok || in4.Addr != [4]byte{127, 0, 0, 1} || in4.Port != port {
		return fmt.Errorf("the relay socket is not bound to 127.0.0.1:%d", port)
	}
	return nil
}
