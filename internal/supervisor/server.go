package supervisor

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Status is what GET /status returns.
type Status struct {
	// State is "ok" (every service up, every edit recorded), "degraded"
	// or "halted".
	State         string          `json:"state"`
	HaltReason    string          `json:"halt_reason,omitempty"`
	GitDir        string          `json:"git_dir"`
	Head          string          `json:"head"`
	Good          string          `json:"good"`
	FailedReverts int             `json:"failed_reverts"`
	Services      []ServiceStatus `json:"services"`
	Reverts       []RevertRecord  `json:"reverts"`
	LastError     string          `json:"last_error,omitempty"`
	// Unrecorded is why the agent's latest edits are not committed yet
	// (they are retried); the state is "degraded" while it is set.
	Unrecorded string `json:"unrecorded,omitempty"`
	// AwaitingAck is a first commit that adopted files without history:
	// no commit becomes good until `supervisor ack`.
	AwaitingAck string `json:"awaiting_ack,omitempty"`
	// servicesUp: every service runs and passes its check, and recovery
	// is not halted (what /healthz answers 200 for).
	servicesUp bool
}

// ServiceStatus is one service in Status.
type ServiceStatus struct {
	Name        string       `json:"name"`
	State       string       `json:"state"`
	PID         int          `json:"pid,omitempty"`
	Revertable  bool         `json:"revertable"`
	Healthy     bool         `json:"healthy"`
	HealthError string       `json:"health_error,omitempty"`
	Restarts    int          `json:"restarts"`
	StartedAt   time.Time    `json:"started_at"`
	RecentExits []ExitRecord `json:"recent_exits"`
}

// Status returns a snapshot of the supervisor's state. While the loop is
// busy (a git command, which the agent can make last up to gitTimeout) it
// does not wait: it gives the state as of the loop's last free moment (at
// most a tick before the command began), so a health check is answered
// within its timeout whatever the agent put in the trees.
func (s *Supervisor) Status() Status {
	if !s.mu.TryLock() {
		if st := s.status.Load(); st != nil {
			return *st
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	return s.snapshot()
}

// snapshot reads the state (s.mu held) and keeps it for Status.
func (s *Supervisor) snapshot() Status {
	st := Status{
		GitDir: s.cfg.GitDir, Head: s.head, Good: s.good, FailedReverts: s.failedReverts,
		HaltReason: s.haltReason, LastError: s.lastErr, Unrecorded: s.unrecorded, AwaitingAck: s.awaitingAck,
		Reverts:  append([]RevertRecord{}, s.reverts...),
		Services: []ServiceStatus{},
	}
	up := true
	for _, svc := range s.services {
		healthy := svc.state == StateRunning && !svc.healthySince.IsZero()
		up = up && healthy
		st.Services = append(st.Services, ServiceStatus{
			Name: svc.cfg.Name, State: svc.state, PID: svc.pid,
			Revertable: svc.cfg.IsRevertable(), Healthy: healthy, HealthError: svc.healthErr,
			Restarts: svc.restarts, StartedAt: svc.startedAt,
			RecentExits: append([]ExitRecord{}, svc.exits...),
		})
	}
	st.servicesUp = up && !s.halted
	switch {
	case s.halted:
		st.State = "halted"
	case up && s.unrecorded == "":
		st.State = "ok"
	default:
		st.State = "degraded"
	}
	s.status.Store(&st)
	return st
}

// Handler serves GET /healthz (200 when every service runs and passes its
// check, 503 otherwise, in particular when one is bricked or recovery is
// halted), GET /status (JSON) and GET /metrics (Prometheus).
func (s *Supervisor) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		st := s.Status()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		// The services' health: an edit waiting to be recorded shows on
		// /status, and does not make the container unhealthy.
		if st.servicesUp {
			fmt.Fprintln(w, "ok")
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, st.State)
		if st.HaltReason != "" {
			fmt.Fprintf(w, "recovery halted: %s\n", st.HaltReason)
		}
		for _, svc := range st.Services {
			if !svc.Healthy {
				fmt.Fprintf(w, "%s: %s %s\n", svc.Name, svc.State, svc.HealthError)
			}
		}
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(s.Status())
	})
	return mux
}
