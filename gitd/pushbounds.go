package gitd

import (
	"context"
	"time"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/size"
)

// bound applies o.PushTimeout and o.MinPushRate to the push rr reads: the returned context ends at the push's deadline, and a watcher
// cuts the push when, once PushRateGrace old, it has averaged fewer than
// MinPushRate bytes a second. A cut ends rr's wait at once, so the push
// fails and its quarantine is removed like any refused push's; the error
// names the limit. Sending one byte now and then does not reset either
// bound, unlike the idle timer.
func (rr *recvReader) bound(ctx context.Context, o limits.Limits) (context.Context, context.CancelFunc) {
	start := time.Now()
	cut := make(chan struct{})
	rr.cut = cut
	var cancel context.CancelFunc = func() {}
	if o.PushTimeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, o.PushTimeout)
	}
	rr.tooLong = func() error {
		if ctx.Err() != context.DeadlineExceeded {
			return nil
		}
		return errdefs.ResourceExhausted(errdefs.PushTooLong, "the push took longer than %s (--push-timeout); push cut, nothing kept", o.PushTimeout).
			With("limit", o.PushTimeout)
	}
	stop := make(chan struct{})
	go func() {
		var tick <-chan time.Time
		if o.MinPushRate > 0 {
			t := time.NewTicker(min(time.Second, max(o.PushRateGrace/4, 10*time.Millisecond)))
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				if err := rr.tooLong(); err != nil {
					rr.cutErr = err
					close(cut)
				}
				return
			case now := <-tick:
				age := now.Sub(start)
				// The rate bounds the upload only: once the bundle is in,
				// checking it is the daemon's time, not the client's.
				if age < o.PushRateGrace || rr.ended.Load() {
					continue
				}
				got := rr.got.Load()
				if float64(got) < float64(o.MinPushRate)*age.Seconds() {
					rate := int64(float64(got) / age.Seconds())
					rr.cutErr = errdefs.ResourceExhausted(errdefs.PushTooSlow, "the push sent %d bytes in %s (%s/s), under --min-push-rate %s/s; push cut, nothing kept",
						got, age.Round(time.Millisecond), size.Format(rate), size.Format(o.MinPushRate)).
						With("limit", o.MinPushRate).With("rate", rate)
					close(cut)
					return
				}
			}
		}
	}()
	return ctx, func() { close(stop); cancel() }
}

// why prefers the cut's error to what the push failed with because of it.
func (r *recvReader) why(err error) error {
	select {
	case <-r.cut:
		return r.cutErr
	default:
	}
	if r.tooLong != nil {
		if e := r.tooLong(); e != nil {
			return e
		}
	}
	return err
}
