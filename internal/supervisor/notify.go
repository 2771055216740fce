package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/bushost/bushost/internal/version"
)

// Events sent to notify_url.
const (
	EventRevert       = "revert"        // a crash loop was reverted to the good commit
	EventRevertFailed = "revert_failed" // a revert was tried and failed; it is retried
	EventHalt         = "halt"          // automatic recovery halted
	EventRecovery     = "recovery"      // a commit became good after a revert or a halt
	// EventCommitBlocked: the watched trees cannot be recorded (a
	// directory too deep or unreadable); commits are retried.
	EventCommitBlocked = "commit_blocked"
	// EventHistoryMissing: the workspace held files and git_dir no
	// history; no commit becomes good until `supervisor ack`.
	EventHistoryMissing = "history_missing"
)

// Notification is the JSON body POSTed to notify_url for each event.
type Notification struct {
	Event string    `json:"event"`
	At    time.Time `json:"at"`
	// Seq numbers this run's notifications from 1: a receiver that sees a
	// retry it already took can tell.
	Seq       uint64 `json:"seq"`
	Workspace string `json:"workspace"`
	// Service is the service whose crash loop led to the event (for a
	// recovery, to the revert or halt it ends).
	Service string `json:"service"`
	Reason  string `json:"reason,omitempty"`
	// Head and Good are HEAD and the good commit after the event.
	Head string `json:"head"`
	Good string `json:"good"`
	// From is the commit reverted away from, To the good commit reverted
	// to, Commit the revert commit (revert, revert_failed) or the commit
	// that became good (recovery).
	From   string `json:"from,omitempty"`
	To     string `json:"to,omitempty"`
	Commit string `json:"commit,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Delivery defaults: a bounded queue, a few tries with a doubling delay,
// each try bounded.
const (
	notifyQueueLen   = 64
	notifyAttempts   = 5
	notifyBackoff    = time.Second
	notifyMaxBackoff = 30 * time.Second
	notifyTimeout    = 10 * time.Second
)

// notifier POSTs notifications to one URL from a goroutine of its own.
// send never blocks the supervisor: it takes a lock only to append to the
// queue, and when the queue is full the oldest notification is dropped
// (and counted, and logged) to make room.
type notifier struct {
	url       string
	userAgent string
	log       *slog.Logger
	// client bounds each try; attempts, backoff and maxBackoff shape the
	// retries (tests shorten them).
	client     *http.Client
	attempts   int
	backoff    time.Duration
	maxBackoff time.Duration
	queueLen   int

	wake chan struct{}
	mu   sync.Mutex
	// queue is what waits to be sent; the worker takes from its front.
	queue                 []Notification
	seq                   uint64
	sent, failed, dropped int
}

func newNotifier(url string, log *slog.Logger) *notifier {
	return &notifier{
		url: url, log: log, userAgent: "bushost-supervisor/" + version.Read().Module,
		client:   &http.Client{Timeout: notifyTimeout},
		attempts: notifyAttempts, backoff: notifyBackoff, maxBackoff: notifyMaxBackoff,
		queueLen: notifyQueueLen,
		wake:     make(chan struct{}, 1),
	}
}

// send queues n; a nil notifier (no notify_url) drops it.
func (q *notifier) send(n Notification) {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.seq++
	n.Seq = q.seq
	if n.At.IsZero() {
		n.At = time.Now()
	}
	var lost *Notification
	if len(q.queue) >= q.queueLen {
		oldest := q.queue[0]
		lost = &oldest
		q.queue = q.queue[1:]
		q.dropped++
	}
	q.queue = append(q.queue, n)
	dropped := q.dropped
	q.mu.Unlock()
	if lost != nil {
		q.log.Warn("notification queue full: dropped the oldest", "event", lost.Event, "seq", lost.Seq, "dropped_total", dropped)
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// counts returns what the metrics show.
func (q *notifier) counts() (sent, failed, dropped, queued int) {
	if q == nil {
		return 0, 0, 0, 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.sent, q.failed, q.dropped, len(q.queue)
}

// run delivers the queue in order until ctx ends; what is still queued
// then is logged as not sent.
func (q *notifier) run(ctx context.Context) {
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.mu.Unlock()
			select {
			case <-q.wake:
				continue
			case <-ctx.Done():
				return
			}
		}
		n := q.queue[0]
		q.queue = q.queue[1:]
		q.mu.Unlock()
		ok := q.deliver(ctx, n)
		q.mu.Lock()
		if ok {
			q.sent++
		} else {
			q.failed++
		}
		left := len(q.queue)
		q.mu.Unlock()
		if ctx.Err() != nil {
			if left > 0 {
				q.log.Warn("supervisor stopping: notifications not sent", "count", left)
			}
			return
		}
	}
}

// deliver POSTs n, retrying with a doubling delay; it reports whether the
// receiver took it (a 2xx answer).
func (q *notifier) deliver(ctx context.Context, n Notification) bool {
	body, err := json.Marshal(n)
	if err != nil {
		q.log.Error("notification not encodable", "event", n.Event, "err", err)
		return false
	}
	delay := q.backoff
	for attempt := 1; ; attempt++ {
		err := q.post(ctx, body)
		if err == nil {
			q.log.Info("notification sent", "event", n.Event, "seq", n.Seq, "service", n.Service, "attempt", attempt)
			return true
		}
		if attempt >= q.attempts || ctx.Err() != nil {
			q.log.Error("notification not sent: giving up", "event", n.Event, "seq", n.Seq, "service", n.Service, "attempts", attempt, "err", err)
			return false
		}
		q.log.Warn("notification failed; retrying", "event", n.Event, "seq", n.Seq, "attempt", attempt, "retry_in", delay, "err", err)
		select {
		case <-time.After(delay):
		case <-ctx.Done():
		}
		delay = min(2*delay, q.maxBackoff)
	}
}

func (q *notifier) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", q.userAgent)
	resp, err := q.client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", q.url, resp.Status)
	}
	return nil
}
