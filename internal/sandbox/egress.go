package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bushost/bushost/internal/sandbox/pid1"
)

// egressProxy is the one proxy of one session: a set of goroutines in the
// `sandbox run` process that made the session, serving the socket the
// session's pid 1 made listening on its loopback and handed over
// (handOffRelay). It ends with Run (after the session), and a launcher
// that dies takes it along. One per session rather than one per host: the
// policy is the session's, there is nothing to tell apart, and nothing
// outlives the session.
type egressProxy struct {
	allowDomains []string
	allowHosts   []string
	// allowHostAddrs are the host's own addresses an --allow-domain name
	// may resolve to (--allow-host-address); hostAddrs lists the host's.
	allowHostAddrs []net.IP
	hostAddrs      func() ([]net.IP, error)
	hosts          map[string][]net.IP // from --resolve-file, looked at first
	maxConns       int
	idle           time.Duration
	log            io.Writer // one line per decision and per close, without audit
	audit          *auditor  // nil: decisions go to log only

	// ctl receives the relay's socket from pid 1; child is its other end,
	// which run hands to the session as pid1.FDRelay and then closes.
	ctl   *net.UnixConn
	child *os.File
	// handed is closed once pid 1's message was read (or could not be).
	handed chan struct{}
	// relayPort is the port the relay's socket must listen on: pid1.RelayPort,
	// but another for unit tests, which play pid 1 in the host's namespace.
	relayPort int
	slots     chan struct{}
	// refusing bounds the connections over --egress-conns held while
	// they are told why (maxRefusing); the rest are closed at once.
	refusing chan struct{}
	// denials paces the session's denied attempts.
	denials *pacer
	wg      sync.WaitGroup
	mu      sync.Mutex
	ln      net.Listener // the relay's socket, once pid 1 sent it
	conns   map[net.Conn]bool
	// lastConn numbers the session's connections to the proxy (the
	// decision's conn).
	lastConn atomic.Int64
	// ctx ends with stop: a lookup or a dial in flight (up to
	// egressHandshake for each address) does not hold the session's end.
	ctx    context.Context
	cancel context.CancelFunc
}

// egressHandshake bounds how long a client may take to say where it goes.
const egressHandshake = 10 * time.Second

// maxRefusing bounds the connections over --egress-conns the proxy holds
// to tell the client why (up to egressHandshake each): a session opening
// connection after connection, silent, must not make `sandbox run` hold a
// descriptor and a goroutine for each.
const maxRefusing = 16

// maxRequestHead bounds an HTTP request's line and headers.
const maxRequestHead = 64 << 10

// startEgress makes the socket pair pid 1 hands the relay's socket over;
// launched starts waiting for it.
func startEgress(cfg *Config, log io.Writer, audit *auditor) (*egressProxy, error) {
	e := &egressProxy{allowDomains: cfg.AllowDomains, allowHosts: cfg.AllowHosts, maxConns: cfg.EgressConns,
		idle: cfg.EgressIdle, log: log, audit: audit, conns: map[net.Conn]bool{}, relayPort: pid1.RelayPort, hostAddrs: hostAddrs}
	for _, a := range cfg.AllowHostAddrs {
		e.allowHostAddrs = append(e.allowHostAddrs, net.ParseIP(a))
	}
	if e.maxConns <= 0 {
		e.maxConns = DefaultEgressConns
	}
	if e.idle <= 0 {
		e.idle = DefaultEgressIdle
	}
	if cfg.ResolveFile != "" {
		h, err := readHostsFile(cfg.ResolveFile)
		if err != nil {
			return nil, err
		}
		e.hosts = h
	}
	var err error
	if e.ctl, e.child, err = relayPair(); err != nil {
		return nil, err
	}
	e.slots = make(chan struct{}, e.maxConns)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.refusing = make(chan struct{}, maxRefusing)
	e.denials = &pacer{rate: egressDenyRate, burst: egressDenyBurst, tokens: egressDenyBurst, last: time.Now()}
	e.handed = make(chan struct{})
	return e, nil
}

