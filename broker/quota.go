package broker

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/limits"
)

// eventQuota bounds what one grant may append through RecordEvent: a token
// bucket per grant for events and one for bytes, each refilled at its rate
// per minute and holding at most one minute's worth, so a grant may burst
// a minute's quota and then goes at the rate. One grant's use never
// touches another's. The buckets are rows of the store (quota_buckets),
// charged in the write transaction of the events they pay for: under the
// write lock, so that every host sharing the store charges the same
// bucket, and rolled back with a refused write.
type eventQuota struct {
	kind                string // the buckets' kind in quota_buckets
	perMin, bytesPerMin float64
	// flags name the bushostd flags that set the rates, for the refusal.
	rateFlag, bytesFlag string
	now                 func() time.Time
}

// bucket is what is left of a grant's minute, as of at. Refills follow
// the clock of the host that charges: a host whose clock is behind
// refills nothing until it passes at, so skew delays refills, never adds.
type bucket struct {
	events, bytes float64
	at            time.Time
}

func newEventQuota(perMin int, bytesPerMin int64) *eventQuota {
	return &eventQuota{kind: "event", perMin: positiveOr(perMin, limits.DefaultEventRate), bytesPerMin: positiveOr(bytesPerMin, limits.DefaultEventBytesRate),
		rateFlag: "--event-rate", bytesFlag: "--event-bytes-rate", now: time.Now}
}

// newEgressQuota is network.egress's own bound (Options.EgressRate).
func newEgressQuota(perMin int, bytesPerMin int64) *eventQuota {
	return &eventQuota{kind: "egress", perMin: positiveOr(perMin, limits.DefaultEgressRate), bytesPerMin: positiveOr(bytesPerMin, limits.DefaultEgressBytesRate),
		rateFlag: "--egress-event-rate", bytesFlag: "--egress-event-bytes-rate", now: time.Now}
}

// positiveOr is rate v, or d where v is not positive.
func positiveOr[T int | int64](v, d T) float64 {
	if v <= 0 {
		v = d
	}
	return float64(v)
}

// charge takes n events of size bytes in all from grant's bucket in w,
// all or nothing, or refuses them with ResourceExhausted and the time
// after which they would pass.
func (q *eventQuota) charge(ctx context.Context, w *writeTx, grant string, n, size int) error {
	if n == 0 {
		return nil
	}
	now := q.now()
	b, ok, err := w.bucket(ctx, grant, q.kind)
	if err != nil {
		return fmt.Errorf("read quota of grant %s: %w", grant, err)
	}
	if !ok {
		b = bucket{events: q.perMin, bytes: q.bytesPerMin, at: now}
	}
	if err := q.spend(&b, now, grant, n, size); err != nil {
		return err
	}
	if err := w.setBucket(ctx, grant, q.kind, b); err != nil {
		return fmt.Errorf("charge quota of grant %s: %w", grant, err)
	}
	return nil
}

// spend refills b up to now and takes n events of size bytes from it, or
// refuses them leaving b as it was.
func (q *eventQuota) spend(b *bucket, now time.Time, grant string, n, size int) error {
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

// bucket reads grant's bucket of kind.
func (q *queries) bucket(ctx context.Context, grant, kind string) (bucket, bool, error) {
	var b bucket
	var at int64
	ok, err := found(q.db.QueryRowContext(ctx, `SELECT events, bytes, at FROM quota_buckets WHERE grant_id = $1 AND kind = $2`, grant, kind).Scan(&b.events, &b.bytes, &at))
	b.at = time.Unix(0, at)
	return b, ok, err
}

// setBucket writes grant's bucket of kind.
func (q *queries) setBucket(ctx context.Context, grant, kind string, b bucket) error {
	return q.exec(ctx, `INSERT INTO quota_buckets (grant_id, kind, events, bytes, at) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (grant_id, kind) DO UPDATE SET events = excluded.events, bytes = excluded.bytes, at = excluded.at`,
		grant, kind, b.events, b.bytes, b.at.UnixNano())
}

// minutes is m minutes, rounded up to a whole millisecond and at least one.
func minutes(m float64) time.Duration {
	d := time.Duration(math.Ceil(m * float64(time.Minute) / float64(time.Millisecond)))
	return max(d, 1) * time.Millisecond
}
