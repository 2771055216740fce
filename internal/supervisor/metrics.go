package supervisor

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/bushost/bushost/internal/metrics"
)

// The supervisor's metrics are read from its state at each scrape (one
// lock, like GET /status), so nothing on the loop's path counts twice.

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
	counter := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v bool, labels ...string) {
		f := 0.0
		if v {
			f = 1
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, f, labels...)
	}
	s.mu.Lock()
	for _, svc := range s.services {
		name := svc.cfg.Name
		counter(descRestarts, svc.restarts, name)
		counter(descExits, svc.exitsZero, name, "zero")
		counter(descExits, svc.exitsNonZero, name, "nonzero")
		for _, st := range serviceStates {
			gauge(descState, svc.state == st, name, st)
		}
		gauge(descHealthy, svc.state == StateRunning && !svc.healthySince.IsZero(), name)
		counter(descReverts, svc.reverted, name, "reverted")
		counter(descReverts, svc.revertsFailed, name, "failed")
	}
	gauge(descHalted, s.halted)
	counter(descHalts, s.halts)
	counter(descRecoveries, s.recoveries)
	ch <- prometheus.MustNewConstMetric(descFailedReverts, prometheus.GaugeValue, float64(s.failedReverts))
	s.mu.Unlock()
	sent, failed, dropped, queued := s.notify.counts()
	counter(descNotifications, sent, "sent")
	counter(descNotifications, failed, "failed")
	counter(descNotifications, dropped, "dropped")
	ch <- prometheus.MustNewConstMetric(descNotifyQueue, prometheus.GaugeValue, float64(queued))
}
