// Command hostile is a hostile peer of bushostd's sockets, for the
// transport tests (integration/transport_test.go): it speaks raw HTTP/2
// (golang.org/x/net/http2's Framer) or grpc-go, does one abuse, prints
// "ready" once it is under way, and keeps at it until killed. The tests run
// it as an unprivileged user in the socket group.
//
//	hostile unfinished   SOCK CONNS STREAMS SIZE   requests declaring SIZE bytes, all but the last byte sent
//	hostile headers      SOCK STREAMS SIZE         one header value of SIZE bytes per stream
//	hostile continuation SOCK CONNS                a header block never ended, CONTINUATION frames forever
//	hostile empty        SOCK STREAMS              streams opened and left (headers only), on as many connections as it takes
//	hostile conns        SOCK N                    N connections that never send a call
//	hostile follow       SOCK TOKEN N              N `events --follow` streams
//	hostile noread       SOCK TOKEN N              N ListEvents streams with a zero receive window
//	hostile trickle      SOCK TOKEN                a push sending one byte a second
//	hostile logs         SOCK TOKEN ID CONNS STREAMS  launch.sock Logs calls of session ID, one at a time, on CONNS connections with a zero receive window, STREAMS each
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: hostile MODE SOCK ...")
		os.Exit(2)
	}
	mode, sock, args := os.Args[1], os.Args[2], os.Args[3:]
	n := func(i int) int {
		v, err := strconv.Atoi(args[i])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return v
	}
	var err error
	switch mode {
	case "unfinished":
		err = unfinished(sock, n(0), n(1), n(2))
	case "headers":
		err = headers(sock, n(0), n(1))
	case "continuation":
		err = continuation(sock, n(0))
	case "empty":
		err = empty(sock, n(0))
	case "conns":
		err = conns(sock, n(0))
	case "follow":
		err = follow(sock, args[0], n(1))
	case "noread":
		err = noread(sock, args[0], n(1))
	case "trickle":
		err = trickle(sock, args[0])
	case "logs":
		err = logs(sock, args[0], args[1], n(2), n(3))
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

func ready() { fmt.Println("ready") }

// forever keeps the process (and its connections) alive until killed.
func forever() error { select {} }

// conn is one raw HTTP/2 connection that keeps to the server's flow
// control (a peer that does not is cut at once, which proves nothing): it
// sends DATA only within the windows the server granted.
type conn struct {
	c   net.Conn
	fr  *http2.Framer
	wmu sync.Mutex // the Framer's writes

	mu      sync.Mutex
	cond    *sync.Cond
	connWin int64
	initWin int64
	win     map[uint32]int64
	dead    map[uint32]bool
	closed  bool
	// onEnd, when set, is told the grpc-status of each stream the server
	// ends.
	onEnd func(id uint32, status string)
	// onHeaders, when set, is told of each stream whose response the
	// server has begun (its headers, ahead of the message).
	onHeaders func(id uint32)
	// onReset, when set, is told of each stream the server resets.
	onReset func(id uint32, code string)
}

func dial(sock string, settings ...http2.Setting) (*conn, error) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return nil, err
	}
	fr := http2.NewFramer(c, c)
	fr.SetMaxReadFrameSize(1 << 20)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(settings...); err != nil {
		return nil, err
	}
	k := &conn{c: c, fr: fr, connWin: 65535, initWin: 65535, win: map[uint32]int64{}, dead: map[uint32]bool{}}
	k.cond = sync.NewCond(&k.mu)
	return k, nil
}

// drain reads what the server sends, keeps the windows, and answers
// SETTINGS and PING, so that the server is never held up by its own
// writes: the abuse is all on the reading side. It stops when the
// connection ends.
func (c *conn) drain(done chan<- struct{}) {
	defer func() {
		c.mu.Lock()
		c.closed = true
		c.cond.Broadcast()
		c.mu.Unlock()
		if done != nil {
			close(done)
		}
	}()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		c.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					d := int64(v) - c.initWin
					c.initWin = int64(v)
					for id := range c.win {
						c.win[id] += d
					}
				}
				c.wmu.Lock()
				c.fr.WriteSettingsAck()
				c.wmu.Unlock()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.wmu.Lock()
				c.fr.WritePing(true, f.Data)
				c.wmu.Unlock()
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.connWin += int64(f.Increment)
			} else {
				c.win[f.StreamID] += int64(f.Increment)
			}
		case *http2.RSTStreamFrame:
			c.dead[f.StreamID] = true
			if c.onReset != nil {
				c.onReset(f.StreamID, f.ErrCode.String())
			}
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() && c.onHeaders != nil {
				c.onHeaders(f.StreamID)
			}
			if f.StreamEnded() {
				c.dead[f.StreamID] = true
				if c.onEnd != nil {
					c.onEnd(f.StreamID, f.PseudoValue("status")+" grpc-status="+grpcStatus(f))
				}
			}
		case *http2.GoAwayFrame:
			c.closed = true
		}
		c.cond.Broadcast()
		c.mu.Unlock()
	}
}