// launched closes the session's end of the pair in run, once bwrap has it,
// and starts waiting for pid 1's message.
func (e *egressProxy) launched() {
	e.child.Close()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ln, err := receiveRelay(e.ctl, e.relayPort)
		e.ctl.Close()
		if err != nil {
			close(e.handed)
			// pid 1 fails the session when it cannot hand the socket
			// over; a session that ended first is no failure.
			if !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
				e.logf("egress relay: %v", err)
			}
			return
		}
		e.mu.Lock()
		if e.conns == nil {
			e.mu.Unlock()
			ln.Close()
			close(e.handed)
			return
		}
		e.ln = ln
		e.mu.Unlock()
		close(e.handed)
		e.serve(ln)
	}()
}

// stop closes the relay's socket and every connection, and waits for them.
func (e *egressProxy) stop() {
	e.cancel()
	e.ctl.Close()
	e.child.Close()
	e.mu.Lock()
	if e.ln != nil {
		e.ln.Close()
	}
	for c := range e.conns {
		c.Close()
	}
	// No connection is taken on from here: track refuses it.
	e.conns = nil
	e.mu.Unlock()
	e.wg.Wait()
}

// logf writes one line, in one Write: e.log serialises them (lineLimiter).
func (e *egressProxy) logf(format string, a ...any) {
	fmt.Fprintf(e.log, "sandbox: network.egress "+format+"\n", a...)
}

// deny records a denial: in the broker with --audit-token-file (one by
// one up to a bound, then counted), else on stderr (bounded).
func (e *egressProxy) deny(d decision) {
	d.Decision, d.Time = "denied", time.Now().UTC().Format(time.RFC3339Nano)
	if e.audit != nil {
		e.audit.deny(d)
		return
	}
	if d.Host == "" {
		// Refused before it said where it goes.
		e.logf("denied connection %d: %s", d.Conn, d.Why)
		return
	}
	e.logf("denied %s: %s", target{d.Host, d.Port}, d.Why)
}

// allow records d, a connection the policy allows, before it is made: in
// the broker with --audit-token-file, waiting until the broker holds it
// (an error: it does not, and the connection is not made), else on
// stderr, past the lines' bound.
func (e *egressProxy) allow(d decision) error {
	d.Decision, d.Time = "allowed", time.Now().UTC().Format(time.RFC3339Nano)
	if e.audit != nil {
		return e.audit.allow(e.ctx, d)
	}
	e.logAlways("allowed %s (%s)", target{d.Host, d.Port}, d.Rule)
	return nil
}

// note records an allowed connection's end (unreachable, closed), never
// dropped: in the broker's next batch, or on stderr past the bound.
func (e *egressProxy) note(d decision) {
	d.Time = time.Now().UTC().Format(time.RFC3339Nano)
	if e.audit != nil {
		e.audit.note(d)
		return
	}
	t := target{d.Host, d.Port}
	switch d.Decision {
	case "closed":
		e.logAlways("closed %s: %d bytes out, %d bytes in, via %s", t, d.BytesOut, d.BytesIn, d.Addr)
	case "unreachable":
		e.logAlways("allowed %s (%s) but unreachable: %s", t, d.Rule, d.Why)
	}
}

func (e *egressProxy) logAlways(format string, a ...any) {
	writeAlways(e.log, fmt.Appendf(nil, "sandbox: network.egress "+format+"\n", a...))
}

func (e *egressProxy) track(c net.Conn, on bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if on {
		if e.conns == nil {
			return false
		}
		e.conns[c] = true
	} else {
		delete(e.conns, c)
	}
	return true
}

func (e *egressProxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of descriptors: wait a little rather than spin.
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return
		}
		id := e.lastConn.Add(1)
		// sem holds c's place until do, on c, has ended.
		sem, do := e.slots, func() {
			defer lingerClose(c)
			e.handle(c, id)
		}
		select {
		case e.slots <- struct{}{}:
		default:
			// Over the bound: the client gets the reason in its protocol.
			e.deny(decision{Conn: id, Why: fmt.Sprintf("%s: over --egress-conns %d", ReasonEgressConnections, e.maxConns)})
			select {
			case e.refusing <- struct{}{}:
			default:
				// As many are being told already: no word for this one.
				c.Close()
				continue
			}
			sem, do = e.refusing, func() {
				c.SetDeadline(time.Now().Add(egressHandshake))
				e.refuseEarly(c, fmt.Sprintf("%s: the session holds %d connections, the most --egress-conns allows", ReasonEgressConnections, e.maxConns))
				lingerClose(c)
			}
		}
		if !e.track(c, true) {
			c.Close()
			<-sem
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer func() { <-sem }()
			// Tracked, so that stop closes it rather than wait out
			// the handshake's bound.
			defer e.track(c, false)
			do()
		}()
	}
}

