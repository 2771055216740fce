package container

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/bushost/bushost/internal/supervisor"
	"github.com/bushost/bushost/internal/testenv"
)

// composeFile is the part of deploy/container/compose.yaml the test reads.
type composeFile struct {
	Services map[string]struct {
		Build struct {
			Context    string `yaml:"context"`
			Dockerfile string `yaml:"dockerfile"`
		} `yaml:"build"`
		Image       string   `yaml:"image"`
		Ports       []string `yaml:"ports"`
		Volumes     []string `yaml:"volumes"`
		Healthcheck struct {
			Test        []string `yaml:"test"`
			Interval    string   `yaml:"interval"`
			Timeout     string   `yaml:"timeout"`
			StartPeriod string   `yaml:"start_period"`
			Retries     int      `yaml:"retries"`
		} `yaml:"healthcheck"`
		Ulimits map[string]struct {
			Soft int `yaml:"soft"`
			Hard int `yaml:"hard"`
		} `yaml:"ulimits"`
		PidsLimit   int      `yaml:"pids_limit"`
		MemLimit    string   `yaml:"mem_limit"`
		CPUs        float64  `yaml:"cpus"`
		CapDrop     []string `yaml:"cap_drop"`
		CapAdd      []string `yaml:"cap_add"`
		SecurityOpt []string `yaml:"security_opt"`
		Logging     struct {
			Driver  string            `yaml:"driver"`
			Options map[string]string `yaml:"options"`
		} `yaml:"logging"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

// withDefaults expands each ${VAR:-default} of a compose file to its
// default, as a compose tool does with VAR unset.
func withDefaults(s string) string {
	return os.Expand(s, func(v string) string {
		_, def, _ := strings.Cut(v, ":-")
		return def
	})
}

// composeEnv is this process's environment without the variables the
// compose file reads, plus set.
func composeEnv(set ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BUSHOST_") {
			env = append(env, kv)
		}
	}
	return append(env, set...)
}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// match returns the first submatch of re in s, or fails.
func match(t *testing.T, s, re, what string) []string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("%s: no match for %s", what, re)
	}
	return m
}

// The compose file runs the image `make container` builds, from the
// context it assembles, with the Dockerfile's ports and health check and
// the supervisor's workspace on a volume; podman-compose (when installed:
// scripts/deps.sh installs it) turns it into that podman run. Nothing is
// built or started: the image takes a debootstrap (TestSeedContainer).
func TestComposeFile(t *testing.T) {
	var c composeFile
	if err := yaml.Unmarshal([]byte(withDefaults(readFile(t, "deploy/container/compose.yaml"))), &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	if len(c.Services) != 1 {
		t.Fatalf("services %v, want one", c.Services)
	}
	svc, ok := c.Services["workspace"]
	if !ok {
		t.Fatal("no service workspace")
	}
	makefile := readFile(t, "Makefile")
	dockerfile := readFile(t, "deploy/container/Dockerfile")
	cfg, err := supervisor.LoadConfig(filepath.Join(repoRoot(), "deploy/container/supervisor.toml"))
	if err != nil {
		t.Fatal(err)
	}

	if image := match(t, makefile, `(?m)^IMAGE\s*\?=\s*(\S+)`, "Makefile")[1]; svc.Image != image {
		t.Errorf("image %q, make container builds %q", svc.Image, image)
	}
	ctx := match(t, makefile, `(?m)^CONTAINER_CTX\s*\?=\s*(\S+)`, "Makefile")[1]
	if got, want := filepath.Join(repoRoot(), "deploy/container", svc.Build.Context), filepath.Join(repoRoot(), ctx); got != want || svc.Build.Dockerfile != "Dockerfile" {
		t.Errorf("build context %s (%s), make container assembles %s", got, svc.Build.Dockerfile, want)
	}

	// Every port the Dockerfile exposes is published, on loopback only.
	exposed := strings.Fields(match(t, dockerfile, `(?m)^EXPOSE\s+(.+)$`, "Dockerfile")[1])
	_, healthPort, err := net.SplitHostPort(cfg.HealthAddr)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(exposed, healthPort) {
		t.Errorf("the Dockerfile exposes %v, not health_addr's port %s", exposed, healthPort)
	}
	for _, p := range exposed {
		if want := "127.0.0.1:" + p + ":" + p; !contains(svc.Ports, want) {
			t.Errorf("ports %v lack %s", svc.Ports, want)
		}
	}

	// The workspace and the supervisor's history (git_dir's parent, a
	// volume of its own) live on named volumes.
	named := func(target string) string {
		for _, v := range svc.Volumes {
			if name, at, ok := strings.Cut(v, ":"); ok && at == target {
				if _, declared := c.Volumes[name]; declared {
					return name
				}
			}
		}
		t.Errorf("volumes %v: no declared named volume on %s", svc.Volumes, target)
		return ""
	}
	vol, hist := named(cfg.Workspace), named(filepath.Dir(cfg.GitDir))

	// Bounds and hardening, as the documented run line has them.
	if svc.PidsLimit != 4096 || svc.MemLimit != "1g" || svc.CPUs != 1 || svc.Logging.Options["max-size"] != "10mb" {
		t.Errorf("bounds: pids %d, memory %q, cpus %v, log %v", svc.PidsLimit, svc.MemLimit, svc.CPUs, svc.Logging.Options)
	}
	if strings.Join(svc.CapDrop, ",") != "ALL" || strings.Join(svc.CapAdd, ",") != "CHOWN,DAC_OVERRIDE,FOWNER,FSETID,SETGID,SETUID,SETPCAP" || strings.Join(svc.SecurityOpt, ",") != "no-new-privileges" {
		t.Errorf("capabilities drop %v add %v, security_opt %v", svc.CapDrop, svc.CapAdd, svc.SecurityOpt)
	}
	if cfg.NotifyURL == "" || cfg.HealthSocket == "" {
		t.Errorf("supervisor.toml: notify_url %q (want a placeholder), health_socket %q", cfg.NotifyURL, cfg.HealthSocket)
	}
	ops := readFile(t, "docs/operations.md")
	for _, a := range append(hardened(200000), "-v ws-history:"+filepath.Dir(cfg.GitDir), "--pids-limit 4096 --uidmap 0:$BUSHOST_UID_BASE:65536") {
		if !strings.Contains(ops, a) {
			t.Errorf("docs/operations.md's run lines lack %q", a)
		}
	}

	// The health check is the image's: on health_socket, same timing.
	hc := match(t, dockerfile, `HEALTHCHECK --interval=(\S+) --timeout=(\S+) --start-period=(\S+) --retries=(\d+) \\\n\s+CMD (.+)`, "Dockerfile")
	h := svc.Healthcheck
	sock := "--unix-socket " + cfg.HealthSocket + " http://localhost/healthz"
	if !strings.Contains(hc[5], sock) || len(h.Test) != 2 || h.Test[0] != "CMD-SHELL" || h.Test[1] != hc[5] {
		t.Errorf("healthcheck test %q, the image's CMD %q (on %s)", h.Test, hc[5], sock)
	}
	if got, want := fmt.Sprint(h.Interval, h.Timeout, h.StartPeriod, h.Retries), fmt.Sprint(hc[1], hc[2], hc[3], hc[4]); got != want {
		t.Errorf("healthcheck timing %s, the image's %s", got, want)
	}
	for _, l := range []string{"nofile", "nproc"} {
		if u := svc.Ulimits[l]; u.Soft != 1024 || u.Hard != 1024 {
			t.Errorf("ulimit %s %+v, want 1024:1024 (the default exceeds this machine's hard limit)", l, u)
		}
	}

	if _, err := exec.LookPath("podman-compose"); err != nil {
		testenv.Missing(t, "podman-compose", "its translation of compose.yaml (scripts/deps.sh installs it)")
	}
	project := fmt.Sprintf("bhcompose%d", os.Getpid())
	// podman-compose 1.0.3's dry run still makes the volume and the
	// network: remove them.
	t.Cleanup(func() {
		exec.Command("podman", "volume", "rm", "-f", project+"_"+vol, project+"_"+hist).Run()
		exec.Command("podman", "network", "rm", "-f", project+"_default").Run()
	})
	cmd := exec.Command("podman-compose", "--dry-run", "--podman-args=--runtime runc --cgroup-manager=cgroupfs",
		"--podman-run-args="+runArgs(200000), "-p", project, "-f", "compose.yaml", "up", "-d", "--no-build")
	cmd.Dir = filepath.Join(repoRoot(), "deploy/container")
	cmd.Env = composeEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("podman-compose: %v\n%s", err, out)
	}
	run := match(t, string(out), `(?m)^podman run .*$`, "podman-compose's dry run")[0]
	for _, want := range []string{
		"--runtime runc --cgroup-manager=cgroupfs",
		"-v " + project + "_" + vol + ":" + cfg.Workspace,
		"-v " + project + "_" + hist + ":" + filepath.Dir(cfg.GitDir),
		"-p 127.0.0.1:3000:3000", "-p 127.0.0.1:3002:3002",
		"--ulimit nofile=1024:1024", "--ulimit nproc=1024:1024",
		"--cpus 1.0", "-m 1g", "--log-driver=k8s-file", "--log-opt=max-size=10mb",
		"--cap-drop ALL", "--cap-add CHOWN", "--cap-add SETPCAP", "--security-opt no-new-privileges",
		runArgs(200000),
		"--healthcheck-command /bin/sh -c '" + hc[5] + "'", "--healthcheck-retries " + hc[4],
		"--restart unless-stopped",
	} {
		if !strings.Contains(run, want) {
			t.Errorf("podman-compose runs\n%s\nwithout %q", run, want)
		}
	}
	if !strings.HasSuffix(run, " "+svc.Image) {
		t.Errorf("podman-compose runs\n%s\nnot the image %s", run, svc.Image)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runArgs are what podman-compose 1.0.3 cannot read from compose.yaml:
// the pids limit and the container's own uid range (compose.yaml's
// header).
func runArgs(uidBase int) string {
	return fmt.Sprintf("--pids-limit 4096 --uidmap 0:%d:65536 --gidmap 0:%d:65536", uidBase, uidBase)
}

// compose.yaml runs: podman-compose starts the seed's image with its
// ports published where BUSHOST_WEB_ADDR and BUSHOST_HEALTH_ADDR say and
// every bound applied; the health check turns healthy, the website
// answers and the supervisor's /metrics shows it running. `down` then `up`
// with the same volumes keeps the supervisor's history: the agent's edits
// are still there, and the good commit did not move to what the agent
// planted last. Everything it made goes with `down -v`.
func TestComposeUp(t *testing.T) {
	image := seedImage(t, "compose up", "podman-compose")
	project := strings.ReplaceAll(uniqueName(), "-", "")
	web, health := freeAddr(t), freeAddr(t)
	base := uidBase()
	compose := func(args ...string) (string, error) {
		cmd := exec.Command("podman-compose", append([]string{"--podman-args=" + strings.Join(podmanArgs, " "),
			"--podman-run-args=" + runArgs(base), "-p", project, "-f", "compose.yaml"}, args...)...)
		cmd.Dir = filepath.Join(repoRoot(), "deploy/container")
		cmd.Env = composeEnv("BUSHOST_IMAGE="+image, "BUSHOST_WEB_ADDR="+web, "BUSHOST_HEALTH_ADDR="+health)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	container := project + "_workspace_1"
	t.Cleanup(func() {
		compose("down", "-v", "-t", "5")
		podman(t, "rm", "-f", "-t", "5", container)
		podman(t, "volume", "rm", "-f", project+"_workspace", project+"_history")
		podman(t, "network", "rm", "-f", project+"_default")
	})
	if out, err := compose("up", "-d", "--no-build"); err != nil {
		t.Fatalf("podman-compose up: %v\n%s", err, out)
	}
	b := &seedBox{t: t, image: image, name: container, uidBase: base}
	get := func(addr, path string) (string, error) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return string(body), fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return string(body), err
	}
	b.waitFor("healthy", 90*time.Second, b.healthy)
	if body, err := get(web, "/"); err != nil || !strings.Contains(body, "hello") {
		t.Errorf("the website on %s: %v %q", web, err, body)
	}
	body, err := get(health, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`bushost_supervisor_service_state{service="website",state="running"} 1`,
		`bushost_supervisor_halted 0`,
		`bushost_build_info{`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics on %s lacks %q", health, want)
		}
	}
	// Every bound applies, those podman-compose reads from the file and
	// those it takes from --podman-run-args.
	inspect, _ := podman(t, "inspect", container, "--format", "{{.HostConfig.PidsLimit}} {{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.LogConfig.Size}} {{.HostConfig.SecurityOpt}} {{.HostConfig.CapDrop}}")
	if !strings.HasPrefix(inspect, "4096 1073741824 1000000000 10MB [no-new-privileges]") || strings.Contains(inspect, "CAP_CHOWN") || !strings.Contains(inspect, "CAP_NET_RAW") {
		t.Errorf("bounds %q, want pids 4096, 1 GiB, 1 CPU, a 10 MB log, no new privileges, capabilities dropped", inspect)
	}
	if m := b.asRoot("cat /proc/self/uid_map"); !strings.Contains(strings.Join(strings.Fields(m), " "), fmt.Sprintf("0 %d 65536", base)) {
		t.Errorf("uid map %q, want the container's own range at %d", m, base)
	}

	// The agent's edit, good; then an implant that keeps the website from
	// answering (without crashing it), so that it never becomes good.
	first := b.good()
	b.asAgent(`sed -i 's/website starting/website v2 starting/' /workspace/src/website/serve.sh`)
	b.waitFor("the edit committed", 60*time.Second, func() bool { return b.status().Head != first })
	edit := b.good()
	b.asAgent(`printf '#!/bin/bash\necho implant\nexec sleep 100000\n' > /workspace/src/website/serve.sh`)
	b.waitFor("the implant recorded", 30*time.Second, func() bool { return b.status().Head != edit })
	if out, err := compose("down", "-t", "5"); err != nil {
		t.Fatalf("podman-compose down: %v\n%s", err, out)
	}
	if _, err := podman(t, "container", "exists", container); err == nil {
		t.Error("down left the container")
	}
	if out, err := compose("up", "-d", "--no-build"); err != nil {
		t.Fatalf("podman-compose up again: %v\n%s", err, out)
	}
	// What the supervisor started with (its log says, before good_after
	// could move anything): the history kept, the good commit as before.
	var started []string
	b.waitFor("the supervisor back", 60*time.Second, func() bool {
		started = regexp.MustCompile(`msg="supervisor started" .* head=(\w+) good=(\w+)`).FindStringSubmatch(b.logs())
		return started != nil
	})
	implant := b.asRoot("git --git-dir=/var/lib/bushost-supervisor/git rev-parse " + started[1])
	if parents := b.asRoot("git --git-dir=/var/lib/bushost-supervisor/git log -1 --format=%an:%P " + implant); parents != "agent:"+edit {
		t.Errorf("after down and up HEAD %s (%s), want the implant recorded by the agent on top of %s: the history kept", implant, parents, edit)
	}
	if !strings.HasPrefix(edit, started[2]) {
		t.Errorf("after down and up the supervisor started with good %s, want %s (as before, not the implant)", started[2], edit)
	}
	if st := b.status(); st.AwaitingAck != "" {
		t.Errorf("awaiting_ack %q after down and up: the history was there", st.AwaitingAck)
	}
	root := b.asRoot("git --git-dir=/var/lib/bushost-supervisor/git rev-list --max-parents=0 HEAD")
	if serve := b.asRoot("git --git-dir=/var/lib/bushost-supervisor/git show " + root + ":src/website/serve.sh"); strings.Contains(serve, "implant") {
		t.Errorf("the first commit %s holds the implant:\n%s", root, serve)
	}
	gitLog := b.asRoot("git --git-dir=/var/lib/bushost-supervisor/git log --format=%H HEAD")
	for _, c := range []string{first, edit, implant} {
		if !strings.Contains(gitLog, c) {
			t.Errorf("the history after down and up lacks %s:\n%s", c, gitLog)
		}
	}
	if strings.Contains(b.logs(), "HISTORY MISSING") {
		t.Error("the supervisor found no history after down and up")
	}

	if out, err := compose("down", "-v", "-t", "5"); err != nil {
		t.Fatalf("podman-compose down: %v\n%s", err, out)
	}
	if _, err := podman(t, "volume", "exists", project+"_history"); err == nil {
		t.Error("down -v left the history volume")
	}
}

// freeAddr is a loopback address with a port nothing listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