// open starts stream id's window.
func (c *conn) open(id uint32) {
	c.mu.Lock()
	c.win[id] = c.initWin
	c.mu.Unlock()
}

// data sends p on stream id within the windows; it returns false once the
// stream or the connection is gone.
func (c *conn) data(id uint32, p []byte) bool {
	for len(p) > 0 {
		c.mu.Lock()
		for !c.closed && !c.dead[id] && (c.connWin <= 0 || c.win[id] <= 0) {
			c.cond.Wait()
		}
		if c.closed || c.dead[id] {
			c.mu.Unlock()
			return false
		}
		n := min(int64(len(p)), c.connWin, c.win[id], 16<<10)
		c.connWin -= n
		c.win[id] -= n
		c.mu.Unlock()
		c.wmu.Lock()
		err := c.fr.WriteData(id, false, p[:n])
		c.wmu.Unlock()
		if err != nil {
			return false
		}
		p = p[n:]
	}
	return true
}

func grpcStatus(f *http2.MetaHeadersFrame) string {
	for _, h := range f.Fields {
		if h.Name == "grpc-status" {
			return h.Value
		}
	}
	return ""
}

func (c *conn) gone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func headerBlock(path string, extra ...hpack.HeaderField) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	enc.SetMaxDynamicTableSizeLimit(0)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "localhost"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		enc.WriteField(f)
	}
	for _, f := range extra {
		enc.WriteField(f)
	}
	return b.Bytes()
}

// writeHeaders sends a header block in frames of at most 16 KiB.
func (c *conn) writeHeaders(id uint32, block []byte, endStream bool) error {
	c.open(id)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	const max = 16 << 10
	first := block[:min(len(block), max)]
	rest := block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(rest) == 0, EndStream: endStream}); err != nil {
		return err
	}
	for len(rest) > 0 {
		f := rest[:min(len(rest), max)]
		rest = rest[len(f):]
		if err := c.fr.WriteContinuation(id, len(rest) == 0, f); err != nil {
			return err
		}
	}
	return nil
}

const recordEvent = "/bushost.broker.v1.BrokerService/RecordEvent"

func unfinished(sock string, nconns, streams, size int) error {
	body := make([]byte, 64<<10)
	var wg sync.WaitGroup
	for i := 0; i < nconns; i++ {
		c, err := dial(sock)
		if err != nil {
			return err
		}
		go c.drain(nil)
		var prefix [5]byte
		binary.BigEndian.PutUint32(prefix[1:], uint32(size))
		// Every stream opened first, then each fed as far as the windows
		// let it, all but its last byte.
		for s := 0; s < streams; s++ {
			if c.writeHeaders(uint32(2*s+1), headerBlock(recordEvent), false) != nil {
				break
			}
		}
		for s := 0; s < streams; s++ {
			id := uint32(2*s + 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !c.data(id, prefix[:]) {
					return
				}
				for left := size - 1; left > 0; {
					k := min(left, len(body))
					if !c.data(id, body[:k]) {
						return
					}
					left -= k
				}
			}()
		}
	}
	wg.Wait()
	ready()
	return forever()
}

func headers(sock string, streams, size int) error {
	value := string(bytes.Repeat([]byte("a"), size))
	var c *conn
	id := uint32(1)
	for s := 0; s < streams; s++ {
		if c == nil || c.gone() {
			var err error
			if c, err = dial(sock); err != nil {
				return err
			}
			go c.drain(nil)
			id = 1
		}
		c.writeHeaders(id, headerBlock(recordEvent, hpack.HeaderField{Name: "x-big", Value: value}), false)
		id += 2
	}
	ready()
	return forever()
}

func continuation(sock string, nconns int) error {
	chunk := bytes.Repeat([]byte{0x40, 1, 'x', 1, 'y'}, 3000) // literal headers, 15 KB a frame
	for i := 0; i < nconns; i++ {
		go func() {
			for {
				c, err := dial(sock)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				done := make(chan struct{})
				go c.drain(done)
				c.wmu.Lock()
				if c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: headerBlock(recordEvent), EndHeaders: false}) == nil {
					for c.fr.WriteContinuation(1, false, chunk) == nil {
					}
				}
				c.wmu.Unlock()
				c.c.Close()
				<-done
			}
		}()
	}
	ready()
	return forever()
}

func empty(sock string, streams int) error {
	var c *conn
	id := uint32(1)
	for s := 0; s < streams; s++ {
		if c == nil || c.gone() || id > 1<<30 {
			var err error
			if c, err = dial(sock); err != nil {
				return err
			}
			go c.drain(nil)
			id = 1
		}
		c.writeHeaders(id, headerBlock(recordEvent), false)
		id += 2
	}
	ready()
	return forever()
}

