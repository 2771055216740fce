package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/bushost/bushost/internal/home"
)

// Socket activation (sd_listen_fds(3)): a service manager that made the
// sockets itself (deploy/systemd/bushostd.socket) hands them over as file
// descriptors from 3 on, with LISTEN_PID our pid and LISTEN_FDS their
// number. Each is told apart by the path it is bound to, which must be
// HOME/git.sock or HOME/broker.sock: a socket bound elsewhere is a
// misconfigured unit, refused. The variables are removed once read, so
// that no child (git) inherits them.

const listenFDsStart = 3

// inheritedSockets returns the listeners the service manager passed, by
// socket file name; none when the daemon was not socket-activated.
func inheritedSockets(h home.Home) (map[string]net.Listener, error) {
	pid, nfds := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_FDNAMES")
	if nfds == "" || pid != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n, err := strconv.Atoi(nfds)
	if err != nil || n < 1 || n > 2 {
		return nil, fmt.Errorf("LISTEN_FDS=%q: want 1 or 2 sockets (%s, %s)", nfds, home.GitSockName, home.BrokerSockName)
	}
	abs, err := filepath.Abs(h.Dir())
	if err != nil {
		return nil, err
	}
	out := map[string]net.Listener{}
	var held []net.Listener // every one made, closed on a failure
	fail := func(err error) (map[string]net.Listener, error) {
		for _, l := range held {
			l.Close()
		}
		return nil, err
	}
	for i := range n {
		fd := listenFDsStart + i
		syscall.CloseOnExec(fd)
		f := os.NewFile(uintptr(fd), "LISTEN_FDS "+strconv.Itoa(fd))
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return fail(fmt.Errorf("inherited fd %d: %w", fd, err))
		}
		held = append(held, l)
		ul, ok := l.(*net.UnixListener)
		if !ok {
			return fail(fmt.Errorf("inherited fd %d is not a Unix stream socket", fd))
		}
		path := ul.Addr().String()
		name := filepath.Base(path)
		if filepath.Dir(path) != abs || (name != home.GitSockName && name != home.BrokerSockName) {
			return fail(fmt.Errorf("inherited socket %s: want %s or %s", path, home.At(abs).GitSock(), home.At(abs).BrokerSock()))
		}
		if _, dup := out[name]; dup {
			return fail(fmt.Errorf("inherited %s twice", path))
		}
		ul.SetUnlinkOnClose(false)
		out[name] = l
	}
	return out, nil
}
