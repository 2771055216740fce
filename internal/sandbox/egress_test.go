package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestNetFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
		ok   bool
	}{
		{nil, NetNone, true},
		{[]string{"--net"}, NetHost, true},
		{[]string{"--net=host"}, NetHost, true},
		{[]string{"--net=proxy"}, NetProxy, true},
		{[]string{"--net=none"}, NetNone, true},
		{[]string{"--net=all"}, "", false},
		{[]string{"--allow-host", "1.2.3.4:443"}, "", false},            // needs proxy
		{[]string{"--net=proxy", "--allow-host", "1.2.3.4"}, "", false}, // no port
		{[]string{"--net=proxy", "--allow-host", "1.2.3.4:0"}, "", false},
		{[]string{"--net=proxy", "--allow-domain", "*"}, "", false},
		{[]string{"--net=proxy", "--allow-domain", "a.*.com"}, "", false},
		{[]string{"--net=proxy", "--allow-domain", "*.example.com", "--allow-host", "[::1]:8080"}, NetProxy, true},
		{[]string{"--net=proxy", "--egress-conns", "0"}, "", false},
	} {
		args := append([]string{"--run-dir", "/r", "--workspace", "/w", "--role", "r", "--broker-socket", "/b"}, c.args...)
		cfg, err := ParseFlags("explain", args, io.Discard)
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok %v", c.args, err, c.ok)
			continue
		}
		if err == nil && cfg.Net != c.want {
			t.Errorf("%q: net %q, want %q", c.args, cfg.Net, c.want)
		}
	}
}