func conns(sock string, n int) error {
	var held []*conn
	for i := 0; i < n; i++ {
		// Past the limits the daemon closes the connection: keep trying
		// anyway, as an attacker would.
		c, err := dial(sock)
		if err != nil {
			continue
		}
		held = append(held, c)
		go c.drain(nil)
	}
	ready()
	_ = held
	return forever()
}

func grpcConn(sock, token string) (*grpc.ClientConn, context.Context, error) {
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	return cc, ctx, err
}

func follow(sock, token string, n int) error {
	cc, ctx, err := grpcConn(sock, token)
	if err != nil {
		return err
	}
	c := brokerv1.NewBrokerServiceClient(cc)
	refused := 0
	for i := 0; i < n; i++ {
		s, err := c.ListEvents(ctx, &brokerv1.ListEventsRequest{Follow: true})
		if err != nil {
			return err
		}
		go func() {
			for {
				if _, err := s.Recv(); err != nil {
					return
				}
			}
		}()
	}
	_ = refused
	ready()
	return forever()
}

func noread(sock, token string, n int) error {
	// A zero initial window: the server may send nothing but headers.
	c, err := dial(sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	if err != nil {
		return err
	}
	ended := map[string]int{}
	total := 0
	start := time.Now()
	c.onEnd = func(_ uint32, status string) {
		ended[status]++
		if total++; total == n {
			fmt.Printf("ended %d after %s: %v\n", n, time.Since(start).Round(time.Millisecond), ended)
		}
	}
	go c.drain(nil)
	req, _ := proto.Marshal(&brokerv1.ListEventsRequest{})
	msg := make([]byte, 5+len(req))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(req)))
	copy(msg[5:], req)
	for i := 0; i < n; i++ {
		id := uint32(2*i + 1)
		block := headerBlock("/bushost.broker.v1.BrokerService/ListEvents", hpack.HeaderField{Name: "authorization", Value: "Bearer " + token})
		if err := c.writeHeaders(id, block, false); err != nil {
			return err
		}
		c.wmu.Lock()
		err := c.fr.WriteData(id, true, msg)
		c.wmu.Unlock()
		if err != nil {
			return err
		}
	}
	ready()
	return forever()
}

func trickle(sock, token string) error {
	cc, ctx, err := grpcConn(sock, token)
	if err != nil {
		return err
	}
	s, err := gitv1.NewGitServiceClient(cc).PushWorking(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Header{Header: &gitv1.PushHeader{}}}); err != nil {
		return err
	}
	ready()
	body := []byte("# v2 git bundle\n")
	start := time.Now()
	for i := 0; ; i++ {
		if err := s.Send(&gitv1.PushWorkingRequest{Msg: &gitv1.PushWorkingRequest_Chunk{Chunk: body[i%len(body) : i%len(body)+1]}}); err != nil {
			break
		}
		time.Sleep(time.Second)
	}
	var resp gitv1.PushWorkingResponse
	err = s.RecvMsg(&resp)
	if err == io.EOF || err == nil {
		return fmt.Errorf("the push was never cut")
	}
	fmt.Printf("cut after %s: %v\n", time.Since(start).Round(time.Millisecond), err)
	return nil
}

// logs asks launch.sock for the logs of session id on conns connections
// that grant no receive window: the server answers each call (its
// response headers arrive), and can send none of the message. Calls go
// one at a time, each once the previous one is answered, so that no
// bound on calls in flight is met. It prints "ready" once all are
// answered, with how many ended instead (refused).
func logs(sock, token, id string, nconns, streams int) error {
	req, _ := proto.Marshal(&launchv1.LogsRequest{Id: id})
	msg := make([]byte, 5+len(req))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(req)))
	copy(msg[5:], req)
	answered := make(chan string, 1)
	refused := map[string]int{}
	for i := 0; i < nconns; i++ {
		c, err := dial(sock, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		if err != nil {
			return err
		}
		c.onHeaders = func(uint32) { answered <- "" }
		c.onEnd = func(_ uint32, status string) { answered <- status }
		c.onReset = func(_ uint32, code string) { answered <- "reset " + code }
		go c.drain(nil)
		for j := 0; j < streams; j++ {
			block := headerBlock("/bushost.launch.v1.LaunchService/Logs", hpack.HeaderField{Name: "authorization", Value: "Bearer " + token})
			if err := c.writeHeaders(uint32(2*j+1), block, false); err != nil {
				return err
			}
			c.wmu.Lock()
			err := c.fr.WriteData(uint32(2*j+1), true, msg)
			c.wmu.Unlock()
			if err != nil {
				return err
			}
			select {
			case st := <-answered:
				if st != "" {
					refused[st]++
				}
			case <-time.After(time.Minute):
				return fmt.Errorf("connection %d stream %d: no answer in a minute", i, j)
			}
		}
	}
	fmt.Printf("ready\nrefused %v\n", refused)
	return forever()
}