// lingerTime and lingerBytes bound what lingerClose reads of a client that
// has not finished sending.
const (
	lingerTime  = time.Second
	lingerBytes = 64 << 10
)

// lingerClose ends a session's connection gently: it closes the sending
// side, reads (and drops) what the client still sends, up to its end or
// lingerBytes or lingerTime, then closes. Closing a TCP socket with unread
// bytes makes the kernel reset the connection, which would throw away the
// refusal the client has not read yet.
func lingerClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
		tc.SetReadDeadline(time.Now().Add(lingerTime))
		io.CopyN(io.Discard, tc, lingerBytes)
	}
	c.Close()
}

// refuseEarly answers a client the proxy will not serve at all, in its
// protocol, without reading more than the first bytes.
func (e *egressProxy) refuseEarly(c net.Conn, why string) {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return
	}
	if b[0] == 5 {
		c.Write([]byte{5, 0xff})
		return
	}
	writeHTTPRefusal(c, http.StatusServiceUnavailable, why)
}

// target is where a client asked to go.
type target struct {
	host string // a name or a literal address, as asked
	port int
}

func (t target) String() string { return net.JoinHostPort(t.host, strconv.Itoa(t.port)) }

func (e *egressProxy) handle(c net.Conn, id int64) {
	c.SetDeadline(time.Now().Add(egressHandshake))
	br := bufio.NewReaderSize(c, 4096)
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	if first[0] == 5 {
		e.socks(c, br, id)
		return
	}
	e.httpProxy(c, br, id)
}

// socks serves one SOCKS5 CONNECT (RFC 1928), without authentication.
func (e *egressProxy) socks(c net.Conn, br *bufio.Reader, id int64) {
	var hdr [2]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return
	}
	if !strings.ContainsRune(string(methods), 0) {
		c.Write([]byte{5, 0xff})
		return
	}
	c.Write([]byte{5, 0})
	var req [4]byte
	if _, err := io.ReadFull(br, req[:]); err != nil {
		return
	}
	reply := func(code byte) { c.Write([]byte{5, code, 0, 1, 0, 0, 0, 0, 0, 0}) }
	if req[0] != 5 || req[1] != 1 {
		reply(7) // command not supported: CONNECT only
		return
	}
	// The address (IPv4, IPv6, or a name after its length), then the port.
	var addr []byte
	switch req[3] {
	case 1:
		addr = make([]byte, 4+2)
	case 4:
		addr = make([]byte, 16+2)
	case 3:
		n, err := br.ReadByte()
		if err != nil {
			return
		}
		addr = make([]byte, int(n)+2)
	default:
		reply(8)
		return
	}
	if _, err := io.ReadFull(br, addr); err != nil {
		return
	}
	host, port := addr[:len(addr)-2], addr[len(addr)-2:]
	t := target{host: string(host), port: int(binary.BigEndian.Uint16(port))}
	if req[3] != 3 {
		t.host = net.IP(host).String()
	}
	up, why := e.connect(id, t)
	if up == nil {
		switch {
		case strings.HasPrefix(why, ReasonEgressDenied):
			reply(2) // connection not allowed by ruleset
		case strings.HasPrefix(why, ReasonEgressUnrecorded):
			reply(1) // general failure
		default:
			reply(5)
		}
		return
	}
	reply(0)
	e.pipe(c, br, up, id, t, 0)
}

