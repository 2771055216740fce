package sandbox

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Egress audit bounds. What a session's connections were is never
// dropped: an allowed connection waits until the broker holds its event
// (and is not made if it cannot), and its close and an unreachable one
// wait in a backlog until the broker takes them. Denials are what a
// session can make without bound, so they are shed first: auditDeniedEach
// of an interval are events of their own, the rest are counted, by
// destination, in one denied_summary event per interval.
const (
	auditEvery = time.Second
	// auditDeniedEach is how many denials of an interval are recorded one
	// by one.
	auditDeniedEach = 20
	// auditTop is how many destinations a summary names, the most denied
	// first; auditShedDests bounds those counted apart in an interval
	// (the rest are counted as one).
	auditTop       = 10
	auditShedDests = 1024
	// auditBatch is the most connection events one batch carries: with
	// the interval's denials, its summary and a count of what the log
	// lacks, within the broker's bound (broker.MaxBatchEvents, 256).
	auditBatch = 200
	// auditBacklog bounds the connection events waiting for the broker:
	// past it a new connection is refused, as one the broker cannot take.
	auditBacklog = 2048
	auditCall    = 10 * time.Second
)

// decision is one egress decision, one connection's close, or a summary
// of denials: one network.egress event each. Conn numbers the session's
// connections to the proxy, so a close is matched with its decision.
type decision struct {
	Conn     int64  `json:"conn,omitempty"`
	Host     string `json:"host,omitempty"`
	Port     int    `json:"port,omitempty"`
	Addr     string `json:"addr,omitempty"`
	Decision string `json:"decision"` // allowed, denied, unreachable, closed, denied_summary, unrecorded
	Rule     string `json:"rule,omitempty"`
	Why      string `json:"why,omitempty"`
	BytesOut int64  `json:"bytes_out,omitempty"`
	BytesIn  int64  `json:"bytes_in,omitempty"`
	// Denied and Top are a denied_summary's: the denials of the interval
	// from Since that have no event of their own, and the destinations
	// most denied among them.
	Denied int64       `json:"denied,omitempty"`
	Top    []destCount `json:"top,omitempty"`
	Since  string      `json:"since,omitempty"`
	// Dropped is an unrecorded event's count of decisions the broker
	// did not take.
	Dropped int64  `json:"dropped,omitempty"`
	Time    string `json:"time"`
}

// destCount is how often one destination was denied.
type destCount struct {
	Dest  string `json:"dest"`
	Count int64  `json:"count"`
}

// pending is a connection event waiting for the broker; done, for an
// allowed one, is where its connection waits for the answer.
type pending struct {
	d    decision
	done chan error
}

// auditor records a session's egress decisions in the broker as
// network.egress events on the task of the audit grant, with the bushost
// client and a token the session never sees, in batches (RecordEvents,
// one transaction): at once when a connection waits for its event, else
// once an interval.
type auditor struct {
	bushost, home, token string
	// log is sandbox run's stderr, its lines bounded (lineLimiter): what
	// the broker did not take goes there, connections' past the bound.
	log  io.Writer
	wake chan struct{}
	quit chan struct{}
	done sync.WaitGroup

	mu sync.Mutex
	// sure are the connection events (allowed, unreachable, closed),
	// never dropped.
	sure []pending
	// denied are denials to record one by one, deniedN how many the
	// interval has had; shed counts the interval's others by
	// destination, shedN all of them, since when the first came.
	denied  []decision
	deniedN int
	shed    map[string]int64
	shedN   int64
	since   time.Time
	// unrecorded counts the denials the broker did not take, told in an
	// event of the next batch it does.
	unrecorded int64
	stopped    bool
}

func startAuditor(bushost, brokerSocket, tokenFile string, log io.Writer) *auditor {
	a := &auditor{bushost: bushost, home: filepath.Dir(brokerSocket), token: tokenFile, log: log,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), shed: map[string]int64{}}
	a.done.Add(1)
	go a.run()
	return a
}

// errAuditEnding refuses a connection asked for as the session ends.
var errAuditEnding = errors.New("the session is ending")

// allow records d, a connection about to be made, and returns once the
// broker holds it; an error means it does not, and the connection must
// not be made.
func (a *auditor) allow(ctx context.Context, d decision) error {
	done := make(chan error, 1)
	a.mu.Lock()
	switch {
	case a.stopped:
		a.mu.Unlock()
		return errAuditEnding
	case len(a.sure) >= auditBacklog:
		n := len(a.sure)
		a.mu.Unlock()
		return fmt.Errorf("%d connection events already wait for the broker", n)
	}
	a.sure = append(a.sure, pending{d, done})
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return errAuditEnding
	}
}

// note records d, a close or an unreachable connection, in a coming
// batch; it is never dropped.
func (a *auditor) note(d decision) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sure = append(a.sure, pending{d: d})
}