func TestEgressDecide(t *testing.T) {
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("# test\n93.184.215.14 api.example.com\n10.0.0.5 internal.example.com\n::ffff:127.0.0.1 mapped.example.com\nfd00::1 ula.example.com\n169.254.169.254 meta.example.com\n10.0.0.7 exact.example.com\n198.51.100.7 self.example.com\n198.51.100.8 allowed-self.example.com\n93.184.215.14 api.ported.test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := readHostsFile(hosts)
	if err != nil {
		t.Fatal(err)
	}
	// 198.51.100.7 (a public range) stands for an address of the host's
	// own interfaces; 198.51.100.8 is one too, allowed by
	// --allow-host-address.
	own := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("198.51.100.7"), net.ParseIP("198.51.100.8")}
	e := &egressProxy{allowDomains: []string{"*.example.com", "Plain.test", "*.ported.test:8443"}, allowHosts: []string{"127.0.0.1:8080", "exact.example.com:443", "self.example.com:8080"},
		hosts: h, ctx: context.Background(), hostAddrs: func() ([]net.IP, error) { return own, nil }, allowHostAddrs: []net.IP{net.ParseIP("198.51.100.8")}}
	for _, c := range []struct {
		host string
		port int
		want string // the rule, or the start of why
	}{
		{"127.0.0.1", 8080, "--allow-host 127.0.0.1:8080"},
		{"127.0.0.1", 8081, "EGRESS_DENIED: 127.0.0.1:8081 is not named"},
		{"93.184.215.14", 443, "EGRESS_DENIED"}, // a literal address needs --allow-host
		{"api.example.com", 443, "--allow-domain *.example.com"},
		{"API.Example.COM.", 80, "--allow-domain *.example.com"},
		// A pattern without a port opens 443 and 80 only: 8443 through
		// *.example.com, allowed when a pattern opened every port, is
		// refused now; *.ported.test:8443 opens 8443 and nothing else.
		{"api.example.com", 8443, "EGRESS_DENIED: api.example.com:8443 is not named"},
		{"api.ported.test", 8443, "--allow-domain *.ported.test:8443"},
		{"api.ported.test", 443, "EGRESS_DENIED: api.ported.test:443 is not named"},
		// The host's own addresses are refused like a private range,
		// but for the one --allow-host-address names, or an exact
		// --allow-host.
		{"self.example.com", 443, "EGRESS_DENIED: self.example.com resolves to 198.51.100.7, one of this host's own addresses"},
		{"allowed-self.example.com", 443, "--allow-domain *.example.com"},
		{"self.example.com", 8080, "--allow-host self.example.com:8080"},
		{"example.com", 443, "EGRESS_DENIED"}, // *. is below the name only
		{"internal.example.com", 443, "EGRESS_DENIED: internal.example.com resolves to 10.0.0.5, in 10.0.0.0/8"},
		{"mapped.example.com", 443, "EGRESS_DENIED: mapped.example.com resolves to 127.0.0.1"},
		{"ula.example.com", 443, "EGRESS_DENIED: ula.example.com resolves to fd00::1, in fc00::/7"},
		{"meta.example.com", 80, "EGRESS_DENIED: meta.example.com resolves to 169.254.169.254"},
		{"exact.example.com", 443, "--allow-host exact.example.com:443"}, // named exactly: private is fine
		{"exact.example.com", 80, "EGRESS_DENIED: exact.example.com resolves to 10.0.0.7"},
		{"evil.com", 443, "EGRESS_DENIED: evil.com:443 is not named"},
		{"example.com.evil.com", 443, "EGRESS_DENIED"},
		// An address with a zone ending in an allowed domain is no name
		// under it: the resolver reads it as the address.
		{"::ffff:93.184.215.14%x.example.com", 443, "EGRESS_DENIED"},
		{"2606:2800:220:1::1%a.example.com", 443, "EGRESS_DENIED"},
		{"::ffff:93.184.215.14%x.Plain.test", 80, "EGRESS_DENIED"},
	} {
		ips, rule, why := e.decide(target{c.host, c.port})
		got := rule
		if ips == nil {
			got = why
		}
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%s:%d: got %q, want %q...", c.host, c.port, got, c.want)
		}
	}
	for _, ip := range []string{"127.0.0.2", "10.1.1.1", "172.31.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "::1", "fe80::1", "fd00:ec2::254", "::ffff:10.0.0.1", "0.0.0.0"} {
		if blockedIP(net.ParseIP(ip)) == "" {
			t.Errorf("%s not blocked", ip)
		}
	}
	for _, ip := range []string{"93.184.215.14", "2606:2800:220:1::1", "8.8.8.8"} {
		if r := blockedIP(net.ParseIP(ip)); r != "" {
			t.Errorf("%s blocked by %s", ip, r)
		}
	}
	if _, err := readHostsFile(writeTemp(t, "not-an-address name\n")); err == nil {
		t.Error("a hosts line without an address was accepted")
	}
}

func writeTemp(t *testing.T, s string) string {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEgressProxy drives the proxy over its socket: CONNECT and SOCKS5 to
// an allowed listener, a refusal with its reason, and the connection bound.
func TestEgressProxy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() // echo
		}
	}()
	var log strings.Builder
	e, err := startEgress(&Config{AllowHosts: []string{l.Addr().String()}, EgressConns: 1}, &lockedWriter{w: &log}, nil)
	if err != nil {
		t.Fatal(err)
	}
	relay := playPid1(t, e)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	read := func(c net.Conn, n int) string {
		b := make([]byte, n)
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("read: %v", err)
		}
		return string(b)
	}

	c := dial()
	io.WriteString(c, "CONNECT "+l.Addr().String()+" HTTP/1.1\r\nHost: x\r\n\r\n")
	if got := read(c, len("HTTP/1.1 200 Connection established\r\n\r\n")); !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Fatalf("CONNECT: %q", got)
	}
	io.WriteString(c, "ping")
	if got := read(c, 4); got != "ping" {
		t.Fatalf("echo: %q", got)
	}
	// The one slot is taken: the next client is told so.
	over := dial()
	io.WriteString(over, "GET http://x/ HTTP/1.1\r\n\r\n")
	if b, _ := io.ReadAll(over); !strings.Contains(string(b), "503") || !strings.Contains(string(b), ReasonEgressConnections) {
		t.Errorf("over the bound: %q", b)
	}
	over.Close()
	c.Close()

	// SOCKS5 to a port not allowed: reply 2.
	waitSlot(t, e)
	s := dial()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	p := 0
	for _, ch := range port {
		p = p*10 + int(ch-'0')
	}
	p++
	s.Write([]byte{5, 1, 0})
	if got := read(s, 2); got != "\x05\x00" {
		t.Fatalf("greeting: %q", got)
	}
	s.Write([]byte{5, 1, 0, 1, 127, 0, 0, 1, byte(p >> 8), byte(p)})
	if got := read(s, 2); got != "\x05\x02" {
		t.Errorf("SOCKS to a port not allowed: reply %q, want 5 2", got)
	}
	s.Close()
	e.stop()
	if c, err := net.Dial("tcp", relay); err == nil {
		c.Close()
		t.Errorf("the relay's socket outlives the proxy")
	}
	if !strings.Contains(log.String(), "denied 127.0.0.1:") || !strings.Contains(log.String(), "closed "+l.Addr().String()) {
		t.Errorf("log:\n%s", log.String())
	}
}

