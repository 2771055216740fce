// Package container tests the seed's container (deploy/container) on its
// own, so that `go test ./...` runs it beside the integration package: its
// debootstrap base takes minutes of mostly waiting.
package container

import (
	"crypto/rand"
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
)

// podman as this machine runs it: runc (crun refuses hybrid cgroups),
// cgroupfs (no systemd as pid 1).
var podmanArgs = []string{"--runtime", "runc", "--cgroup-manager=cgroupfs"}

func podman(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("podman", append(append([]string{}, podmanArgs...), args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// The seed's container (deploy/container): built with podman from a Debian
// base made with debootstrap, it turns healthy, commits an agent's edit,
// and reverts an edit that makes the website crash in a loop.
func TestSeedContainer(t *testing.T) {
	image := seedImage(t, "the seed's container")
	name := uniqueName()
	t.Cleanup(func() { podman(t, "rm", "-f", "-t", "5", name) })

	if out, err := podman(t, "run", "-d", "--name", name, "--network", "none",
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", image); err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	logs := func() string { l, _ := podman(t, "logs", name); return l }
	waitFor := func(what string, d time.Duration, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v; container log:\n%s", what, d, tail(logs(), 4000))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	status := func() supervisor.Status {
		t.Helper()
		var st supervisor.Status
		out, err := podman(t, "exec", name, "curl", "-fsS", "http://127.0.0.1:3002/status")
		if err == nil {
			json.Unmarshal([]byte(out), &st)
		}
		return st
	}
	healthy := func() bool { _, err := podman(t, "healthcheck", "run", name); return err == nil }
	asAgent := func(script string) {
		t.Helper()
		if out, err := podman(t, "exec", "--user", "agent", name, "bash", "-c", script); err != nil {
			t.Fatalf("agent: %s: %v\n%s", script, err, out)
		}
	}

	waitFor("healthy", 60*time.Second, healthy)
	var first string
	waitFor("first good commit", 30*time.Second, func() bool { st := status(); first = st.Head; return st.Good != "" && st.Good == st.Head })

	asAgent(`sed -i 's/website starting/website v2 starting/' /workspace/src/website/serve.sh`)
	var edit string
	waitFor("the agent's edit committed", 30*time.Second, func() bool { edit = status().Head; return edit != "" && edit != first })
	waitFor("the edit good", 30*time.Second, func() bool { return status().Good == edit })

	asAgent(`printf '#!/bin/bash\necho broken\nexit 1\n' > /workspace/src/website/serve.sh`)
	var st supervisor.Status
	waitFor("the crash loop reverted", 60*time.Second, func() bool { st = status(); return len(st.Reverts) > 0 })
	if rev := st.Reverts[0]; rev.Error != "" || rev.To != edit || rev.Service != "website" {
		t.Fatalf("revert %+v, want one to %s", rev, edit)
	}
	waitFor("healthy after the revert", 60*time.Second, healthy)
	if out, err := podman(t, "exec", name, "cat", "/workspace/src/website/serve.sh"); err != nil || !strings.Contains(out, "website v2 starting") {
		t.Fatalf("serve.sh after the revert: %v\n%s", err, out)
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
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s needs root (podman, users)", what)
		}
		t.Skipf("*** %s needs root: NOT TESTED ***", what)
	}
	for _, tool := range append([]string{"podman", "runc", "debootstrap", "make"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is missing: scripts/deps.sh installs it", tool)
			}
			t.Skipf("*** %s is missing (scripts/deps.sh installs it): %s NOT TESTED ***", tool, what)
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
