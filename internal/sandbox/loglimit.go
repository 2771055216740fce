package sandbox

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// The egress proxy's lines on sandbox run's stderr (denials without
// --audit-token-file, and denials of a batch the broker refused) are the
// session's to cause: a session opening refused connection after
// connection would otherwise write without bound to wherever that stderr
// goes. egressLogBurst lines pass at once and egressLogRate a second after
// that, the same rate as the broker's bound on network.egress events
// (6000 a minute); the lines over it are counted, and the count is a line
// of its own when lines pass again and when the session ends. A
// connection's lines (allowed, unreachable, closed) are never held back
// (writeAlways): a connection the session made is always on record.
const (
	egressLogBurst = 1000
	egressLogRate  = 100
)

// lineLimiter passes each Write (one line) to w while its bucket holds a
// token.
type lineLimiter struct {
	mu      sync.Mutex
	w       io.Writer
	now     func() time.Time
	tokens  float64
	last    time.Time
	dropped int64
}

func newLineLimiter(w io.Writer) *lineLimiter {
	return &lineLimiter{w: w, now: time.Now, tokens: egressLogBurst, last: time.Now()}
}

func (l *lineLimiter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.now()
	l.tokens = min(egressLogBurst, l.tokens+t.Sub(l.last).Seconds()*egressLogRate)
	l.last = t
	if l.tokens < 1 {
		l.dropped++
		return len(p), nil
	}
	l.tokens--
	l.report()
	return l.w.Write(p)
}

// report writes how many lines were left out since the last line, if any.
// l.mu is held.
func (l *lineLimiter) report() {
	if l.dropped > 0 {
		fmt.Fprintf(l.w, "sandbox: network.egress: %d lines over %d a second were not written\n", l.dropped, egressLogRate)
		l.dropped = 0
	}
}

// close writes the count of lines left out at the end, if any.
func (l *lineLimiter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.report()
}

// writeAlways writes p to w, past w's bound if it is a lineLimiter (after
// its count of lines left out): the lines of connections the session made.
func writeAlways(w io.Writer, p []byte) {
	if l, ok := w.(*lineLimiter); ok {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.report()
		w = l.w
	}
	w.Write(p)
}
