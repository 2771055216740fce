package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

// fillWorkspace makes n small files under dir, a thousand a directory,
// all of wsOwner's, as the workspace is (so the walk hands every one
// over; a root-owned workspace that is not empty is always walked).
func fillWorkspace(b *testing.B, dir string, n int) {
	b.Helper()
	mkdir := func(d string) {
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.Chown(d, wsOwner, wsOwner); err != nil {
			b.Fatal(err)
		}
	}
	mkdir(dir)
	for i := 0; i < n; i++ {
		sub := filepath.Join(dir, fmt.Sprintf("d%04d", i/1000))
		if i%1000 == 0 {
			mkdir(sub)
		}
		fd, err := unix.Open(filepath.Join(sub, strconv.Itoa(i)), unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		unix.Write(fd, []byte("x\n"))
		unix.Fchown(fd, wsOwner, wsOwner)
		unix.Close(fd)
	}
}

// BenchmarkSandboxWorkspaceSize times `sandbox run -- /bin/true` (no
// limit, no --disk) on an empty workspace and on ones of 50,000 and
// 500,000 files, through idmapped mounts, and beside it the same through
// the fallback walk (a hooked build told there are no idmapped mounts),
// whose hand-over and hand-back grow with the workspace. All contenders
// alternate, the turn order rotated every round; medians. The target: at
// most 1.5x the empty workspace's time at either size. The walk runs fewer
// rounds (and, with -short, not on 500,000 files): it takes seconds each.
func BenchmarkSandboxWorkspaceSize(b *testing.B) {
	testenv.NeedRoot(b, "only root gives a session a uid of its own")
	e := newSandboxEnv(b)
	hooked := hookBin(b, "sandbox")
	sizes := []int{0, 50000, 500000}
	ws := map[int]string{}
	for _, n := range sizes {
		ws[n] = filepath.Join(e.base, fmt.Sprintf("ws-%d", n))
		start := time.Now()
		fillWorkspace(b, ws[n], n)
		b.Logf("made a workspace of %d files in %v", n, time.Since(start).Round(time.Millisecond))
	}
	type contender struct {
		name   string
		walk   bool
		files  int
		rounds int
		times  []time.Duration
	}
	walkRounds := 5
	var cs []*contender
	for _, n := range sizes {
		cs = append(cs, &contender{name: "idmap", files: n, rounds: benchRuns})
	}
	for _, n := range sizes {
		if n == 500000 && testing.Short() {
			continue
		}
		r := walkRounds
		if n == 500000 {
			r = 3
		}
		cs = append(cs, &contender{name: "walk", walk: true, files: n, rounds: r})
	}
	runOnce := func(c *contender) time.Duration {
		args := []string{"run", "--run-dir", e.run, "--workspace", ws[c.files], "--role", "coder", "--caps", "git.push.working",
			"--broker-socket", e.broker, "--", "/bin/true"}
		sb, env := e.sandbox, []string{"PATH=/usr/bin:/bin"}
		if c.walk {
			sb, env = hooked, append(env, "BUSHOST_TESTHOOK_NO_IDMAP=1")
		}
		cmd := exec.Command(sb, args...)
		cmd.Env = env
		start := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(start)
		if err != nil || (!c.walk && len(out) > 0) {
			b.Fatalf("sandbox run (%s, %d files): %v\n%s", c.name, c.files, err, out)
		}
		return d
	}
	for _, c := range cs[:len(sizes)] {
		runOnce(c) // warm the page cache
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < benchRuns; j++ {
			for k := range cs {
				c := cs[(j+k)%len(cs)]
				if j < c.rounds {
					c.times = append(c.times, runOnce(c))
				}
			}
		}
	}
	b.StopTimer()
	med := func(c *contender) time.Duration { return medianRun(c.times) }
	base, walkBase := med(cs[0]), time.Duration(0)
	var parts, walkParts []string
	worst := 0.0
	for _, c := range cs {
		m := med(c)
		if c.walk && c.files == 0 {
			walkBase = m
		}
		label := fmt.Sprintf("%d files %.1f ms", c.files, ms(m))
		if c.files > 0 {
			ref := base
			if c.walk {
				ref = walkBase
			}
			r := float64(m) / float64(ref)
			label += fmt.Sprintf(" (%.2fx)", r)
			if !c.walk {
				worst = max(worst, r)
				b.ReportMetric(r, fmt.Sprintf("ratio-%dk", c.files/1000))
			}
		}
		if c.walk {
			walkParts = append(walkParts, label)
		} else {
			parts = append(parts, label)
		}
	}
	line := fmt.Sprintf("sandbox run /bin/true by workspace size, idmapped mounts: %s (target <= 1.5x the empty one; medians of %d runs each); "+
		"the fallback walk: %s (medians of %d runs, 3 for 500,000 files)",
		strings.Join(parts, ", "), benchRuns, strings.Join(walkParts, ", "), walkRounds)
	fmt.Println(line)
	b.Log(line)
	if worst > 1.5 {
		fmt.Printf("*** TARGET MISSED: a full workspace's start is %.2fx an empty one's, over 1.5x ***\n", worst)
	}
}

// startSteps times, with a hooked build of the sandbox, the steps of
// `sandbox run -- /bin/true` with flags (internal/testhook's Step marks,
// in run and in the session's pid 1), runs times, and prints each step's
// median: where a start's time goes. The first step counts from before
// the exec, so it holds the process's start and the Go runtime's.
func startSteps(b *testing.B, flags []string, runs int) {
	b.Helper()
	hooked := hookBin(b, "sandbox")
	args := append(append([]string{"run"}, flags...), "--env", "BUSHOST_TESTHOOK_STEPS", "--", "/bin/true")
	steps := map[string][]time.Duration{}
	var order []string
	for i := 0; i < runs; i++ {
		cmd := exec.Command(hooked, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "BUSHOST_TESTHOOK_STEPS=1"}
		start := time.Now()
		out, err := cmd.CombinedOutput()
		end := time.Now()
		if err != nil {
			b.Fatalf("sandbox run: %v\n%s", err, out)
		}
		prev, prevName := start, "exec"
		sc := bufio.NewScanner(strings.NewReader(string(out)))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 4 || f[0] != "testhook" || f[1] != "step" {
				continue
			}
			ns, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil {
				b.Fatalf("step line %q", sc.Text())
			}
			at := time.Unix(0, ns)
			name := prevName + " -> " + f[2]
			if i == 0 {
				order = append(order, name)
			}
			steps[name] = append(steps[name], at.Sub(prev))
			prev, prevName = at, f[2]
		}
		name := prevName + " -> exited"
		if i == 0 {
			order = append(order, name)
		}
		steps[name] = append(steps[name], end.Sub(prev))
	}
	var total time.Duration
	var lines []string
	for _, name := range order {
		if len(steps[name]) != runs {
			continue // a step not reached in every run
		}
		m := medianRun(steps[name])
		total += m
		lines = append(lines, fmt.Sprintf("  %-26s %6.2f ms", name, ms(m)))
	}
	fmt.Printf("where sandbox run /bin/true's time goes (medians of %d runs of a hooked build; their sum %.1f ms):\n%s\n", runs, ms(total), strings.Join(lines, "\n"))
}
