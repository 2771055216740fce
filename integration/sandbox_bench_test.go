package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/sandbox"
)

// benchRuns is how many times each command runs per benchmark iteration,
// so that `make bench` (-benchtime 1x) still compares 20 runs of each.
const benchRuns = 20

// BenchmarkSandboxVsBwrap times `sandbox run -- /bin/true` against the raw
// bwrap command line with the same binds, namespaces, hardening flags and
// seccomp filter (as the same user), bwrap's own reaper as its pid 1. A
// third contender, the floor, is an empty Go program that only execs the
// same raw line: what a Go start alone adds, which no launcher in Go can go
// under. The three alternate, the turn order rotated every round so none
// always goes first, so all see the same machine; the machine is shared,
// so it compares medians, which a neighbour's burst moves less than a mean.
// The target is a ratio of at most 1.5. A fourth contender is sandbox run
// with the sandbox binary itself as pid 1 (no sandbox-init beside it), so
// that each run shows what the small pid 1 saves. It then prints where a
// start's time goes, step by step (startSteps).
func BenchmarkSandboxVsBwrap(b *testing.B) {
	e := newSandboxEnv(b)
	flags := e.flags("git.push.working")
	out, errOut, code := runSandbox(b, e.sandbox, append([]string{"explain", "--json"}, flags...)...)
	if code != 0 {
		b.Fatalf("explain: exit %d %s", code, errOut)
	}
	var plan struct {
		Binds []struct{ Kind, Source, Target string }
		User  struct {
			UID, GID uint32
			Groups   []uint32
			Drop     bool
			Dynamic  bool
		}
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		b.Fatal(err)
	}
	if plan.User.Dynamic {
		// run picks a uid of the session's own at launch; the raw line
		// runs as nobody, an unprivileged uid as good as any.
		plan.User.UID, plan.User.GID = 65534, 65534
	}
	filter, err := sandbox.Filter()
	if err != nil {
		b.Fatal(err)
	}
	raw := []string{"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net",
		"--disable-userns", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox", "--seccomp", "3"}
	for _, bind := range plan.Binds {
		if bind.Target == "/run/sandbox/init" {
			continue // the sandbox's own pid 1: part of what is measured, not of the raw line
		}
		switch bind.Kind {
		case "proc", "dev", "remount-ro":
			raw = append(raw, "--"+bind.Kind, bind.Target)
		default:
			raw = append(raw, "--"+bind.Kind, bind.Source, bind.Target)
		}
	}
	raw = append(raw, "--chdir", e.ws, "--", "/bin/true")
	sandboxArgs := append(append([]string{"run"}, flags...), "--", "/bin/true")
	floor := testdataBin(b, "bwrapfloor")
	selfInit := sandboxWithoutInit(b, e.sandbox)

	runSandboxOnce := func(sandbox string) time.Duration {
		cmd := exec.Command(sandbox, sandboxArgs...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("sandbox run: %v\n%s", err, out)
		}
		return time.Since(start)
	}
	// runRawOnce starts the raw line through launcher: bwrap itself, or the
	// floor, which hands its arguments on to bwrap.
	runRawOnce := func(launcher string) time.Duration {
		cmd := exec.Command(launcher, raw...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		if plan.User.Drop {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: plan.User.UID, Gid: plan.User.GID, Groups: plan.User.Groups}}
		}
		start := time.Now()
		// The filter goes through a pipe, as sandbox run hands it over.
		r, w, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		if _, err := w.Write(filter); err != nil {
			b.Fatal(err)
		}
		w.Close()
		cmd.ExtraFiles = []*os.File{r}
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", filepath.Base(launcher), err, out)
		}
		return time.Since(start)
	}
	// Warm the page cache for the binaries before timing.
	runSandboxOnce(e.sandbox)
	runSandboxOnce(selfInit)
	runRawOnce("/usr/bin/bwrap")
	runRawOnce(floor)
	var viaSandbox, viaSelfInit, viaBwrap, viaFloor []time.Duration
	contenders := []func(){
		func() { viaSandbox = append(viaSandbox, runSandboxOnce(e.sandbox)) },
		func() { viaBwrap = append(viaBwrap, runRawOnce("/usr/bin/bwrap")) },
		func() { viaFloor = append(viaFloor, runRawOnce(floor)) },
		func() { viaSelfInit = append(viaSelfInit, runSandboxOnce(selfInit)) },
	}
	home := e.run + "/home"
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := 0; j < benchRuns; j++ {
			for k := range contenders {
				contenders[(j+k)%len(contenders)]()
			}
		}
		if ents, _ := os.ReadDir(home); len(ents) > 0 {
			b.Fatalf("/bin/true left files in HOME")
		}
	}
	b.StopTimer()
	s, w, f, si := medianRun(viaSandbox), medianRun(viaBwrap), medianRun(viaFloor), medianRun(viaSelfInit)
	ratio, floorRatio, selfRatio := float64(s)/float64(w), float64(f)/float64(w), float64(si)/float64(w)
	b.ReportMetric(ms(s), "sandbox-ms")
	b.ReportMetric(ms(w), "bwrap-ms")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(ms(f), "floor-ms")
	b.ReportMetric(floorRatio, "floor-ratio")
	b.ReportMetric(ms(si), "self-init-ms")
	b.ReportMetric(selfRatio, "self-init-ratio")
	line := fmt.Sprintf("sandbox run /bin/true: %.1f ms, raw bwrap: %.1f ms, ratio %.2f (target <= 1.5); "+
		"an empty Go launcher exec'ing the same bwrap line: %.1f ms, ratio %.2f (the least any Go launcher costs here); "+
		"sandbox run with the sandbox binary as pid 1 (no sandbox-init): %.1f ms, ratio %.2f; medians of %d runs each",
		ms(s), ms(w), ratio, ms(f), floorRatio, ms(si), selfRatio, len(viaSandbox))
	fmt.Println(line)
	b.Log(line)
	if ratio > 1.5 {
		fmt.Printf("*** TARGET MISSED: sandbox run is %.2fx raw bwrap, over the 1.50x target; the floor, an empty Go launcher, is %.2fx ***\n",
			ratio, floorRatio)
	}
	startSteps(b, flags, benchRuns)
}

func medianRun(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// sandboxWithoutInit is the sandbox binary sandbox in a directory of its
// own (a hard link, so /proc/self/exe names that directory) with no
// sandbox-init beside it, so that run binds the sandbox binary as pid 1;
// the bushost client, if beside sandbox, is linked beside it too, so the
// bind table stays the same.
func sandboxWithoutInit(b *testing.B, sandbox string) string {
	b.Helper()
	dir, err := os.MkdirTemp("", "bushost-selfinit-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	self := filepath.Join(dir, "sandbox")
	if err := os.Link(sandbox, self); err != nil {
		b.Fatal(err)
	}
	client := filepath.Join(filepath.Dir(sandbox), "bushost")
	if _, err := os.Stat(client); err == nil {
		if err := os.Symlink(client, filepath.Join(dir, "bushost")); err != nil {
			b.Fatal(err)
		}
	}
	return self
}
