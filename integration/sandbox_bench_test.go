package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// BenchmarkSandboxVsBwrap times `sandbox run -- /bin/true` against the raw
// bwrap command line with the same binds, namespaces and hardening flags
// (as the same user), alternating the two in one loop so both see the same
// machine. It reports the ratio; the target is at most 1.3.
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
		}
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		b.Fatal(err)
	}
	raw := []string{"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net",
		"--disable-userns", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"}
	for _, bind := range plan.Binds {
		switch bind.Kind {
		case "proc", "dev", "remount-ro":
			raw = append(raw, "--"+bind.Kind, bind.Target)
		default:
			raw = append(raw, "--"+bind.Kind, bind.Source, bind.Target)
		}
	}
	raw = append(raw, "--chdir", e.ws, "--", "/bin/true")
	sandboxArgs := append(append([]string{"run"}, flags...), "--", "/bin/true")

	run := func(name string, args []string, drop bool) time.Duration {
		cmd := exec.Command(name, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"}
		if drop {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: plan.User.UID, Gid: plan.User.GID, Groups: plan.User.Groups}}
		}
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", name, err, out)
		}
		return time.Since(start)
	}
	// Warm the page cache for both binaries before timing.
	run(e.sandbox, sandboxArgs, false)
	run("/usr/bin/bwrap", raw, plan.User.Drop)
	home := e.run + "/home"
	var viaSandbox, viaBwrap time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		viaSandbox += run(e.sandbox, sandboxArgs, false)
		viaBwrap += run("/usr/bin/bwrap", raw, plan.User.Drop)
		if ents, _ := os.ReadDir(home); len(ents) > 0 {
			b.Fatalf("/bin/true left files in HOME")
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(viaSandbox.Nanoseconds())/float64(b.N), "sandbox-ns/op")
	b.ReportMetric(float64(viaBwrap.Nanoseconds())/float64(b.N), "bwrap-ns/op")
	b.ReportMetric(float64(viaSandbox)/float64(viaBwrap), "ratio")
}
