package broker

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
)

// Defaults of the per-grant quotas on RecordEvent.
const (
	DefaultEventRate      = 600     // events per minute
	DefaultEventBytesRate = 1 << 20 // bytes (type and data) per minute
	// network.egress has a bound of its own (Options.EgressRate): one
	// event per connection decision and one per close, so a session
	// making a few connections a second needs more than a grant's notes.
	DefaultEgressRate      = 6000    // events per minute
	DefaultEgressBytesRate = 4 << 20 // bytes per minute
)

// eventQuota bounds what one grant may append through RecordEvent: a token
// bucket per grant for events and one for bytes, each refilled at its rate
// per minute and holding at most one minute's worth, so a grant may burst
// a minute's quota and then goes at the rate. One grant's use never
// touches another's. It is kept in memory: a restart forgets it, which
// costs at most one more minute's quota.
type eventQuota struct {
	perMin, bytesPerMin float64
	// flags name the bushostd flags that set the rates, for the refusal.
	rateFlag, bytesFlag string
	now                 func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	events, bytes float64
	at            time.Time
}

// maxIdleBuckets is how many buckets are kept before full ones (grants idle
// for a minute or more) are dropped.
const maxIdleBuckets = 4096

func newEventQuota(perMin int, bytesPerMin int64) *eventQuota {
	if perMin <= 0 {
		perMin = DefaultEventRate
	}
	if bytesPerMin <= 0 {
		bytesPerMin = DefaultEventBytesRate
	}
	return &eventQuota{perMin: float64(perMin), bytesPerMin: float64(bytesPerMin),
		rateFlag: "--event-rate", bytesFlag: "--event-bytes-rate", now: time.Now, buckets: map[string]*bucket{}}
}

// newEgressQuota is network.egress's own bound (Options.EgressRate).
func newEgressQuota(perMin int, bytesPerMin int64) *eventQuota {
	if perMin <= 0 {
		perMin = DefaultEgressRate
	}
	if bytesPerMin <= 0 {
		bytesPerMin = DefaultEgressBytesRate
	}
	q := newEventQuota(perMin, bytesPerMin)
	q.rateFlag, q.bytesFlag = "--egress-event-rate", "--egress-event-bytes-rate"
	return q
}

// take charges one event of size bytes to grant, or refuses it with
// ResourceExhausted and the time after which it would pass.
func (q *eventQuota) take(grant string, size int) error {
	return q.takeN(grant, 1, size)
}

// takeN charges n events of size bytes in all to grant, all or nothing.
func (q *eventQuota) takeN(grant string, n, size int) error {
	if n == 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	b, ok := q.buckets[grant]
	if !ok {
		if len(q.buckets) >= maxIdleBuckets {
			q.prune(now)
		}
		b = &bucket{events: q.perMin, bytes: q.bytesPerMin, at: now}
		q.buckets[grant] = b
	}
	if dt := now.Sub(b.at).Minutes(); dt > 0 {
		b.events = math.Min(q.perMin, b.events+dt*q.perMin)
		b.bytes = math.Min(q.bytesPerMin, b.bytes+dt*q.bytesPerMin)
		b.at = now
	}
	k, nb := float64(n), float64(size)
	what := "this event is"
	if n > 1 {
		what = fmt.Sprintf("these %d events are", n)
	}
	if b.events < k {
		if k > q.perMin {
			return errdefs.ResourceExhausted(errdefs.EventRateExceeded,
				"grant %s is over its event quota of %d events per minute (bushostd %s): a batch of %d never fits; send smaller batches", grant, int64(q.perMin), q.rateFlag, n).
				With("limit", int64(q.perMin)).With("grant", grant)
		}
		wait := minutes((k - b.events) / q.perMin)
		return errdefs.ResourceExhausted(errdefs.EventRateExceeded,
			"grant %s is over its event quota of %d events per minute (bushostd %s); retry in %s", grant, int64(q.perMin), q.rateFlag, wait).
			With("limit", int64(q.perMin)).With("grant", grant).Retry(wait)
	}
	if b.bytes < nb {
		e := errdefs.ResourceExhausted(errdefs.EventBytesRate,
			"grant %s is over its event quota of %d bytes per minute (bushostd %s): %s %d bytes", grant, int64(q.bytesPerMin), q.bytesFlag, what, size).
			With("limit", int64(q.bytesPerMin)).With("size", size).With("grant", grant)
		if nb <= q.bytesPerMin {
			e.Retry(minutes((nb - b.bytes) / q.bytesPerMin))
		}
		return e
	}
	b.events -= k
	b.bytes -= nb
	return nil
}

// refund gives back what takeN charged, when the batch it charged is
// refused by another bound before anything was written.
func (q *eventQuota) refund(grant string, n, size int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if b, ok := q.buckets[grant]; ok {
		b.events = math.Min(q.perMin, b.events+float64(n))
		b.bytes = math.Min(q.bytesPerMin, b.bytes+float64(size))
	}
}

// prune drops the buckets that have refilled: their grants start afresh.
func (q *eventQuota) prune(now time.Time) {
	for id, b := range q.buckets {
		if now.Sub(b.at) >= time.Minute {
			delete(q.buckets, id)
		}
	}
}

// minutes is m minutes, rounded up to a whole millisecond and at least one.
func minutes(m float64) time.Duration {
	d := time.Duration(math.Ceil(m * float64(time.Minute) / float64(time.Millisecond)))
	return max(d, 1) * time.Millisecond
}
