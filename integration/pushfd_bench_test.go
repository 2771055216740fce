package integration

import (
	"bufio"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkGitPushLarge: a 200 MB push (20 MB under -short) of
// incompressible blobs, `bushost push-working --bundle FILE` end to end
// (the file's descriptor is passed to the daemon, docs/git-service.md),
// against raw `git index-pack --strict --fix-thin --stdin` (with the
// daemon's index-pack settings) reading the pack straight from the same
// file, into a fresh bare clone of the project's root. Target: within 1.05x. Pairs alternate which side goes first; the
// median of the per-pair ratios is reported.
func BenchmarkGitPushLarge(b *testing.B) {
	mb, reps := 200, 3
	if testing.Short() {
		mb, reps = 20, 5
	}
	dir := baseDir(b)
	root, bundle := largeBundle(b, dir, mb)
	fi, _ := os.Stat(bundle)
	commit := bundleRef(b, bundle)
	h := startHostWith(b, hostOpts{Home: filepath.Join(dir, "home"), Args: []string{"--max-bundle-bytes", "1G"}})
	ours := func(task string) time.Duration {
		d := timedPush(b, h, task, root, commit, "--bundle", bundle)
		b.StopTimer()
		// The next pair must not pay for this one's writes.
		os.RemoveAll(h.TaskRepo("bench", task, "t"))
		syscall.Sync()
		b.StartTimer()
		return d
	}
	raw := func(bare string) time.Duration {
		b.StopTimer()
		testGit(b, dir, "clone", "-q", "--bare", root, bare)
		f, br, _ := readBundle(b, bundle)
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			b.Fatal(err)
		}
		// The pack's first byte: what the header reader consumed.
		if _, err := f.Seek(off-int64(br.Buffered()), io.SeekStart); err != nil {
			b.Fatal(err)
		}
		// The daemon's index-pack settings (gitd's indexPackConfig and
		// gitcmd's bigFileThreshold), so the ratio is what bushost adds
		// around the same git work, not a difference of git settings.
		cmd := exec.Command("git", "-c", "pack.threads=1", "-c", "core.deltaBaseCacheLimit=32m", "-c", "core.bigFileThreshold=16m",
			"index-pack", "--strict", "--fix-thin", "--stdin")
		cmd.Dir = bare
		cmd.Env = append(cleanEnv(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		cmd.Stdin = f // git reads the file itself
		syscall.Sync()
		b.StartTimer()
		start := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(start)
		b.StopTimer()
		f.Close()
		if err != nil {
			b.Fatalf("index-pack: %v\n%s", err, out)
		}
		os.RemoveAll(bare)
		syscall.Sync()
		b.StartTimer()
		return d
	}
	for n := 0; n < b.N; n++ {
		var oursD, rawD []time.Duration
		var ratios []float64
		for r := 0; r < reps; r++ {
			task, bare := fmt.Sprintf("l%d-%d", n, r), filepath.Join(dir, fmt.Sprintf("raw-%d-%d.git", n, r))
			var o, w time.Duration
			if r%2 == 0 {
				o, w = ours(task), raw(bare)
			} else {
				w = raw(bare)
				o = ours(task)
			}
			oursD, rawD = append(oursD, o), append(rawD, w)
			ratios = append(ratios, float64(o)/float64(w))
		}
		if log, _ := os.ReadFile(h.Log); !strings.Contains(string(log), " passed=") {
			b.Fatal("the daemon read no push from a passed descriptor")
		}
		mo, mr, ratio := median(oursD), median(rawD), medianFloat(ratios)
		b.ReportMetric(ratio, "x-index-pack")
		b.ReportMetric(float64(mo.Microseconds())/1000, "ms-bushost")
		b.ReportMetric(float64(mr.Microseconds())/1000, "ms-index-pack")
		verdict := verdictOf(ratio, 1.05)
		line := fmt.Sprintf("large push (%d MB, descriptor passed): bushost %.1f ms, raw index-pack %.1f ms, ratio %.3f (target 1.05) %s [bundle %d bytes; median of %d alternating pairs; ratios %s]",
			mb, ms(mo), ms(mr), ratio, verdict, fi.Size(), reps, fmtRatios(ratios))
		report(b, line, ratio > 1.05, fmt.Sprintf("the %d MB push is %.3fx raw index-pack, over the 1.05x target", mb, ratio))
	}
}

// largeBundle makes a project root with one seed commit and a bundle of mb
// commits on top of it, each adding a 1 MiB random blob (written straight
// into a pack by fast-import, so making it costs one compression).
func largeBundle(b *testing.B, dir string, mb int) (root, bundle string) {
	_, root, work := seededClone(b)
	_ = dir
	cmd := exec.Command("git", "fast-import", "--quiet")
	cmd.Dir = work
	cmd.Env = append(cleanEnv(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(in, 1<<20)
	rng := rand.New(rand.NewSource(2))
	blob := make([]byte, 1<<20)
	for i := 0; i < mb; i++ {
		from := ""
		if i == 0 {
			from = "from refs/heads/main^0\n"
		}
		fmt.Fprintf(w, "commit refs/heads/main\ncommitter T <t@localhost> %d +0000\ndata 5\nlarge%s", 1700000000+i, from)
		rng.Read(blob)
		fmt.Fprintf(w, "M 100644 inline big%03d.bin\ndata %d\n", i, len(blob))
		w.Write(blob)
		w.WriteString("\n\n")
	}
	w.Flush()
	in.Close()
	if err := cmd.Wait(); err != nil {
		b.Fatalf("fast-import: %v\n%s", err, stderr.String())
	}
	return root, bundleFile(b, work, filepath.Dir(work), "large", "main", "^origin/main")
}

// streamedPush prints the push of bundle with its bytes streamed (the
// client reads it from a pipe, which is never passed) against the same
// push with its descriptor passed, alternating, on one daemon.
func streamedPush(b *testing.B, dir, root, bundle string) {
	h := startHostWith(b, hostOpts{Home: filepath.Join(dir, "home-streamed")})
	commit := bundleRef(b, bundle)
	data, err := os.ReadFile(bundle)
	if err != nil {
		b.Fatal(err)
	}
	push := func(task string, streamed bool) time.Duration {
		b.StopTimer()
		h.Must(b, "project", "add", "--business", "bench", "--project", task, "--root", root)
		tok := h.Grant(b, "bench", task, "t", "worker", "git.push.working")
		quiesce(b, h, task)
		syscall.Sync()
		b.StartTimer()
		path := bundle
		cmd := exec.Command(h.client, "--home", h.Home, "--token-file", tok, "push-working", "--bundle", path)
		if streamed {
			cmd.Args[len(cmd.Args)-1] = "/dev/stdin"
			cmd.Stdin = strings.NewReader(string(data))
		}
		cmd.Env = cleanEnv()
		start := time.Now()
		out, err := cmd.Output()
		d := time.Since(start)
		if err != nil || strings.TrimSpace(string(out)) != commit {
			b.Fatalf("push (streamed %v): %v: %s", streamed, err, out)
		}
		b.StopTimer()
		quiesce(b, h, task)
		b.StartTimer()
		return d
	}
	for n := 0; n < b.N; n++ {
		var passedD, streamedD []time.Duration
		var ratios []float64
		for r := 0; r < benchReps; r++ {
			var p, s time.Duration
			if r%2 == 0 {
				p, s = push(fmt.Sprintf("p%d-%d", n, r), false), push(fmt.Sprintf("s%d-%d", n, r), true)
			} else {
				s = push(fmt.Sprintf("s%d-%d", n, r), true)
				p = push(fmt.Sprintf("p%d-%d", n, r), false)
			}
			passedD, streamedD = append(passedD, p), append(streamedD, s)
			ratios = append(ratios, float64(p)/float64(s))
		}
		b.ReportMetric(medianFloat(ratios), "passed-x-streamed")
		line := fmt.Sprintf("full push, descriptor passed vs bytes streamed: %.1f ms vs %.1f ms, ratio %.2f [median of %d alternating pairs; ratios %s]",
			ms(median(passedD)), ms(median(streamedD)), medianFloat(ratios), benchReps, fmtRatios(ratios))
		fmt.Println(line)
		b.Log(line)
	}
}