func waitSlot(t *testing.T, e *egressProxy) {
	for i := 0; len(e.slots) > 0; i++ {
		if i > 5000 {
			t.Fatal("the slot was not given back")
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// playPid1 does what a session's pid 1 does for the proxy (handOffRelay):
// it makes a listening socket and sends it over the pair, here on a free
// port of the host's loopback rather than 3128 in a namespace of its own.
// It returns the socket's address.
func playPid1(t *testing.T, e *egressProxy) string {
	t.Helper()
	fd := listenLoopback(t)
	defer unix.Close(fd)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*unix.SockaddrInet4).Port
	e.relayPort = port
	if err := unix.Sendmsg(int(e.child.Fd()), []byte{'L'}, unix.UnixRights(fd), nil, 0); err != nil {
		t.Fatal(err)
	}
	e.launched()
	<-e.handed
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln == nil {
		t.Fatal("the proxy did not take the relay's socket")
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

func listenLoopback(t *testing.T) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 8); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestEgressRelayHandOff: the proxy takes from its side of the pair only
// what pid 1 makes, a TCP socket listening on the relay's address; any
// other descriptor (a file, a Unix socket, a TCP socket that does not
// listen or listens elsewhere, two at once, none) is closed and refused,
// and the proxy then serves nothing.
func TestEgressRelayHandOff(t *testing.T) {
	fdsBefore := openFDs(t)
	file, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	defer unix.Close(pair[1])
	notListening, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(notListening)
	elsewhere := listenLoopback(t) // the proxy wants 3128: the wrong port
	defer unix.Close(elsewhere)
	for _, c := range []struct {
		name string
		data []byte
		fds  []int
		want string
	}{
		{"a file", []byte{'L'}, []int{int(file.Fd())}, "not a socket"},
		{"a Unix socket", []byte{'L'}, []int{pair[0]}, "not IPv4"},
		{"a TCP socket not listening", []byte{'L'}, []int{notListening}, "not listening"},
		{"a listener on another port", []byte{'L'}, []int{elsewhere}, "not bound to 127.0.0.1:3128"},
		{"two descriptors", []byte{'L'}, []int{elsewhere, elsewhere}, "sent no relay socket"},
		{"none", []byte{'L'}, nil, "sent no relay socket"},
		{"another message", []byte{'X'}, []int{elsewhere}, "sent no relay socket"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log strings.Builder
			e, err := startEgress(&Config{}, &lockedWriter{w: &log}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var oob []byte
			if c.fds != nil {
				oob = unix.UnixRights(c.fds...)
			}
			if err := unix.Sendmsg(int(e.child.Fd()), c.data, oob, nil, 0); err != nil {
				t.Fatal(err)
			}
			e.launched()
			<-e.handed
			e.stop()
			if e.ln != nil {
				t.Errorf("the proxy serves what it was sent")
			}
			if !strings.Contains(log.String(), c.want) {
				t.Errorf("log %q, want %q", log.String(), c.want)
			}
		})
	}
	// Nothing the proxy received stays open in this process: each
	// descriptor sent was a duplicate, closed on refusal.
	file.Close()
	unix.Close(notListening)
	unix.Close(elsewhere)
	unix.Close(pair[0])
	unix.Close(pair[1])
	if n := openFDs(t); n > fdsBefore {
		t.Errorf("%d descriptors open, %d before: a refused one was kept", n, fdsBefore)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestEgressRefusalFlood: a session that opens connection after
// connection over --egress-conns, saying nothing on any, makes the proxy
// hold a bounded number of them (maxRefusing) waiting to be told why;
// the rest are closed at once. Without the bound each one held a
// goroutine and a descriptor of `sandbox run` for the handshake's 10 s.
func TestEgressRefusalFlood(t *testing.T) {
	var log strings.Builder
	e, err := startEgress(&Config{EgressConns: 1}, &lockedWriter{w: &log}, nil)
	if err != nil {
		t.Fatal(err)
	}
	relay := playPid1(t, e)
	base := runtime.NumGoroutine()
	const flood = 200
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < flood+1; i++ {
		c, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Wait until the proxy has accepted them all.
	for i := 0; e.lastConn.Load() < flood+1; i++ {
		if i > 20000 {
			t.Fatalf("the proxy accepted %d of %d connections", e.lastConn.Load(), flood+1)
		}
		time.Sleep(time.Millisecond)
	}
	if n := runtime.NumGoroutine() - base; n > maxRefusing+8 {
		t.Errorf("%d goroutines more than before the flood of %d silent connections, want at most about %d", n, flood, maxRefusing)
	}
	if n := len(e.refusing); n > maxRefusing {
		t.Errorf("%d refusals pending, over %d", n, maxRefusing)
	}
	// One past the bound is closed without a word.
	last := conns[len(conns)-1]
	last.SetReadDeadline(time.Now().Add(time.Minute))
	if b, err := io.ReadAll(last); len(b) != 0 || err != nil && !strings.Contains(err.Error(), "reset") {
		t.Errorf("over the refusal bound: read %q, %v", b, err)
	}
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	e.stop()
	if n := runtime.NumGoroutine() - base; n > 2 {
		t.Errorf("%d goroutines left after stop", n)
	}
}

// TestEgressIdleNotReading: a client that never reads what the server
// sends leaves no byte moving either way once the buffers are full; the
// connection is idle and is cut after --egress-idle, giving its slot back,
// rather than holding it until the session ends: whether the client keeps
// its sending side open or closes it.
func TestEgressIdleNotReading(t *testing.T) {
	for _, halfClose := range []bool{false, true} {
		t.Run(fmt.Sprintf("half-closed=%v", halfClose), func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			upEnded := make(chan struct{}, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				buf := make([]byte, 64<<10)
				for { // write until the proxy closes
					if _, err := c.Write(buf); err != nil {
						break
					}
				}
				upEnded <- struct{}{}
			}()
			e, err := startEgress(&Config{AllowHosts: []string{l.Addr().String()}, EgressConns: 1, EgressIdle: 200 * time.Millisecond}, io.Discard, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer e.stop()
			relay := playPid1(t, e)
			c, err := net.Dial("tcp", relay)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.(*net.TCPConn).SetReadBuffer(4096)
			io.WriteString(c, "CONNECT "+l.Addr().String()+" HTTP/1.1\r\nHost: x\r\n\r\n")
			head := make([]byte, len("HTTP/1.1 200 Connection established\r\n\r\n"))
			if _, err := io.ReadFull(c, head); err != nil || !strings.HasPrefix(string(head), "HTTP/1.1 200") {
				t.Fatalf("CONNECT: %q %v", head, err)
			}
			if halfClose {
				c.(*net.TCPConn).CloseWrite()
			}
			// Read nothing more: the slot must come back on its own.
			waitSlot(t, e)
			select {
			case <-upEnded:
			case <-time.After(time.Minute):
				t.Error("the server's end is still open")
			}
		})
	}
}

// TestEgressStopRefusing: a connection being refused (over
// --egress-conns) that never says a word does not keep the proxy, and so
// `sandbox run`, from ending with the session: stop closes it too.
func TestEgressStopRefusing(t *testing.T) {
	e, err := startEgress(&Config{EgressConns: 1}, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	relay := playPid1(t, e)
	base := runtime.NumGoroutine()
	var conns []net.Conn
	for i := 0; i < 2; i++ { // one takes the slot, one is refused
		c, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i := 0; len(e.refusing) == 0; i++ {
		if i > 20000 {
			t.Fatal("the second connection is not being refused")
		}
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(egressHandshake / 2):
		// The bound is far over what stop takes; without closing the
		// refused connection, stop waits egressHandshake.
		t.Fatal("stop waits for a silent connection it was refusing")
	}
	if n := runtime.NumGoroutine() - base; n > 2 {
		t.Errorf("%d goroutines left after stop", n)
	}
}

// TestEgressPlainRequestBody: a plain http:// request with a body (by
// Content-Length or chunked) goes through whole, and its answer comes
// back while the client keeps its connection open: the proxy sends on
// the body as framed, rather than reading the client's connection to
// its end (which held the request until the handshake's deadline and
// then failed it).
func TestEgressPlainRequestBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %q %v", r.Method, b, err)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	e, err := startEgress(&Config{AllowHosts: []string{host}, EgressConns: 4}, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	relay := playPid1(t, e)
	for _, tc := range []struct{ name, req string }{
		{"content-length", "POST " + srv.URL + "/ HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 5\r\n\r\nhello"},
		{"chunked", "POST " + srv.URL + "/ HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n"},
		{"chunked with a trailer", "POST " + srv.URL + "/ HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", relay)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, tc.req)
			// The connection stays open: the answer must come anyway,
			// before the handshake's bound.
			c.SetReadDeadline(time.Now().Add(egressHandshake / 2))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 || string(b) != `POST "hello" <nil>` {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
		})
	}
	// A trailer without end is not held in memory: the request fails
	// once it passes 64 KiB.
	t.Run("endless trailer", func(t *testing.T) {
		c, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			io.WriteString(c, "POST "+srv.URL+"/ HTTP/1.1\r\nHost: "+host+"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
			line := "X-Pad: " + strings.Repeat("x", 1000) + "\r\n"
			for i := 0; i < 1000; i++ {
				if _, err := io.WriteString(c, line); err != nil {
					return
				}
			}
		}()
		c.SetReadDeadline(time.Now().Add(egressHandshake / 2))
		if b, err := io.ReadAll(c); err != nil && !strings.Contains(err.Error(), "reset") || strings.Contains(string(b), "200 OK") {
			t.Fatalf("an endless trailer: %q %v", b, err)
		}
	})
}

// TestEgressConnectEarlyData: bytes a client sends right after its
// CONNECT, in the same write, without waiting for the 200 (as a TLS
// client with the ClientHello may), reach the server.
func TestEgressConnectEarlyData(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		io.Copy(c, c)
		c.Close()
	}()
	e, err := startEgress(&Config{AllowHosts: []string{l.Addr().String()}}, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.stop()
	c, err := net.Dial("tcp", playPid1(t, e))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT "+l.Addr().String()+" HTTP/1.1\r\nHost: x\r\n\r\nping")
	want := "HTTP/1.1 200 Connection established\r\n\r\nping"
	c.SetReadDeadline(time.Now().Add(egressHandshake / 2))
	b := make([]byte, len(want))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != want {
		t.Fatalf("read %q, %v; want %q", b, err, want)
	}
}

// TestEgressStopDialing: a session that ends while the proxy dials for it
// a server that does not answer (its SYNs dropped: here a listener whose
// queue is full) does not keep `sandbox run` waiting for the dial's
// timeout, egressHandshake per address: stop cancels it.
func TestEgressStopDialing(t *testing.T) {
	fd := listenLoopback(t) // backlog 8
	defer unix.Close(fd)
	sa, _ := unix.Getsockname(fd)
	port := sa.(*unix.SockaddrInet4).Port
	black := fmt.Sprintf("127.0.0.1:%d", port)
	// Fill its queue: never accepted, later SYNs are dropped.
	for i := 0; i < 16; i++ {
		d := net.Dialer{Timeout: 200 * time.Millisecond}
		c, err := d.Dial("tcp", black)
		if err != nil {
			break
		}
		defer c.Close()
	}
	e, err := startEgress(&Config{AllowHosts: []string{black}}, io.Discard, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", playPid1(t, e))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT "+black+" HTTP/1.1\r\nHost: x\r\n\r\n")
	// Wait until the proxy's connection to it is in SYN_SENT.
	want := fmt.Sprintf(":%04X 02 ", port)
	for i := 0; ; i++ {
		raw, _ := os.ReadFile("/proc/net/tcp")
		found := false
		for _, line := range strings.Split(string(raw), "\n") {
			if f := strings.Fields(line); len(f) > 3 && strings.HasSuffix(f[2], fmt.Sprintf(":%04X", port)) && f[3] == "02" {
				found = true
			}
		}
		if found {
			break
		}
		if i > 5000 {
			t.Fatalf("the proxy never dialled %s (%s)", black, want)
		}
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() { e.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(egressHandshake / 2):
		t.Fatal("stop waits for a dial in flight")
	}
}

// TestEgressZoneName: a session asks for an address with a zone that ends
// in an allowed domain ([::ffff:A.B.C.D%25x.example.com]:443, by CONNECT,
// by a plain request and by SOCKS5): the resolver reads it as the address
// A.B.C.D, so it would reach any address through *.example.com. It is
// refused as a denial, with nothing allowed in the log.
func TestEgressZoneName(t *testing.T) {
	var log strings.Builder
	e, err := startEgress(&Config{AllowDomains: []string{"*.example.com"}}, &lockedWriter{w: &log}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.hostAddrs = func() ([]net.IP, error) { return nil, nil }
	relay := playPid1(t, e)
	defer e.stop()
	const zoned = "::ffff:93.184.215.14%x.example.com"
	for _, req := range []string{
		"CONNECT [::ffff:93.184.215.14%25x.example.com]:443 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://[::ffff:93.184.215.14%25x.example.com]/ HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		c, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, req)
		b, _ := io.ReadAll(c)
		c.Close()
		if !strings.HasPrefix(string(b), "HTTP/1.1 403") || !strings.Contains(string(b), ReasonEgressDenied) {
			t.Errorf("%q: answered %q, want 403 %s", req, b, ReasonEgressDenied)
		}
	}
	s, err := net.Dial("tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{5, 1, 0})
	greet := make([]byte, 2)
	if _, err := io.ReadFull(s, greet); err != nil || string(greet) != "\x05\x00" {
		t.Fatalf("greeting: %q %v", greet, err)
	}
	s.Write(append(append([]byte{5, 1, 0, 3, byte(len(zoned))}, zoned...), 1, 187))
	reply := make([]byte, 2)
	if _, err := io.ReadFull(s, reply); err != nil || string(reply) != "\x05\x02" {
		t.Errorf("SOCKS5 to %s: reply %q %v, want 5 2", zoned, reply, err)
	}
	s.Close()
	e.stop()
	if strings.Contains(log.String(), "allowed") || strings.Count(log.String(), "denied ") != 3 {
		t.Errorf("log, want three denials and nothing allowed:\n%s", log.String())
	}
}
