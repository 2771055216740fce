package sandbox

import (
	"io"
	"net"
	"time"
)

// initRelay is the option that makes pid 1 serve the relay of a
// --net=proxy session.
const initRelay = "--relay"

// relayConns bounds the connections pid 1 relays at once; the egress
// proxy outside holds its own, smaller, bound.
const relayConns = 256

// startRelay listens on relayAddr in the session's own network namespace
// and hands every connection, unread, to the egress proxy's socket: pid 1
// parses nothing a session process sends, the proxy outside does. It runs
// as goroutines of pid 1, which lives as long as the session.
func startRelay() error {
	ln, err := net.Listen("tcp", relayAddr)
	if err != nil {
		return err
	}
	slots := make(chan struct{}, relayConns)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				// EMFILE and the like, the session's own doing: wait
				// a little rather than spin.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			select {
			case slots <- struct{}{}:
			default:
				c.Close()
				continue
			}
			go func() {
				defer func() { <-slots }()
				relay(c)
			}()
		}
	}()
	return nil
}

func relay(c net.Conn) {
	defer c.Close()
	up, err := net.Dial("unix", egressSocket)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(up, c) // splice(2): no buffer in pid 1
		up.(*net.UnixConn).CloseWrite()
		close(done)
	}()
	io.Copy(c, up)
	c.(*net.TCPConn).CloseWrite()
	<-done
}
