package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkPushGrowth: the cost of a push must not grow with the history
// of pushes (docs/git-service.md, "Housekeeping"). Two scenarios, each on
// two daemons at once, one with --housekeeping=auto and one with
// --housekeeping=off, their pushes alternating:
//
//   - one task: 2,000 one-commit pushes, each a fast-forward of the last
//     (push-working --bundle of a bundle against the last push; with
//     --repo the bundle is made against main and would grow with the
//     task's history);
//   - many tasks: 500 tasks that each push one commit and land it (the
//     pool grows).
//
// Each prints the median push latency (bushost push-working, end to end)
// of the last 100 against the first 100 (target: within 1.2x with
// housekeeping on; off is printed for comparison), the most packs any
// repository held (target: under 20 with it on), and fetch-main and
// fetch-review (one task) or fetch-main (many tasks) latency late against
// early. BUSHOST_BENCH_GROWTH_PUSHES and BUSHOST_BENCH_GROWTH_TASKS change
// the sizes; -short makes them 200 and 50. A missed target is reported,
// loudly, not failed.
func BenchmarkPushGrowth(b *testing.B) {
	pushes, tasks := 2000, 500
	if testing.Short() {
		pushes, tasks = 200, 50
	}
	pushes = envInt(b, "BUSHOST_BENCH_GROWTH_PUSHES", pushes)
	tasks = envInt(b, "BUSHOST_BENCH_GROWTH_TASKS", tasks)
	for n := 0; n < b.N; n++ {
		b.Run("one-task", func(b *testing.B) { growthOneTask(b, pushes) })
		b.Run("many-tasks", func(b *testing.B) { growthManyTasks(b, tasks) })
	}
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 10 {
		b.Fatalf("%s=%q: want a number of at least 10", name, v)
	}
	return n
}

// growthHost is one daemon of a growth scenario and what was measured on
// it.
type growthHost struct {
	name     string // "on" or "off"
	h        *Host
	work     string
	pushes   []time.Duration
	maxPacks int
}

func newGrowthHosts(b *testing.B, dir string) []*growthHost {
	var hs []*growthHost
	for _, mode := range []string{"on", "off"} {
		hk := "auto"
		if mode == "off" {
			hk = "off"
		}
		if err := os.MkdirAll(filepath.Join(dir, mode), 0o755); err != nil {
			b.Fatal(err)
		}
		h := startHostWith(b, hostOpts{Home: filepath.Join(dir, mode, "home"), Args: []string{"--housekeeping=" + hk, "--log-level", "warn"}})
		h.AddProject(b, "acme", "web")
		hs = append(hs, &growthHost{name: mode, h: h, work: filepath.Join(dir, "work-"+mode)})
	}
	return hs
}

// packs is the most packs any repository of acme/web holds now.
func (g *growthHost) packs() int {
	most := 0
	repos, _ := filepath.Glob(filepath.Join(g.h.Home, "repos", "acme", "web", "tasks", "*.git"))
	for _, r := range append(repos, g.h.PoolRepo("acme", "web")) {
		m, _ := filepath.Glob(filepath.Join(r, "objects", "pack", "*.pack"))
		most = max(most, len(m))
	}
	return most
}

// timed runs bushost as tok and returns how long it took.
func (g *growthHost) timed(b *testing.B, tok string, args ...string) time.Duration {
	b.Helper()
	start := time.Now()
	out, errs, code := g.h.Run(b, nil, append([]string{"--token-file", tok}, args...)...)
	d := time.Since(start)
	if code != 0 {
		b.Fatalf("%s: bushost %s: exit %d\n%s%s", g.name, strings.Join(args, " "), code, out, errs)
	}
	return d
}

// commit commits a change to f.txt in dir.
func growthCommit(b *testing.B, dir string, i int) {
	b.Helper()
	if err := os.WriteFile(filepath.Join(dir, "f.txt"), []byte(fmt.Sprintf("change %d\n", i)), 0o644); err != nil {
		b.Fatal(err)
	}
	testGit(b, dir, "add", "f.txt")
	testGit(b, dir, "commit", "-q", "-m", fmt.Sprintf("change %d", i))
}

// window is how many pushes "first" and "last" take: 100, or a fifth of
// a smaller run.
func window(n int) int { return min(100, max(n/5, 1)) }

// growthLine prints and reports one daemon's push growth.
func growthLine(b *testing.B, scenario string, g *growthHost) {
	w := window(len(g.pushes))
	first, last := median(g.pushes[:w]), median(g.pushes[len(g.pushes)-w:])
	ratio := float64(last) / float64(first)
	verdict := ""
	if g.name == "on" {
		verdict = " (target 1.20) met"
		if ratio > 1.2 {
			verdict = " (target 1.20) MISSED"
		}
		packs := " (target <20) met"
		if g.maxPacks >= 20 {
			packs = " (target <20) MISSED"
		}
		verdict += "; most packs in a repository " + strconv.Itoa(g.maxPacks) + packs
		b.ReportMetric(ratio, "x-growth-on")
		b.ReportMetric(float64(g.maxPacks), "max-packs-on")
	} else {
		verdict = "; most packs in a repository " + strconv.Itoa(g.maxPacks)
		b.ReportMetric(ratio, "x-growth-off")
		b.ReportMetric(float64(g.maxPacks), "max-packs-off")
	}
	line := fmt.Sprintf("push growth, %s, housekeeping %s: first %d pushes median %.1f ms, last %d %.1f ms, ratio %.2f%s",
		scenario, g.name, w, ms(first), w, ms(last), ratio, verdict)
	fmt.Println(line)
	b.Log(line)
	if strings.Contains(line, "MISSED") {
		fmt.Printf("*** TARGET MISSED: %s ***\n", line)
	}
}

