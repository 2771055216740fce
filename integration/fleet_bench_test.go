package integration

import (
	"bufio"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/bushost/bushost/internal/pgtest"
)

// fleetClients and fleetPushes: each host has fleetClients workers, each
// pushing fleetPushes commits to a task of its own, at once.
const (
	fleetClients = 4
	fleetPushes  = 8
)

// promSums reads the _sum and _count of the histograms named from a
// Prometheus text page.
func promSums(page string, names ...string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		for _, n := range names {
			if f[0] == n+"_sum" || f[0] == n+"_count" {
				v, _ := strconv.ParseFloat(f[1], 64)
				out[f[0]] = v
			}
		}
	}
	return out
}

// BenchmarkFleetWrites measures what the fleet's one write lock (the
// advisory lock every write transaction of every host takes on a shared
// PostgreSQL) costs a push: the lock's wait and hold time per push, beside
// the push's own duration, with one host and with two hosts on one
// PostgreSQL, each pushing to projects of its own (fleetClients workers a
// host, fleetPushes pushes each). The figures are the daemons' own
// histograms (bushost_broker_write_lock_{wait,hold}_seconds,
// bushost_push_duration_seconds), read before and after. A figure, not a
// target: docs/performance.md keeps it and what it decided.
func BenchmarkFleetWrites(b *testing.B) {
	names := []string{"bushost_broker_write_lock_wait_seconds", "bushost_broker_write_lock_hold_seconds", "bushost_push_duration_seconds"}
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				dsn := pgtest.SchemaDSN(b, "fleet", "the fleet's write lock, measured")
				type host struct {
					h       *Host
					metrics string
					pushers []*loadPusher
				}
				var hs []*host
				for k := 0; k < n; k++ {
					sock := filepath.Join(baseDir(b), "metrics.sock")
					h := startHostWith(b, hostOpts{Args: []string{"--broker-dsn", dsn, "--metrics-addr", "unix:" + sock, "--housekeeping", "off"}})
					project := fmt.Sprintf("p%d", k)
					h.AddProject(b, "acme", project)
					x := &host{h: h, metrics: sock}
					for c := 0; c < fleetClients; c++ {
						task := fmt.Sprintf("t%d", c)
						p := &loadPusher{project: project, task: task, token: h.Grant(b, "acme", project, task, "worker", "git.push.working"),
							work: filepath.Join(filepath.Dir(h.Home), "work-"+task)}
						if _, errs, code := h.Run(b, nil, "--token-file", p.token, "fetch-main", "--repo", p.work); code != 0 {
							b.Fatalf("fetch-main: %s", errs)
						}
						x.pushers = append(x.pushers, p)
					}
					hs = append(hs, x)
				}
				before := make([]map[string]float64, n)
				for k, x := range hs {
					before[k] = promSums(scrapeUnix(b, x.metrics), names...)
				}
				b.ResetTimer()
				var wg sync.WaitGroup
				for _, x := range hs {
					for _, p := range x.pushers {
						wg.Add(1)
						go func() {
							defer wg.Done()
							p.run(b, x.h, fleetPushes)
						}()
					}
				}
				wg.Wait()
				b.StopTimer()
				var wait, hold, push, pushes float64
				for k, x := range hs {
					after := promSums(scrapeUnix(b, x.metrics), names...)
					d := func(name string) float64 { return after[name] - before[k][name] }
					wait += d("bushost_broker_write_lock_wait_seconds_sum")
					hold += d("bushost_broker_write_lock_hold_seconds_sum")
					push += d("bushost_push_duration_seconds_sum")
					pushes += d("bushost_push_duration_seconds_count")
				}
				if want := float64(n * fleetClients * fleetPushes); pushes != want {
					b.Fatalf("%v pushes measured, want %v", pushes, want)
				}
				ms := func(s float64) float64 { return 1000 * s / pushes }
				b.ReportMetric(ms(wait), "lock-wait-ms/push")
				b.ReportMetric(ms(hold), "lock-hold-ms/push")
				b.ReportMetric(ms(push), "push-ms")
				b.ReportMetric(100*wait/push, "wait-%-of-push")
				b.Logf("%d host(s), %d pushes: lock wait %.2f ms, hold %.2f ms per push; a push takes %.1f ms on the server; the wait is %.2f%% of it",
					n, int(pushes), ms(wait), ms(hold), ms(push), 100*wait/push)
			}
		})
	}
}
