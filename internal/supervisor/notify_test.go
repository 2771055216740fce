package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// receiver is a loopback webhook that records what it took; it answers
// 500 to the first fail requests.
type receiver struct {
	srv  *httptest.Server
	mu   sync.Mutex
	fail int
	hits int
	got  []Notification
}

func newReceiver(t *testing.T, fail int) *receiver {
	t.Helper()
	r := &receiver{fail: fail}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.hits++
		if req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s with Content-Type %q", req.Method, req.Header.Get("Content-Type"))
		}
		if r.hits <= r.fail {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		var n Notification
		if err := json.Unmarshal(body, &n); err != nil {
			t.Errorf("body %q: %v", body, err)
		}
		r.got = append(r.got, n)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) events() []Notification {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Notification(nil), r.got...)
}

func (r *receiver) find(event string) (Notification, bool) {
	for _, n := range r.events() {
		if n.Event == event {
			return n, true
		}
	}
	return Notification{}, false
}

// fastRetries makes the notifier retry at once, so a test waits for
// conditions, not for backoffs.
func fastRetries(s *Supervisor) {
	s.notify.backoff, s.notify.maxBackoff = 10*time.Millisecond, 20*time.Millisecond
}

// A crash-looping edit is reverted: the webhook gets the revert with its
// commits (although it fails the first two tries), then the recovery once
// the reverted tree is good; /metrics counts the revert; the log says it
// all, as JSON throughout.
func TestSupervisorNotifiesAndCountsRevert(t *testing.T) {
	rcv := newReceiver(t, 2)
	r := startSupervisorWith(t, fmt.Sprintf("notify_url = %q\n", rcv.srv.URL+"/hook")+fmt.Sprintf(webService, "/nonexistent"),
		Options{LogFormat: "json"}, fastRetries)
	waitFor(t, "first good commit", 5*time.Second, func() bool {
		st := r.s.Status()
		return st.Good != "" && st.Good == st.Head
	})
	good := r.s.Status().Good
	writeFile(t, filepath.Join(r.ws, "src", "web", "serve.sh"), "#!/bin/bash\necho broken\nexit 1\n")
	var rev Notification
	waitFor(t, "revert notification", 10*time.Second, func() bool {
		var ok bool
		rev, ok = rcv.find(EventRevert)
		return ok
	})
	st := r.s.Status()
	if len(st.Reverts) != 1 {
		t.Fatalf("reverts %+v", st.Reverts)
	}
	rec := st.Reverts[0]
	if rev.Service != "web" || rev.To != good || rev.From != rec.From || rev.Commit != rec.Commit || rev.Commit == "" ||
		rev.From == good || rev.Workspace != r.ws || rev.Reason == "" || rev.Seq != 1 {
		t.Errorf("revert notification %+v, revert record %+v, good %s", rev, rec, good)
	}
	var recov Notification
	waitFor(t, "recovery notification", 10*time.Second, func() bool {
		var ok bool
		recov, ok = rcv.find(EventRecovery)
		return ok
	})
	if recov.Service != "web" || recov.Commit != rec.Commit || recov.Good != rec.Commit || recov.Seq != 2 {
		t.Errorf("recovery notification %+v, revert commit %s", recov, rec.Commit)
	}
	if n := len(rcv.events()); n != 2 {
		t.Errorf("%d notifications, want the revert and the recovery: %+v", n, rcv.events())
	}

	body := r.get(t, "/metrics")
	for _, want := range []string{
		`bushost_supervisor_reverts_total{result="reverted",service="web"} 1`,
		`bushost_supervisor_reverts_total{result="failed",service="web"} 0`,
		`bushost_supervisor_recoveries_total 1`,
		`bushost_supervisor_halted 0`,
		`bushost_supervisor_service_state{service="web",state="running"} 1`,
		`bushost_supervisor_service_state{service="web",state="bricked"} 0`,
		`bushost_supervisor_service_healthy{service="web"} 1`,
		`bushost_supervisor_service_exits_total{service="web",status="nonzero"} 3`,
		`bushost_supervisor_notifications_total{result="sent"} 2`,
		`bushost_supervisor_notifications_total{result="dropped"} 0`,
		`bushost_build_info{`,
		`go_goroutines `,
		`process_start_time_seconds `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !strings.Contains(body, `bushost_supervisor_service_restarts_total{service="web"} `) ||
		strings.Contains(body, `bushost_supervisor_service_restarts_total{service="web"} 0`) {
		t.Errorf("/metrics does not count web's restarts")
	}

	// JSON throughout: the supervisor's lines and the service's output.
	var sawOutput, sawSent, sawRetry bool
	for _, line := range strings.Split(strings.TrimSpace(r.log.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		switch m["msg"] {
		case "output":
			sawOutput = sawOutput || (m["service"] == "web" && m["line"] == "serving v1")
		case "notification sent":
			sawSent = true
		case "notification failed; retrying":
			sawRetry = true
		}
	}
	if !sawOutput || !sawSent || !sawRetry {
		t.Errorf("log: service output %v, notification sent %v, retry %v", sawOutput, sawSent, sawRetry)
	}
}

func (r *running) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	return string(b)
}

// A webhook that never answers holds up neither reverts nor health nor
// the stop, and the level flag keeps info lines out.
func TestSupervisorDeadWebhookNeverBlocks(t *testing.T) {
	hung := make(chan struct{})
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-hung:
		case <-req.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hung); dead.Close() })
	r := startSupervisorWith(t, fmt.Sprintf("notify_url = %q\n", dead.URL)+fmt.Sprintf(webService, "/nonexistent"),
		Options{LogLevel: "warn"}, func(s *Supervisor) { s.notify.client.Timeout = time.Hour })
	waitFor(t, "first good commit", 5*time.Second, func() bool { return r.s.Status().Good != "" })
	writeFile(t, filepath.Join(r.ws, "src", "web", "serve.sh"), "#!/bin/bash\nexit 1\n")
	waitFor(t, "revert", 10*time.Second, func() bool { return len(r.s.Status().Reverts) == 1 })
	waitFor(t, "healthy after revert", 5*time.Second, func() bool { return r.healthz(t) == 200 })
	waitFor(t, "recovery", 10*time.Second, func() bool {
		return strings.Contains(r.get(t, "/metrics"), "bushost_supervisor_recoveries_total 1")
	})
	if !strings.Contains(r.get(t, "/metrics"), "bushost_supervisor_notifications_total{result=\"sent\"} 0") {
		t.Error("a notification counts as sent to a server that never answered")
	}
	r.stop()
	if log := r.log.String(); strings.Contains(log, "level=INFO") || !strings.Contains(log, "level=WARN") {
		t.Errorf("--log-level warn log:\n%s", log)
	}
}