// httpProxy serves one HTTP proxy request: CONNECT, or a plain request in
// absolute form, sent on with "Connection: close" so every request on the
// connection is decided anew.
func (e *egressProxy) httpProxy(c net.Conn, br *bufio.Reader, id int64) {
	head := bufio.NewReader(io.LimitReader(br, maxRequestHead))
	req, err := http.ReadRequest(head)
	if err != nil {
		writeHTTPRefusal(c, http.StatusBadRequest, "sandbox: not an HTTP proxy request or a SOCKS5 greeting")
		return
	}
	// head read ahead of the request's head: what the client sent after
	// it (a body, or the first bytes through a CONNECT the client did not
	// wait for) is read from there first.
	if n := head.Buffered(); n > 0 {
		ahead, _ := head.Peek(n)
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(ahead)), br), 4096)
	}
	hostport := req.Host
	if req.Method != http.MethodConnect {
		if req.URL.Scheme != "http" || req.URL.Host == "" {
			writeHTTPRefusal(c, http.StatusBadRequest, "sandbox: want CONNECT HOST:PORT or a request to http://HOST/...")
			return
		}
		hostport = req.URL.Host
		if req.URL.Port() == "" {
			hostport = net.JoinHostPort(req.URL.Hostname(), "80")
		}
	}
	h, p, err := net.SplitHostPort(hostport)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		writeHTTPRefusal(c, http.StatusBadRequest, "sandbox: want HOST:PORT, got "+hostport)
		return
	}
	if len(h) > 253 {
		writeHTTPRefusal(c, http.StatusBadRequest, "sandbox: a host name is at most 253 bytes")
		return
	}
	t := target{host: h, port: port}
	up, why := e.connect(id, t)
	if up == nil {
		code := http.StatusBadGateway
		switch {
		case strings.HasPrefix(why, ReasonEgressDenied):
			code = http.StatusForbidden
		case strings.HasPrefix(why, ReasonEgressUnrecorded):
			code = http.StatusServiceUnavailable
		}
		writeHTTPRefusal(c, code, "sandbox: "+why)
		return
	}
	if req.Method == http.MethodConnect {
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			up.Close()
			return
		}
		e.pipe(c, br, up, id, t, 0)
		return
	}
	req.Header.Del("Proxy-Connection")
	req.Header.Del("Proxy-Authorization")
	req.Close = true
	req.RequestURI = ""
	// The request was read from a bounded reader: its body is read on
	// from the connection itself, as framed (req.Write reads a body to
	// its end: the raw connection would hold the request until the client
	// closed). What follows it is piped on like the rest.
	switch {
	case len(req.TransferEncoding) > 0:
		req.Body = &chunkedBody{r: httputil.NewChunkedReader(br), br: br}
	case req.ContentLength > 0:
		req.Body = io.NopCloser(io.LimitReader(br, req.ContentLength))
	}
	// The body has --egress-idle to come, not the handshake's bound.
	c.SetDeadline(time.Now().Add(e.idle))
	up.SetDeadline(time.Now().Add(e.idle))
	cw := &countWriter{w: up}
	if err := req.Write(cw); err != nil {
		up.Close()
		return
	}
	e.pipe(c, br, up, id, t, cw.n)
}

// chunkedBody is a chunked request body decoded (req.Write encodes it
// again), with the trailer section after its last chunk read and dropped,
// up to maxRequestHead.
type chunkedBody struct {
	r    io.Reader
	br   *bufio.Reader
	done bool
}

func (b *chunkedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		for total := 0; ; {
			line, lerr := b.br.ReadSlice('\n')
			if total += len(line); lerr != nil || total > maxRequestHead {
				return n, errors.New("sandbox: a chunked body's trailer is cut or over 64 KiB")
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				break
			}
		}
	}
	return n, err
}

func (b *chunkedBody) Close() error { return nil }

