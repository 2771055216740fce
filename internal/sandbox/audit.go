package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Egress audit bounds: a batch is flushed every auditEvery or at
// auditBatch decisions, whichever comes first; at most auditQueue wait,
// and what a session sends beyond that is counted in a "dropped" event of
// the next batch rather than slowing its connections. A batch is within
// the broker's (broker.MaxBatchEvents, 256).
const (
	auditEvery = time.Second
	auditBatch = 64
	auditQueue = 1024
	auditCall  = 10 * time.Second
)

// decision is one egress decision, or one connection's close: one
// network.egress event each. Conn numbers the session's connections to
// the proxy, so a close is matched with its decision.
type decision struct {
	Conn     int64  `json:"conn,omitempty"`
	Host     string `json:"host,omitempty"`
	Port     int    `json:"port,omitempty"`
	Addr     string `json:"addr,omitempty"`
	Decision string `json:"decision"` // allowed, denied, unreachable, closed, dropped, unrecorded
	Rule     string `json:"rule,omitempty"`
	Why      string `json:"why,omitempty"`
	BytesOut int64  `json:"bytes_out,omitempty"`
	BytesIn  int64  `json:"bytes_in,omitempty"`
	Dropped  int64  `json:"dropped,omitempty"`
	Time     string `json:"time"`
}

// auditor records a session's egress decisions in the broker as
// network.egress events on the task of the audit grant, with the bushost
// client and a token the session never sees: one event per decision and
// per close, written in batches (RecordEvents, one transaction), so a
// chatty session costs the log one append a second.
type auditor struct {
	bushost, home, token string
	log                  io.Writer
	queue                chan decision
	dropped              atomic.Int64
	// unrecorded counts the decisions of batches the broker did not take
	// (run's goroutine only), told in an event of the next batch it does.
	unrecorded int64
	done       sync.WaitGroup
}

func startAuditor(bushost, brokerSocket, tokenFile string, log io.Writer) *auditor {
	a := &auditor{bushost: bushost, home: filepath.Dir(brokerSocket), token: tokenFile, log: log,
		queue: make(chan decision, auditQueue)}
	a.done.Add(1)
	go a.run()
	return a
}

func (a *auditor) add(d decision) {
	select {
	case a.queue <- d:
	default:
		a.dropped.Add(1)
	}
}

// stop flushes what is queued and waits for it.
func (a *auditor) stop() {
	close(a.queue)
	a.done.Wait()
}

func (a *auditor) run() {
	defer a.done.Done()
	tick := time.NewTicker(auditEvery)
	defer tick.Stop()
	var batch []decision
	for {
		select {
		case d, ok := <-a.queue:
			if !ok {
				a.flush(batch)
				if a.unrecorded > 0 {
					// The last batch was refused whole (a batch past
					// the bound never fits): say so in one event.
					a.flush(nil)
				}
				return
			}
			if batch = append(batch, d); len(batch) >= auditBatch {
				a.flush(batch)
				batch = nil
			}
		case <-tick.C:
			a.flush(batch)
			batch = nil
		}
	}
}

func (a *auditor) flush(batch []decision) {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	dropped, unrecorded := a.dropped.Swap(0), a.unrecorded
	a.unrecorded = 0
	events := slices.Clip(batch)
	if dropped > 0 {
		events = append(events, decision{Decision: "dropped", Dropped: dropped, Time: now,
			Why: fmt.Sprintf("more than %d decisions waited for the broker", auditQueue)})
	}
	if unrecorded > 0 {
		events = append(events, decision{Decision: "unrecorded", Dropped: unrecorded, Time: now,
			Why: "the broker did not take an earlier batch: its decisions are on sandbox run's stderr"})
	}
	if len(events) == 0 {
		return
	}
	var lines bytes.Buffer
	enc := json.NewEncoder(&lines)
	for _, d := range events {
		if err := enc.Encode(d); err != nil {
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), auditCall)
	defer cancel()
	cmd := exec.CommandContext(ctx, a.bushost, "--home", a.home, "--token-file", a.token,
		"event", "record", "--type", "network.egress", "--batch", "-")
	cmd.Stdin = &lines
	if out, err := cmd.CombinedOutput(); err != nil {
		// Not in the log, then, but not lost: each goes to stderr, and
		// the next batch the broker takes says how many did.
		a.dropped.Add(dropped)
		a.unrecorded = unrecorded + int64(len(batch))
		fmt.Fprintf(a.log, "sandbox: network.egress: record %d events in the broker: %v: %s", len(events), err, out)
		for _, d := range batch {
			data, _ := json.Marshal(d)
			fmt.Fprintf(a.log, "sandbox: network.egress unrecorded %s\n", data)
		}
	}
}
