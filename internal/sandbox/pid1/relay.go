package pid1

import "golang.org/x/sys/unix"

// RelayAddr is where a --net=proxy session's programs reach the egress
// proxy: HTTP (with CONNECT) and SOCKS5 on one port, told apart by the
// proxy from the first byte. pid 1 makes the socket in the session's
// namespace and hands it to the proxy outside (handOffRelay). RelayPort is
// its port.
const (
	RelayAddr = "127.0.0.1:3128"
	RelayPort = 3128
)

// relayBacklog bounds the connections the kernel queues on the relay's
// socket before the proxy accepts them; the proxy bounds those it serves
// (--egress-conns).
const relayBacklog = 128

// handOffRelay makes the relay's socket, listening on RelayAddr in the
// session's own network namespace, and sends it to the egress proxy over
// FDRelay (SCM_RIGHTS). The proxy, outside, accepts the session's
// connections on it itself: a byte crosses one process (the proxy) between
// the session's program and the server, not two, and pid 1 neither reads
// nor holds any of it. It runs before the command starts, so no session
// process can take the port first or send on FDRelay.
func handOffRelay() error {
	defer unix.Close(FDRelay)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: RelayPort, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	if err := unix.Listen(fd, relayBacklog); err != nil {
		return err
	}
	return unix.Sendmsg(FDRelay, []byte{'L'}, unix.UnixRights(fd), nil, 0)
}
