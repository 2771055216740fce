package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bushost/bushost/internal/textsafe"
)

// maxLine bounds one message, a line of JSON, in bytes: twice what one
// call's arguments may be (maxArguments), for the rest of the request.
const maxLine = 2 * maxArguments

// maxUnanswered bounds the requests read and not answered yet. Past it the
// server reads nothing more until it has answered one: a client that
// sends and does not read holds at most maxUnanswered requests here.
const maxUnanswered = 32

// stdio is the stdio transport of the protocol (one JSON-RPC message a
// line on in, one a line on out) as the SDK's IOTransport is, but a line
// that is not a message does not end the session: it is answered with
// the JSON-RPC error the spec gives (-32700 parse error for a line that is
// not JSON, -32600 invalid request for JSON that is not one message: a
// batch, an object that is not JSON-RPC 2.0, an id in use, a line over
// maxLine), with id null unless the line had a usable one, and the server
// reads on. The SDK's transport closes the connection on such a line.
type stdio struct {
	in  io.ReadCloser
	out io.WriteCloser
}

func (t *stdio) Connect(context.Context) (sdk.Connection, error) {
	c := &lineConn{in: t.in, out: t.out, lines: make(chan line), closed: make(chan struct{}),
		freed: make(chan struct{}, 1), unanswered: map[jsonrpc.ID]bool{}}
	go c.readLines()
	return c, nil
}

// line is one line read (without its bytes when tooLong), or the error
// that ended the input.
type line struct {
	b       []byte
	tooLong bool
	err     error
}

type lineConn struct {
	in  io.ReadCloser
	out io.WriteCloser

	lines     chan line
	closed    chan struct{}
	closeOnce sync.Once

	writeMu sync.Mutex

	mu         sync.Mutex
	unanswered map[jsonrpc.ID]bool // the requests passed on and not answered yet
	freed      chan struct{}       // a request was answered
}

// readLines reads in line by line until it fails; a line over maxLine is
// read to its end and passed on as tooLong, without its bytes. Reading
// runs apart from Read so that Close ends a Read waiting for input (a read
// of stdin cannot be interrupted; this goroutine ends with the input).
func (c *lineConn) readLines() {
	r := bufio.NewReaderSize(c.in, 64<<10)
	for {
		var l line
		var err error
		for {
			var frag []byte
			frag, err = r.ReadSlice('\n')
			switch {
			case l.tooLong:
			case len(l.b)+len(frag) > maxLine:
				l.tooLong, l.b = true, nil
			default:
				l.b = append(l.b, frag...)
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if len(l.b) > 0 || l.tooLong {
			if !c.pass(l) {
				return
			}
		}
		if err != nil {
			c.pass(line{err: err})
			return
		}
	}
}

func (c *lineConn) pass(l line) bool {
	select {
	case c.lines <- l:
		return true
	case <-c.closed:
		return false
	}
}

// Read returns the next message; it answers each line that is not one
// itself and reads on.
func (c *lineConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		var l line
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.closed:
			return nil, io.EOF
		case l = <-c.lines:
		}
		if l.err != nil {
			return nil, l.err
		}
		msg, err := c.decode(l)
		if err != nil {
			return nil, err
		}
		if msg == nil {
			continue
		}
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			if err := c.admit(ctx, req.ID); errors.Is(err, errIDInUse) {
				if err := c.refuse(req.ID, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: id %v is the id of a request not answered yet: give each request an id of its own", req.ID.Raw())); err != nil {
					return nil, err
				}
				continue
			} else if err != nil {
				return nil, err
			}
		}
		return msg, nil
	}
}

// decode returns the message of line l, or nil after answering a line
// that is not one; its error is a failure to write that answer.
func (c *lineConn) decode(l line) (jsonrpc.Message, error) {
	nullID := jsonrpc.ID{}
	b := bytes.TrimSpace(l.b)
	switch {
	case l.tooLong:
		return nil, c.refuse(nullID, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: a message is one line of at most %d bytes; this line was longer and was skipped", maxLine))
	case len(b) == 0:
		return nil, nil
	}
	var v json.RawMessage
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, c.refuse(nullID, jsonrpc.CodeParseError, fmt.Sprintf("parse error: the line is not JSON (%v): send one JSON-RPC message a line", err))
	}
	if b[0] == '[' {
		return nil, c.refuse(nullID, jsonrpc.CodeInvalidRequest, "invalid request: a batch (a JSON array) is not served: send one JSON-RPC message a line")
	}
	msg, err := jsonrpc.DecodeMessage(b)
	if err != nil {
		return nil, c.refuse(idOf(b), jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: not a JSON-RPC 2.0 message (%v)", err))
	}
	return msg, nil
}

// idOf is the id of a line that is JSON but no message, when it has one
// a response can carry (a string or a number); else null.
func idOf(b []byte) jsonrpc.ID {
	var v struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(b, &v) != nil {
		return jsonrpc.ID{}
	}
	id, err := jsonrpc.MakeID(v.ID)
	if err != nil {
		return jsonrpc.ID{}
	}
	return id
}

var errIDInUse = errors.New("the id of a request not answered yet")

// admit notes request id as unanswered, once fewer than maxUnanswered
// are; it waits for an answer (Write) while maxUnanswered are, until ctx
// ends or the connection closes.
func (c *lineConn) admit(ctx context.Context, id jsonrpc.ID) error {
	for {
		c.mu.Lock()
		switch {
		case c.unanswered[id]:
			c.mu.Unlock()
			return errIDInUse
		case len(c.unanswered) < maxUnanswered:
			c.unanswered[id] = true
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		select {
		case <-c.freed:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.closed:
			return io.EOF
		}
	}
}

// refuse answers a line that is no message with a JSON-RPC error (id null
// unless the line had a usable id).
func (c *lineConn) refuse(id jsonrpc.ID, code int64, msg string) error {
	b, err := json.Marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		ID      any    `json:"id"`
		Error   any    `json:"error"`
	}{"2.0", id.Raw(), &jsonrpc.Error{Code: code, Message: textsafe.Text(msg)}})
	if err != nil {
		return err
	}
	return c.write(append(b, '\n'))
}

func (c *lineConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return err
	}
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		delete(c.unanswered, resp.ID)
		c.mu.Unlock()
		select {
		case c.freed <- struct{}{}:
		default:
		}
	}
	return c.write(append(b, '\n'))
}

func (c *lineConn) write(b []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, err := c.out.Write(b)
	return err
}

func (c *lineConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closed)
		err = errors.Join(c.in.Close(), c.out.Close())
	})
	return err
}

func (c *lineConn) SessionID() string { return "" }
