// Package container tests the seed's container (deploy/container) on its
// own, so that `go test ./...` runs it beside the integration package: its
// debootstrap base takes minutes of mostly waiting.
package container

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/supervisor"
	"github.com/bushost/bushost/internal/testenv"
)

// podman as this machine runs it: runc (crun refuses hybrid cgroups),
// cgroupfs (no systemd as pid 1).
var podmanArgs = []string{"--runtime", "runc", "--cgroup-manager=cgroupfs"}

func podman(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("podman", append(append([]string{}, podmanArgs...), args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// hardened is the documented run line's bounds and hardening
// (docs/operations.md, and compose.yaml with --podman-run-args): a
// container of its own uid range (uidBase, a multiple of 65536), process,
// memory, CPU and log bounds, a small capability set, no new privileges.
func hardened(uidBase int) []string {
	return []string{
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
		"--pids-limit", "4096", "--memory", "1g", "--cpus", "1", "--log-opt", "max-size=10mb",
		"--cap-drop", "ALL", "--cap-add", "CHOWN,DAC_OVERRIDE,FOWNER,FSETID,SETGID,SETUID,SETPCAP",
		"--security-opt", "no-new-privileges",
		"--uidmap", fmt.Sprintf("0:%d:65536", uidBase), "--gidmap", fmt.Sprintf("0:%d:65536", uidBase),
	}
}

// uidBase picks a uid range no other test container uses: the container's
// ids are host ids uidBase..uidBase+65535, shared with nobody, and nothing
// in /etc/subuid is needed (podman runs as root here).
func uidBase() int {
	var b [2]byte
	rand.Read(b[:])
	return 1<<28 + int(binary.BigEndian.Uint16(b[:])&0x0fff)*65536
}

// seedBox is one seed container of a test, on volumes of its own.
type seedBox struct {
	t       *testing.T
	image   string
	name    string
	uidBase int
}

// startSeed runs the seed's image as the documented run line does, with
// its workspace and history on volumes of its own, and removes the
// container and the volumes when the test ends.
func startSeed(t *testing.T, what string, tools ...string) *seedBox {
	t.Helper()
	b := &seedBox{t: t, image: seedImage(t, what, tools...), name: uniqueName(), uidBase: uidBase()}
	t.Cleanup(func() {
		podman(t, "rm", "-f", "-t", "5", b.name)
		podman(t, "volume", "rm", "-f", b.name+"-ws", b.name+"-history")
	})
	args := append([]string{"run", "-d", "--name", b.name, "--network", "none"}, hardened(b.uidBase)...)
	args = append(args, "-v", b.name+"-ws:/workspace", "-v", b.name+"-history:/var/lib/bushost-supervisor", b.image)
	if out, err := podman(t, args...); err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	return b
}

func (b *seedBox) logs() string { l, _ := podman(b.t, "logs", b.name); return l }

func (b *seedBox) waitFor(what string, d time.Duration, ok func() bool) {
	b.t.Helper()
	if !testenv.Poll(d, ok) {
		b.t.Fatalf("%s: not within %v; container log:\n%s", what, d, tail(b.logs(), 4000))
	}
}

func (b *seedBox) status() supervisor.Status {
	b.t.Helper()
	var st supervisor.Status
	out, err := podman(b.t, "exec", b.name, "curl", "-fsS", "--unix-socket", "/run/bushost-supervisor/health.sock", "http://localhost/status")
	if err == nil {
		json.Unmarshal([]byte(out), &st)
	}
	return st
}

// healthy is what the container runtime would see: `podman healthcheck
// run` exits 0 (without systemd podman runs no check by itself).
func (b *seedBox) healthy() bool {
	_, err := podman(b.t, "healthcheck", "run", b.name)
	return err == nil
}

func (b *seedBox) asAgent(script string) string {
	b.t.Helper()
	out, err := podman(b.t, "exec", "--user", "agent", b.name, "bash", "-c", script)
	if err != nil {
		b.t.Fatalf("agent: %s: %v\n%s", script, err, out)
	}
	return out
}

func (b *seedBox) asRoot(script string) string {
	b.t.Helper()
	out, err := podman(b.t, "exec", b.name, "bash", "-c", script)
	if err != nil {
		b.t.Fatalf("root: %s: %v\n%s", script, err, out)
	}
	return out
}

// good waits for a good commit equal to HEAD and returns it.
func (b *seedBox) good() string {
	b.t.Helper()
	var good string
	b.waitFor("a good commit at HEAD", 60*time.Second, func() bool { st := b.status(); good = st.Good; return good != "" && good == st.Head })
	return good
}

// exactlyGood fails unless the watched tree holds exactly good's files.
func (b *seedBox) exactlyGood(good string) {
	b.t.Helper()
	want := b.asRoot("git --git-dir=/var/lib/bushost-supervisor/git ls-tree -r --name-only " + good + " -- src | sort")
	got := b.asRoot("cd /workspace && find src -type f -o -type l | sort")
	if got != want {
		b.t.Errorf("the watched tree holds\n%s\nwant exactly the good commit's\n%s", got, want)
	}
}

// The seed's container (deploy/container): built with podman from a Debian
// base made with debootstrap and run as documented, it turns healthy,
// commits an agent's edit, and reverts an edit that makes the website
// crash in a loop. No program in it is setuid, and every bound of the run
// line applies.
func TestSeedContainer(t *testing.T) {
	b := startSeed(t, "the seed's container")
	b.waitFor("healthy", 60*time.Second, b.healthy)
	first := b.good()

	b.asAgent(`sed -i 's/website starting/website v2 starting/' /workspace/src/website/serve.sh`)
	var edit string
	b.waitFor("the agent's edit committed", 30*time.Second, func() bool { edit = b.status().Head; return edit != "" && edit != first })
	b.waitFor("the edit good", 30*time.Second, func() bool { return b.status().Good == edit })

	b.asAgent(`printf '#!/bin/bash\necho broken\nexit 1\n' > /workspace/src/website/serve.sh`)
	var st supervisor.Status
	b.waitFor("the crash loop reverted", 60*time.Second, func() bool { st = b.status(); return len(st.Reverts) > 0 })
	if rev := st.Reverts[0]; rev.Error != "" || rev.To != edit || rev.Service != "website" {
		t.Fatalf("revert %+v, want one to %s", rev, edit)
	}
	b.waitFor("healthy after the revert", 60*time.Second, b.healthy)
	if out := b.asRoot("cat /workspace/src/website/serve.sh"); !strings.Contains(out, "website v2 starting") {
		t.Fatalf("serve.sh after the revert:\n%s", out)
	}

	if out := b.asRoot("find / -xdev -type f -perm /6000"); out != "" {
		t.Errorf("setuid or setgid programs in the image:\n%s", out)
	}
	if caps := b.asAgent("grep -E '^Cap(Eff|Bnd)' /proc/self/status"); !strings.Contains(caps, "CapEff:\t0000000000000000") || !strings.Contains(caps, "CapBnd:\t00000000000001db") {
		t.Errorf("the agent's exec session has capabilities:\n%s", caps)
	}
	if nnp := b.asAgent("grep NoNewPrivs /proc/self/status"); !strings.Contains(nnp, "1") {
		t.Errorf("the agent's exec session may gain privileges: %s", nnp)
	}
	inspect, _ := podman(t, "inspect", b.name, "--format", "{{.HostConfig.PidsLimit}} {{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.LogConfig.Size}}")
	if inspect != "4096 1073741824 1000000000 10MB" {
		t.Errorf("bounds %q, want pids 4096, 1 GiB, 1 CPU, a 10 MB log", inspect)
	}
	if m := b.asRoot("cat /proc/self/uid_map"); !strings.Contains(strings.Join(strings.Fields(m), " "), fmt.Sprintf("0 %d 65536", b.uidBase)) {
		t.Errorf("uid map %q, want the container's own range at %d", m, b.uidBase)
	}
}

// TestMain removes the image seedImage built, and the base if this run
// made it.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.image != "" {
		exec.Command("podman", append(append([]string{}, podmanArgs...), "rmi", "-f", built.image)...).Run()
	}
	if built.madeBase {
		exec.Command("podman", append(append([]string{}, podmanArgs...), "rmi", "-f", baseImage)...).Run()
	}
	if built.tmp != "" {
		os.RemoveAll(built.tmp)
	}
	os.Exit(code)
}

const baseImage = "localhost/bushost-debian:12"

// built is the seed's image, made once per run of this package: its
// Debian base takes minutes.
var built struct {
	once     sync.Once
	image    string
	madeBase bool
	tmp      string
	err      error
}

// seedImage returns the seed's image, built by `make container` under a
// name of its own, or skips what (the test's subject) needs root and
// podman, runc, debootstrap, make and the extra tools; under CI=true it
// fails instead.
func seedImage(t *testing.T, what string, tools ...string) string {
	t.Helper()
	testenv.NeedRoot(t, what+" (podman, users)")
	for _, tool := range append([]string{"podman", "runc", "debootstrap", "make"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, tool, "%s (scripts/deps.sh installs it)", what)
		}
	}
	built.once.Do(func() {
		_, err := podman(t, "image", "exists", baseImage)
		built.madeBase = err != nil
		image := "localhost/" + uniqueName() + ":latest"
		if built.tmp, built.err = os.MkdirTemp("/var/tmp", "bh-container-"); built.err != nil {
			return
		}
		cmd := exec.Command("make", "-s", "container", "BIN="+built.tmp+"/bin", "CONTAINER_CTX="+built.tmp+"/ctx", "IMAGE="+image)
		cmd.Dir = repoRoot()
		out, err := cmd.CombinedOutput()
		built.image = image
		if err != nil {
			built.err = fmt.Errorf("make container: %v\n%s", err, out)
			return
		}
		if got, err := podman(t, "image", "inspect", "--format", "{{.HealthCheck.Test}}", image); err != nil || !strings.Contains(got, "/healthz") {
			built.err = fmt.Errorf("the image keeps no HEALTHCHECK on /healthz: %q %v", got, err)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.image
}

// uniqueName names a container, project or image of one test.
func uniqueName() string {
	suffix := make([]byte, 4)
	rand.Read(suffix)
	return "bushost-test-" + hex.EncodeToString(suffix)
}

// repoRoot is the repository's top, two levels above this file.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}
