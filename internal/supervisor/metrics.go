package supervisor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bushost/bushost/internal/metrics"
)

// The supervisor's metrics are read from its state at each scrape (one
// lock, like GET /status, and like it not waited for while the loop runs
// git), so nothing on the loop's path counts twice.

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, "supervisor", name), help, labels, nil)
}

var (
	descRestarts = desc("service_restarts_total",
		"Restarts of a service (after an exit, an edit or a revert).", "service")
	descExits = desc("service_exits_total",
		"Exits of a service that the supervisor did not ask for, by whether the exit status was zero.", "service", "status")
	descState = desc("service_state",
		"1 for the state the service is in (running, backoff, stopping, stopped, bricked), 0 for the others.", "service", "state")
	descHealthy = desc("service_healthy",
		"1 while the service runs and passes its health check (as /healthz counts it), else 0.", "service")
	descReverts = desc("reverts_total",
		"Reverts to the good commit, by the service whose crash loop caused them and result (reverted or failed).", "service", "result")
	descHalted = desc("halted",
		"1 while automatic recovery is halted (max_failed_reverts reached, or nothing good to revert to).")
	descHalts = desc("halts_total",
		"Times automatic recovery halted.")
	descRecoveries = desc("recoveries_total",
		"Times a commit became good after a revert or a halt.")
	descFailedReverts = desc("consecutive_failed_reverts",
		"Reverts in a row that have not brought health back (halts at max_failed_reverts).")
	descNotifications = desc("notifications_total",
		"Webhook notifications (notify_url), by result: sent, failed (gave up after the retries) or dropped (queue full, the oldest goes).", "result")
	descNotifyQueue = desc("notification_queue_length",
		"Notifications waiting to be sent.")
)

var serviceStates = []string{StateRunning, StateBackoff, StateStopping, StateStopped, StateBricked}

// collector exposes a Supervisor's state as Prometheus metrics.
type collector struct{ s *Supervisor }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRestarts, descExits, descState, descHealthy, descReverts,
		descHalted, descHalts, descRecoveries, descFailedReverts, descNotifications, descNotifyQueue} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	for _, m := range s.stateMetrics() {
		ch <- m
	}
	sent, failed, dropped, queued := s.notify.counts()
	ch <- counterOf(descNotifications, sent, "sent")
	ch <- counterOf(descNotifications, failed, "failed")
	ch <- counterOf(descNotifications, dropped, "dropped")
	ch <- prometheus.MustNewConstMetric(descNotifyQueue, prometheus.GaugeValue, float64(queued))
}

// stateMetrics reads the metrics of the supervisor's state. While the loop
// runs git (see Status) it does not wait: it gives those of the last read
// that found the loop free, so scrapes held on health_addr's connections
// cannot fill them.
func (s *Supervisor) stateMetrics() []prometheus.Metric {
	if !s.mu.TryLock() {
		if last := s.metrics.Load(); last != nil {
			return *last
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	var ms []prometheus.Metric
	for _, svc := range s.services {
		name := svc.cfg.Name
		ms = append(ms, counterOf(descRestarts, svc.restarts, name),
			counterOf(descExits, svc.exitsZero, name, "zero"),
			counterOf(descExits, svc.exitsNonZero, name, "nonzero"))
		for _, st := range serviceStates {
			ms = append(ms, gaugeOf(descState, svc.state == st, name, st))
		}
		ms = append(ms, gaugeOf(descHealthy, svc.state == StateRunning && !svc.healthySince.IsZero(), name),
			counterOf(descReverts, svc.reverted, name, "reverted"),
			counterOf(descReverts, svc.revertsFailed, name, "failed"))
	}
	ms = append(ms, gaugeOf(descHalted, s.halted), counterOf(descHalts, s.halts), counterOf(descRecoveries, s.recoveries),
		prometheus.MustNewConstMetric(descFailedReverts, prometheus.GaugeValue, float64(s.failedReverts)))
	s.metrics.Store(&ms)
	return ms
}

func counterOf(d *prometheus.Desc, v int, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func gaugeOf(d *prometheus.Desc, v bool, labels ...string) prometheus.Metric {
	f := 0.0
	if v {
		f = 1
	}
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, f, labels...)
}