func writeHTTPRefusal(c net.Conn, code int, msg string) {
	body := msg + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// connect decides, records and dials. It returns the connection, or nil
// and why not; a refusal by the policy starts with ReasonEgressDenied. A
// denial waits its turn (e.denials); an allowed connection is recorded
// before it is made, and not made if it cannot be.
func (e *egressProxy) connect(id int64, t target) (net.Conn, string) {
	ips, rule, why := e.decide(t)
	if ips == nil {
		e.denials.wait(e.ctx)
		e.deny(decision{Conn: id, Host: t.host, Port: t.port, Why: why})
		return nil, why
	}
	if err := e.allow(decision{Conn: id, Host: t.host, Port: t.port, Rule: rule}); err != nil {
		why := fmt.Sprintf("%s: %s is allowed (%s) but its record could not be written, so it is not made: %v", ReasonEgressUnrecorded, t, rule, err)
		e.logAlways("refused %s: %s", t, why)
		return nil, why
	}
	var lastErr error
	for _, ip := range ips {
		d := net.Dialer{Timeout: egressHandshake}
		up, err := d.DialContext(e.ctx, "tcp", net.JoinHostPort(ip.String(), strconv.Itoa(t.port)))
		if err == nil {
			return up, ""
		}
		lastErr = err
	}
	e.note(decision{Conn: id, Host: t.host, Port: t.port, Decision: "unreachable", Rule: rule, Why: lastErr.Error()})
	return nil, fmt.Sprintf("%s is allowed (%s) but could not be reached: %v", t, rule, lastErr)
}

// The session's denied attempts are rate limited: egressDenyBurst at
// once, then egressDenyRate a second. A denial over it is answered when
// its turn comes (at most egressHandshake later), its connection holding
// its slot meanwhile, so a session flooding refused requests slows itself
// and nothing else.
const (
	egressDenyRate  = 50
	egressDenyBurst = 100
)

// pacer spaces calls of wait to rate a second after burst at once.
type pacer struct {
	mu           sync.Mutex
	rate, tokens float64
	burst        float64
	last         time.Time
}

// wait returns once the caller's turn has come, at most egressHandshake
// from now, or when ctx ends.
func (p *pacer) wait(ctx context.Context) {
	p.mu.Lock()
	now := time.Now()
	p.tokens = min(p.burst, p.tokens+now.Sub(p.last).Seconds()*p.rate)
	p.last = now
	p.tokens--
	d := time.Duration(-p.tokens / p.rate * float64(time.Second))
	if d > egressHandshake {
		// Past the longest wait: this one does not queue.
		p.tokens++
		d = egressHandshake
	}
	p.mu.Unlock()
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// decide applies the policy: the addresses to dial and the rule that
// allows them, or nil and why not.
func (e *egressProxy) decide(t target) ([]net.IP, string, string) {
	exact := ""
	for _, h := range e.allowHosts {
		hh, hp, _ := net.SplitHostPort(h)
		if strings.EqualFold(hh, t.host) && hp == strconv.Itoa(t.port) {
			exact = h
		}
	}
	if ip := net.ParseIP(t.host); ip != nil {
		if exact == "" {
			return nil, "", fmt.Sprintf("%s: %s is not named by --allow-host", ReasonEgressDenied, t)
		}
		return []net.IP{ip}, "--allow-host " + exact, ""
	}
	rule := ""
	if exact != "" {
		rule = "--allow-host " + exact
	} else if p := domainAllowed(e.allowDomains, t.host, t.port); p != "" {
		if !hostName(t.host) {
			// The resolver would read [::ffff:A.B.C.D%x.example.com] as
			// the address A.B.C.D, its zone ignored.
			return nil, "", fmt.Sprintf("%s: %q is not a host name (letters, digits, '-' and '_' between dots), so --allow-domain %s does not cover it", ReasonEgressDenied, t.host, p)
		}
		rule = "--allow-domain " + p
	} else {
		return nil, "", fmt.Sprintf("%s: %s is not named by --allow-domain (NAME opens 443 and 80, NAME:PORT that port) or --allow-host", ReasonEgressDenied, t)
	}
	ips, err := e.resolve(t.host)
	if err != nil || len(ips) == 0 {
		return nil, "", fmt.Sprintf("%s is allowed (%s) but does not resolve: %v", t.host, rule, err)
	}
	if exact == "" {
		// Every address must be public and not the host's own: a name
		// that resolves to the host (any of its interfaces), the
		// metadata service or the local network is refused, whatever
		// its domain.
		own, err := e.hostAddrs()
		if err != nil {
			return nil, "", fmt.Sprintf("%s: %s: the host's own addresses cannot be listed to rule them out: %v", ReasonEgressDenied, t.host, err)
		}
		for _, ip := range ips {
			if r := blockedIP(ip); r != "" {
				return nil, "", fmt.Sprintf("%s: %s resolves to %s, in %s, which only an --allow-host naming it exactly reaches", ReasonEgressDenied, t.host, ip, r)
			}
			if slices.ContainsFunc(own, ip.Equal) && !slices.ContainsFunc(e.allowHostAddrs, ip.Equal) {
				return nil, "", fmt.Sprintf("%s: %s resolves to %s, one of this host's own addresses, which only --allow-host-address %s or an --allow-host naming it exactly reaches", ReasonEgressDenied, t.host, ip, ip)
			}
		}
	}
	return ips, rule, ""
}

// resolve looks a name up in --resolve-file first, then through the host's
// resolver.
func (e *egressProxy) resolve(name string) ([]net.IP, error) {
	if ips, ok := e.hosts[strings.ToLower(strings.TrimSuffix(name, "."))]; ok {
		return ips, nil
	}
	ctx, cancel := context.WithTimeout(e.ctx, egressHandshake)
	defer cancel()
	return net.DefaultResolver.LookupIP(ctx, "ip", name)
}

// pipe copies both ways until either side closes or the connection has
// been idle for e.idle, then logs the bytes each way.
func (e *egressProxy) pipe(c net.Conn, br *bufio.Reader, up net.Conn, id int64, t target, sent int64) {
	if !e.track(up, true) {
		up.Close()
		return
	}
	defer e.track(up, false)
	defer up.Close()
	c.SetDeadline(time.Time{})
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var out, in atomic.Int64
	out.Store(sent)
	// idled is set by the way that found the connection idle: the other
	// way may be blocked writing to a peer that does not read (no byte
	// moves, but no read times out either), so it is woken by deadlines
	// in the past and ends too.
	var idled atomic.Bool
	cut := func() {
		idled.Store(true)
		now := time.Now()
		c.SetDeadline(now)
		up.SetDeadline(now)
	}
	copyDir := func(dst net.Conn, src io.Reader, srcConn net.Conn, n *atomic.Int64) {
		// io.Copy lets the kernel move the bytes (splice(2) from one TCP
		// connection to the other): the idle check runs
		// in windows of half e.idle, each way noting when it last moved
		// bytes, and a connection silent both ways for e.idle is closed
		// at the end of the window it falls in (after at most 1.5x
		// --egress-idle).
		for {
			srcConn.SetReadDeadline(time.Now().Add(e.idle / 2))
			k, err := io.Copy(dst, src)
			if k > 0 {
				last.Store(time.Now().UnixNano())
				n.Add(k)
			}
			var ne net.Error
			if err == nil || !errors.As(err, &ne) || !ne.Timeout() || idled.Load() {
				break
			}
			if time.Since(time.Unix(0, last.Load())) < e.idle {
				continue
			}
			cut()
			break
		}
		// The other way may still carry a response: half-close.
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	done := make(chan struct{})
	go func() {
		copyDir(c, up, up, &in)
		close(done)
	}()
	copyDir(up, br, c, &out)
	// The session may have closed its sending side and stopped reading:
	// the way left is then blocked writing, and reads time out no more.
	// Cut it when nothing moved either way for e.idle.
	tick := time.NewTicker(e.idle / 2)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-tick.C:
			if time.Since(time.Unix(0, last.Load())) >= e.idle {
				cut()
			}
		}
	}
	e.note(decision{Conn: id, Host: t.host, Port: t.port, Addr: up.RemoteAddr().String(), Decision: "closed", BytesOut: out.Load(), BytesIn: in.Load()})
}

// readHostsFile reads a hosts(5) file: ADDRESS NAME... per line, # starts
// a comment. Bounded: a file over 1 MiB is refused.
func readHostsFile(path string) (map[string][]net.IP, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--resolve-file: %w", err)
	}
	if len(data) > 1<<20 {
		return nil, fmt.Errorf("--resolve-file %s: over 1 MiB", path)
	}
	hosts := map[string][]net.IP{}
	for i, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		ip := net.ParseIP(f[0])
		if ip == nil || len(f) < 2 {
			return nil, fmt.Errorf("--resolve-file %s:%d: want ADDRESS NAME...", path, i+1)
		}
		for _, n := range f[1:] {
			n = strings.ToLower(strings.TrimSuffix(n, "."))
			hosts[n] = append(hosts[n], ip)
		}
	}
	return hosts, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