// fetchLine prints one fetch's latency late against early.
func fetchLine(b *testing.B, what, scenario string, g *growthHost, atEarly, atLate int, early, late []time.Duration) {
	ratio := float64(median(late)) / float64(median(early))
	verdict := ""
	if g.name == "on" {
		verdict = " (target 1.20) met"
		if ratio > 1.2 {
			verdict = " (target 1.20) MISSED"
		}
		b.ReportMetric(ratio, "x-"+what)
	}
	line := fmt.Sprintf("%s, %s, housekeeping %s: at push %d median %.1f ms, at push %d %.1f ms, ratio %.2f%s [medians of %d]",
		what, scenario, g.name, atEarly, ms(median(early)), atLate, ms(median(late)), ratio, verdict, len(early))
	fmt.Println(line)
	b.Log(line)
}

// fetchReps is how many fetches each early and late figure is the median
// of.
const fetchReps = 5

func growthOneTask(b *testing.B, pushes int) {
	dir := baseDir(b)
	hs := newGrowthHosts(b, dir)
	type tokens struct{ worker, reviewer string }
	toks := map[*growthHost]tokens{}
	for _, g := range hs {
		toks[g] = tokens{g.h.Grant(b, "acme", "web", "t1", "worker", "git.push.working"),
			g.h.Grant(b, "acme", "web", "t1", "reviewer", "review.verdict")}
		g.timed(b, toks[g].worker, "fetch-main", "--repo", g.work)
	}
	early := window(pushes)
	fetches := map[string][]time.Duration{}
	for i := 1; i <= pushes; i++ {
		for k := range hs {
			g := hs[(i+k)%2] // alternate which daemon goes first
			growthCommit(b, g.work, i)
			// A one-commit bundle, against the last push: push-working
			// --repo bundles against main, so each push would carry the
			// task's whole history so far.
			bundle := filepath.Join(dir, "push-"+g.name+".bundle")
			base := "refs/remotes/bushost/main"
			if i > 1 {
				base = "HEAD~1"
			}
			testGit(b, g.work, "bundle", "create", "-q", bundle, "HEAD", "^"+base)
			g.pushes = append(g.pushes, g.timed(b, toks[g].worker, "push-working", "--bundle", bundle))
			if i%50 == 0 || i == pushes {
				g.maxPacks = max(g.maxPacks, g.packs())
			}
			// Fetches around the early and the late mark: fetch-review
			// after each of the last fetchReps pushes before it (the
			// reviewer's repository is kept, so each brings one push),
			// fetch-main fetchReps times at it.
			at := ""
			switch {
			case i > early-fetchReps && i <= early:
				at = "early"
			case i > pushes-fetchReps:
				at = "late"
			}
			if at == "" {
				if i == early-fetchReps {
					g.timed(b, toks[g].reviewer, "fetch-review", "--repo", filepath.Join(dir, "review-"+g.name))
				}
				continue
			}
			fetches[g.name+"review"+at] = append(fetches[g.name+"review"+at],
				g.timed(b, toks[g].reviewer, "fetch-review", "--repo", filepath.Join(dir, "review-"+g.name)))
			fetches[g.name+"main"+at] = append(fetches[g.name+"main"+at],
				g.timed(b, toks[g].worker, "fetch-main", "--repo", g.work))
		}
	}
	for _, g := range hs {
		growthLine(b, fmt.Sprintf("one task, %d pushes", pushes), g)
		fetchLine(b, "fetch-review", "one task", g, early, pushes, fetches[g.name+"reviewearly"], fetches[g.name+"reviewlate"])
		fetchLine(b, "fetch-main", "one task", g, early, pushes, fetches[g.name+"mainearly"], fetches[g.name+"mainlate"])
		g.h.FsckProject(b, "acme", "web")
	}
}

func growthManyTasks(b *testing.B, tasks int) {
	dir := baseDir(b)
	hs := newGrowthHosts(b, dir)
	early := window(tasks)
	fetches := map[string][]time.Duration{}
	for i := 1; i <= tasks; i++ {
		task := fmt.Sprintf("t%d", i)
		for k := range hs {
			g := hs[(i+k)%2]
			worker := g.h.Grant(b, "acme", "web", task, "worker", "git.push.working", "review.request")
			reviewer := g.h.Grant(b, "acme", "web", task, "reviewer", "review.verdict")
			d := g.timed(b, worker, "fetch-main", "--repo", g.work)
			switch {
			case i > early-fetchReps && i <= early:
				fetches[g.name+"early"] = append(fetches[g.name+"early"], d)
			case i > tasks-fetchReps:
				fetches[g.name+"late"] = append(fetches[g.name+"late"], d)
			}
			growthCommit(b, g.work, i)
			g.pushes = append(g.pushes, g.timed(b, worker, "push-working", "--repo", g.work))
			id := strings.TrimSpace(g.h.Must(b, "--token-file", worker, "review", "request"))
			review := filepath.Join(dir, "review-"+g.name+"-"+task)
			g.timed(b, reviewer, "fetch-review", "--repo", review)
			g.timed(b, reviewer, "review", "verdict", "--request", id, "--approve", "--repo", review)
			os.RemoveAll(review)
			g.h.Must(b, "task", "land", "--business", "acme", "--project", "web", "--task", task)
			if i%25 == 0 || i == tasks {
				g.maxPacks = max(g.maxPacks, g.packs())
			}
		}
	}
	for _, g := range hs {
		growthLine(b, fmt.Sprintf("%d tasks each pushing and landing one commit", tasks), g)
		fetchLine(b, "fetch-main", "many tasks (main grows a commit a task)", g, early, tasks, fetches[g.name+"early"], fetches[g.name+"late"])
		g.h.FsckProject(b, "acme", "web")
	}
}