// A full queue drops its oldest notification, counts and logs it, and
// never blocks the sender; the worker then sends the rest in order.
func TestNotifierQueueDropsOldest(t *testing.T) {
	rcv := newReceiver(t, 0)
	var log syncBuffer
	q := newNotifier(rcv.srv.URL, slog.New(slog.NewTextHandler(&log, nil)))
	q.queueLen = 2
	for _, ev := range []string{EventRevert, EventRevertFailed, EventHalt, EventRecovery} {
		q.send(Notification{Event: ev, Service: "web"})
	}
	if sent, failed, dropped, queued := q.counts(); sent != 0 || failed != 0 || dropped != 2 || queued != 2 {
		t.Fatalf("counts sent %d failed %d dropped %d queued %d", sent, failed, dropped, queued)
	}
	if n := strings.Count(log.String(), "notification queue full: dropped the oldest"); n != 2 || !strings.Contains(log.String(), "dropped_total=2") {
		t.Errorf("log:\n%s", log.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); q.run(ctx) }()
	waitFor(t, "two sent", 5*time.Second, func() bool { s, _, _, _ := q.counts(); return s == 2 })
	cancel()
	<-done
	got := rcv.events()
	if len(got) != 2 || got[0].Event != EventHalt || got[0].Seq != 3 || got[1].Event != EventRecovery || got[1].Seq != 4 {
		t.Errorf("received %+v, want halt (3) then recovery (4)", got)
	}
}
