package broker

import (
	"math"
	"sync"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
)

// Defaults of the per-grant quotas on RecordEvent.
const (
	DefaultEventRate      = 600     // events per minute
	DefaultEventBytesRate = 1 << 20 // bytes (type and data) per minute
)

// eventQuota bounds what one grant may append through RecordEvent: a token
// bucket per grant for events and one for bytes, each refilled at its rate
// per minute and holding at most one minute's worth, so a grant may burst
// a minute's quota and then goes at the rate. One grant's use never
// touches another's. It is kept in memory: a restart forgets it, which
// costs at most one more minute's quota.
type eventQuota struct {
	perMin, bytesPerMin float64
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
	return &eventQuota{perMin: float64(perMin), bytesPerMin: float64(bytesPerMin), now: time.Now, buckets: map[string]*bucket{}}
}

// take charges one event of size bytes to grant, or refuses it with
// ResourceExhausted and the time after which it would pass.
func (q *eventQuota) take(grant string, size int) error {
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
	n := float64(size)
	if b.events < 1 {
		wait := minutes((1 - b.events) / q.perMin)
		return errdefs.ResourceExhausted(errdefs.EventRateExceeded,
			"grant %s is over its event quota of %d events per minute (bushostd --event-rate); retry in %s", grant, int64(q.perMin), wait).
			With("limit", int64(q.perMin)).With("grant", grant).Retry(wait)
	}
	if b.bytes < n {
		e := errdefs.ResourceExhausted(errdefs.EventBytesRate,
			"grant %s is over its event quota of %d bytes per minute (bushostd --event-bytes-rate): this event is %d bytes", grant, int64(q.bytesPerMin), size).
			With("limit", int64(q.bytesPerMin)).With("size", size).With("grant", grant)
		if n <= q.bytesPerMin {
			e.Retry(minutes((n - b.bytes) / q.bytesPerMin))
		}
		return e
	}
	b.events--
	b.bytes -= n
	return nil
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