// deny records a denial: one by one up to auditDeniedEach an interval,
// the rest counted in the interval's summary.
func (a *auditor) deny(d decision) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.deniedN < auditDeniedEach {
		a.deniedN++
		a.denied = append(a.denied, d)
		return
	}
	if a.shedN == 0 {
		a.since = time.Now()
	}
	a.shedN++
	dest := "(before it named a destination)"
	if d.Host != "" {
		dest = target{d.Host, d.Port}.String()
	}
	if _, ok := a.shed[dest]; !ok && len(a.shed) >= auditShedDests {
		dest = "(others)"
	}
	a.shed[dest]++
}

// stop records what waits and returns once it is done; a connection
// asked for from here on is refused.
func (a *auditor) stop() {
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	close(a.quit)
	a.done.Wait()
}

func (a *auditor) run() {
	defer a.done.Done()
	tick := time.NewTicker(auditEvery)
	defer tick.Stop()
	for {
		select {
		case <-a.wake:
			a.flush(false)
		case <-tick.C:
			a.flush(true)
		case <-a.quit:
			// Everything, in as many batches as it takes, while the
			// broker takes them.
			for a.flush(true) {
			}
			a.mu.Lock()
			left := a.sure
			a.sure = nil
			a.mu.Unlock()
			for _, p := range left {
				a.lost(p)
			}
			return
		}
	}
}

// summary takes the interval's shed denials as one event. a.mu is held.
func (a *auditor) summary(now string) *decision {
	if a.shedN == 0 {
		return nil
	}
	top := make([]destCount, 0, len(a.shed))
	for dest, n := range a.shed {
		top = append(top, destCount{dest, n})
	}
	slices.SortFunc(top, func(x, y destCount) int { return cmp.Or(cmp.Compare(y.Count, x.Count), cmp.Compare(x.Dest, y.Dest)) })
	s := &decision{Decision: "denied_summary", Denied: a.shedN, Top: top[:min(len(top), auditTop)], Since: a.since.UTC().Format(time.RFC3339Nano), Time: now,
		Why: fmt.Sprintf("denials over %d a second are counted here, not one by one", auditDeniedEach)}
	a.shedN = 0
	clear(a.shed)
	return s
}

// flush sends one batch: the connection events first, then the denials;
// interval ends one (tick), with its summary. It reports whether the
// broker took a batch that left connection events waiting.
func (a *auditor) flush(tick bool) bool {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	a.mu.Lock()
	n := min(len(a.sure), auditBatch)
	batch := slices.Clone(a.sure[:n])
	a.sure = slices.Clone(a.sure[n:])
	denied := a.denied
	a.denied = nil
	var summary *decision
	if tick {
		summary = a.summary(now)
		a.deniedN = 0
	}
	unrecorded := a.unrecorded
	a.unrecorded = 0
	a.mu.Unlock()

	var events []decision
	for _, p := range batch {
		events = append(events, p.d)
	}
	events = append(events, denied...)
	if summary != nil {
		events = append(events, *summary)
	}
	if unrecorded > 0 {
		events = append(events, decision{Decision: "unrecorded", Dropped: unrecorded, Time: now,
			Why: "the broker did not take an earlier batch: its denials are on sandbox run's stderr"})
	}
	if len(events) == 0 {
		return false
	}
	err := a.record(events)
	// A connection waiting for its event is told whether the broker holds
	// it, and refused if not. Not in the log: a close or an unreachable
	// one waits for the next batch; the denials go to stderr (bounded),
	// and the next batch the broker takes says how many.
	var again []pending
	for _, p := range batch {
		switch {
		case p.done != nil:
			p.done <- err
		case err != nil:
			again = append(again, p)
		}
	}
	if err == nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.sure) > 0
	}
	lost := int64(len(denied))
	for _, d := range denied {
		data, _ := json.Marshal(d)
		fmt.Fprintf(a.log, "sandbox: network.egress unrecorded %s\n", data)
	}
	if summary != nil {
		lost += summary.Denied
		data, _ := json.Marshal(summary)
		fmt.Fprintf(a.log, "sandbox: network.egress unrecorded %s\n", data)
	}
	a.mu.Lock()
	a.sure = append(again, a.sure...)
	a.unrecorded += unrecorded + lost
	a.mu.Unlock()
	return false
}

// lost writes a connection event the broker never took on stderr, past
// any bound: a connection's record is never rate-limited away.
func (a *auditor) lost(p pending) {
	if p.done != nil {
		p.done <- errAuditEnding
		return
	}
	data, _ := json.Marshal(p.d)
	writeAlways(a.log, fmt.Appendf(nil, "sandbox: network.egress unrecorded %s\n", data))
}

// record hands events to the broker in one RecordEvents call.
func (a *auditor) record(events []decision) error {
	var lines bytes.Buffer
	enc := json.NewEncoder(&lines)
	for _, d := range events {
		if err := enc.Encode(d); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), auditCall)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.bushost, "--home", a.home, "--token-file", a.token,
		"event", "record", "--type", "network.egress", "--batch", "-")
	cmd.Stdin = &lines
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	err = fmt.Errorf("record %d events in the broker: %v: %s", len(events), err, bytes.TrimSpace(out))
	fmt.Fprintf(a.log, "sandbox: network.egress: %v\n", err)
	return err
}
