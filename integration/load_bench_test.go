package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
)

// loadPusher is one client pushing a chain of commits to its own task.
type loadPusher struct {
	project, task string
	token, work   string
	pushed        []string
	latencies     []time.Duration
}

func (p *loadPusher) run(b *testing.B, h *Host, pushes int) {
	for i := 0; i < pushes; i++ {
		name := fmt.Sprintf("%s-%d.txt", p.task, i)
		os.WriteFile(filepath.Join(p.work, name), []byte(name+"\n"), 0o644)
		testGit(b, p.work, "add", name)
		testGit(b, p.work, "commit", "-q", "-m", name)
		start := time.Now()
		out, errs, code := h.Run(b, nil, "--token-file", p.token, "push-working", "--repo", p.work)
		if code != 0 {
			b.Errorf("push %s #%d: %s", p.task, i, errs)
			return
		}
		p.latencies = append(p.latencies, time.Since(start))
		p.pushed = append(p.pushed, strings.TrimSpace(out))
	}
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1))]
}

// BenchmarkLoad: 32 clients push to 32 tasks across 4 repositories while
// others record events and fetch reviews; it prints throughput and p50/p99
// push latency beside one client alone, and fails on any lost or
// misordered update (every task's recorded pushes must form the chain the
// client pushed, and refs/work must be its last commit).
func BenchmarkLoad(b *testing.B) {
	for i := 0; i < b.N; i++ {
		h := startHost(b)
		projects := []string{"p0", "p1", "p2", "p3"}
		for _, p := range projects {
			h.AddProject(b, "acme", p)
		}
		base := baseDir(b)
		mk := func(n int, prefix string) []*loadPusher {
			var ps []*loadPusher
			for j := 0; j < n; j++ {
				p := &loadPusher{project: projects[j%4], task: fmt.Sprintf("%s%d", prefix, j)}
				p.token = h.Grant(b, "acme", p.project, p.task, "worker", "git.push.working", "review.request")
				p.work = filepath.Join(base, p.task)
				h.Must(b, "--token-file", p.token, "fetch-main", "--repo", p.work)
				ps = append(ps, p)
			}
			return ps
		}
		const pushes = 5

		// One client alone.
		solo := mk(1, "solo")
		start := time.Now()
		solo[0].run(b, h, 2*pushes)
		soloRate := float64(len(solo[0].pushed)) / time.Since(start).Seconds()

		// 32 clients, with event recorders and reviewers alongside.
		many := mk(32, "t")
		recorder := h.Grant(b, "acme", "p0", "events", "recorder", "event.record")
		reviewer := h.Grant(b, "acme", "p1", "t1", "reviewer", "review.verdict")
		ctx, cancel := context.WithCancel(context.Background())
		var events, reviews atomic.Int64
		var side sync.WaitGroup
		tok := strings.TrimSpace(readText(b, recorder))
		for r := 0; r < 4; r++ {
			side.Add(1)
			go func() {
				defer side.Done()
				conn, cctx := dialHome(b, h.Home, "broker.sock", tok)
				c := brokerv1.NewBrokerServiceClient(conn)
				for ctx.Err() == nil {
					if _, err := c.RecordEvent(cctx, &brokerv1.RecordEventRequest{Type: "load.tick", Data: `{"n":1}`}); err == nil {
						events.Add(1)
					}
				}
			}()
		}
		side.Add(1)
		go func() {
			defer side.Done()
			rw := filepath.Join(base, "review")
			for ctx.Err() == nil {
				if _, _, code := h.Run(b, nil, "--token-file", reviewer, "fetch-review", "--repo", rw); code == 0 {
					reviews.Add(1)
				} else {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
		start = time.Now()
		var wg sync.WaitGroup
		for _, p := range many {
			wg.Add(1)
			go func() { defer wg.Done(); p.run(b, h, pushes) }()
		}
		wg.Wait()
		elapsed := time.Since(start)
		cancel()
		side.Wait()

		var all []time.Duration
		total := 0
		for _, p := range many {
			all = append(all, p.latencies...)
			total += len(p.pushed)
		}
		lost, misordered := checkChains(b, h, append(many, solo...))
		b.ReportMetric(float64(total)/elapsed.Seconds(), "pushes/s")
		b.ReportMetric(float64(percentile(all, 0.5).Milliseconds()), "p50-ms")
		b.ReportMetric(float64(percentile(all, 0.99).Milliseconds()), "p99-ms")
		fmt.Printf("load: 32 clients x %d pushes over 4 repositories: %.1f pushes/s, p50 %v, p99 %v; alongside %d events recorded, %d review fetches\n",
			pushes, float64(total)/elapsed.Seconds(), percentile(all, 0.5).Round(time.Millisecond), percentile(all, 0.99).Round(time.Millisecond), events.Load(), reviews.Load())
		fmt.Printf("load: one client alone: %.1f pushes/s, p50 %v, p99 %v\n",
			soloRate, percentile(solo[0].latencies, 0.5).Round(time.Millisecond), percentile(solo[0].latencies, 0.99).Round(time.Millisecond))
		fmt.Printf("load: lost updates %d, misordered %d\n", lost, misordered)
		if lost+misordered > 0 {
			b.Fatalf("%d lost and %d misordered updates", lost, misordered)
		}
	}
}

// checkChains compares each task's recorded pushes with what its client
// pushed, in order, and refs/work with the last one.
func checkChains(b *testing.B, h *Host, ps []*loadPusher) (lost, misordered int) {
	evs := allEvents(b, h)
	recorded := map[string][]string{}
	for _, e := range evs {
		if e.Type != "action.allowed" {
			continue
		}
		f := e.fields(b)
		if f["capability"] == "git.push.working" {
			c, _ := f["commit"].(string)
			recorded[e.Project+"/"+e.Task] = append(recorded[e.Project+"/"+e.Task], c)
		}
	}
	for _, p := range ps {
		got := recorded[p.project+"/"+p.task]
		if len(got) != len(p.pushed) {
			lost += len(p.pushed) - len(got)
			continue
		}
		for i := range got {
			if got[i] != p.pushed[i] {
				misordered++
			}
		}
		if len(p.pushed) > 0 {
			ref := testGit(b, h.TaskRepo("acme", p.project, p.task), "rev-parse", "refs/work/"+p.task)
			if ref != p.pushed[len(p.pushed)-1] {
				lost++
			}
		}
	}
	return lost, misordered
}
