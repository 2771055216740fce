package integration

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/bushost/bushost/internal/testenv"
)

// makeInstall runs make install with args (BIN in a directory of the
// test's: the binaries are built fresh, without -race).
func makeInstall(t *testing.T, build string, args ...string) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is missing: scripts/deps.sh installs it")
	}
	cmd := exec.Command("make", append([]string{"-s", "install", "BIN=" + build}, args...)...)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make install %v: %v\n%s", args, err, out)
	}
}

// make install lays out the binaries, the units (with the binaries' path
// written in), the sysusers entry, the docs with the supervisor's
// reference, its example configuration and seed, and (where absent) the
// supervisor unit's configuration and seed under DESTDIR; installed where
// the units' paths are real, systemd-analyze verify finds nothing wrong in
// them.
func TestMakeInstallAndVerifyUnits(t *testing.T) {
	build := filepath.Join(baseDir(t), "build")
	dest := baseDir(t)
	install := func(args ...string) {
		t.Helper()
		makeInstall(t, build, args...)
	}
	install("DESTDIR=" + dest)
	for _, f := range []string{"usr/local/bin/bushostd", "usr/local/bin/bushost", "usr/local/bin/sandbox", "usr/local/bin/supervisor"} {
		fi, err := os.Stat(filepath.Join(dest, f))
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	for _, f := range []string{"usr/local/lib/sysusers.d/bushost.conf", "usr/local/share/doc/bushost/operations.md", "usr/local/share/doc/bushost/README.md"} {
		if _, err := os.Stat(filepath.Join(dest, f)); err != nil {
			t.Fatal(err)
		}
	}
	units := []string{"bushostd.service", "bushostd.socket", "supervisor.service", "sandbox-serve.service"}
	for _, u := range units {
		b, err := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system", u))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "@BINDIR@") || strings.Contains(string(b), "@DOCDIR@") {
			t.Fatalf("%s keeps a placeholder:\n%s", u, b)
		}
	}
	checkSupervisorInstall(t, dest)
	// A second install refreshes the examples, never the configuration an
	// operator edited.
	edited := filepath.Join(dest, "etc/bushost/supervisor.toml")
	if err := os.WriteFile(edited, []byte("# the operator's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	install("DESTDIR=" + dest)
	if b, _ := os.ReadFile(edited); string(b) != "# the operator's\n" {
		t.Fatalf("make install replaced an edited %s:\n%s", edited, b)
	}
	svc, _ := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system/bushostd.service"))
	for _, want := range []string{"ExecStart=/usr/local/bin/bushostd serve --home /var/lib/bushost --socket-group bushost",
		"ProtectSystem=strict", "ReadWritePaths=/var/lib/bushost", "NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectHome=yes", "User=bushost"} {
		if !strings.Contains(string(svc), want) {
			t.Fatalf("bushostd.service lacks %q", want)
		}
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is missing: scripts/deps.sh installs the systemd package")
	}
	// Under DESTDIR the units name /usr/local/bin/..., which is not there
	// (verify would say so): install again with PREFIX (and SYSCONFDIR)
	// inside a temp dir, so that the binaries sit where the units expect
	// them.
	prefix := filepath.Join(baseDir(t), "usr")
	install("PREFIX="+prefix, "SYSCONFDIR="+filepath.Join(filepath.Dir(prefix), "etc"))
	var paths []string
	for _, u := range units {
		paths = append(paths, filepath.Join(prefix, "lib/systemd/system", u))
	}
	out, err := exec.Command(analyze, append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// checkSupervisorInstall checks what make install DESTDIR=dest laid out
// for the supervisor: the reference and the example beside the docs, and
// the configuration and seed at the paths supervisor.service names, which
// the installed supervisor --help points at.
func checkSupervisorInstall(t *testing.T, dest string) {
	t.Helper()
	docdir := filepath.Join(dest, "usr/local/share/doc/bushost")
	ref, err := os.ReadFile(filepath.Join(docdir, "supervisor.md"))
	src, _ := os.ReadFile(filepath.Join(repoRoot, "internal/supervisor/README.md"))
	if err != nil || string(ref) != string(src) {
		t.Fatalf("the supervisor's reference is not installed as supervisor.md: %v", err)
	}
	for _, f := range []string{"examples/supervisor.toml", "examples/seed/src/website/serve.sh", "examples/seed/infra/AGENTS.md"} {
		if _, err := os.Stat(filepath.Join(docdir, f)); err != nil {
			t.Fatal(err)
		}
	}
	unit, err := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system/supervisor.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ExecStart=(\S+) init --config (\S+) --seed (\S+)$`).FindStringSubmatch(string(unit))
	if m == nil {
		t.Fatalf("supervisor.service has no ExecStart of init --config --seed:\n%s", unit)
	}
	for _, p := range m[1:] {
		if _, err := os.Stat(filepath.Join(dest, p)); err != nil {
			t.Fatalf("supervisor.service names %s, which make install did not put there: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dest, m[3], "src/website/serve.sh")); err != nil {
		t.Fatalf("the unit's seed is not the example's: %v", err)
	}
	out, errs, code := runBin(t, filepath.Join(dest, m[1]), nil, "--help")
	if code != 0 || !strings.Contains(out, filepath.Join(docdir, "supervisor.md")) || !strings.Contains(out, filepath.Join(docdir, "examples", "supervisor.toml")) {
		t.Fatalf("the installed supervisor --help does not point at the installed reference %s: exit %d\n%s%s", docdir, code, out, errs)
	}
}

// The installed example starts: make install DESTDIR=..., then the edit
// docs/operations.md documents (here: the workspace and the supervisor's
// state in the test's directory, and, for this test alone, users and
// ports of its own), then supervisor.service's command line as written in
// the unit, under DESTDIR. The example's service answers, and /healthz
// says 200.
func TestInstalledSupervisorExampleStarts(t *testing.T) {
	testenv.NeedRoot(t, "supervisor init makes users and hands the workspace over")
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3", "the installed example's service is python3's http.server")
	}
	base := baseDir(t)
	dest := filepath.Join(base, "dest")
	makeInstall(t, filepath.Join(base, "build"), "DESTDIR="+dest)
	tmp := filepath.Join(base, "tmp")
	if err := os.Mkdir(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}

	// The documented edit.
	config := filepath.Join(dest, "etc/bushost/supervisor.toml")
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	app, agent, svc := uniqueUsers(t)
	web, health := freePort(t), freePort(t)
	edit := strings.NewReplacer(
		`workspace = "/srv/bushost/workspace"`, fmt.Sprintf("workspace = %q", filepath.Join(base, "workspace")),
		`git_dir = "/var/lib/bushost-supervisor/git"`, fmt.Sprintf("git_dir = %q\napp_user = %q\nagent_user = %q\nservices_user = %q",
			filepath.Join(base, "state", "git"), app, agent, svc),
		`health_addr = "127.0.0.1:3002"`, fmt.Sprintf("health_addr = \"127.0.0.1:%d\"", health),
		`"PORT=3000"`, fmt.Sprintf(`"PORT=%d"`, web),
		`"http://127.0.0.1:3000/"`, fmt.Sprintf(`"http://127.0.0.1:%d/"`, web),
	)
	edited := edit.Replace(string(b))
	for _, was := range []string{`"/srv/bushost/workspace"`, `"/var/lib/bushost-supervisor/git"`, `"127.0.0.1:3002"`, `"PORT=3000"`, `"http://127.0.0.1:3000/"`} {
		if strings.Contains(edited, was) {
			t.Fatalf("the example changed: the edit left %s in\n%s", was, edited)
		}
	}
	if err := os.WriteFile(config, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}

	unit, err := os.ReadFile(filepath.Join(dest, "usr/local/lib/systemd/system/supervisor.service"))
	if err != nil {
		t.Fatal(err)
	}
	exec_ := regexp.MustCompile(`(?m)^ExecStart=(.*)$`).FindStringSubmatch(string(unit))
	argv := strings.Fields(exec_[1])
	for i, a := range argv {
		if strings.HasPrefix(a, "/") {
			argv[i] = filepath.Join(dest, a)
		}
	}
	out := &syncBuf{}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("supervisor output:\n%s", out.String())
		}
	})
	get := func(url string) int {
		select {
		case <-exited:
			t.Fatalf("the supervisor exited:\n%s", out.String())
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testenv.WaitFor(t, time.Minute, "the example's /healthz answering 200", func() bool {
		return get(fmt.Sprintf("http://127.0.0.1:%d/healthz", health)) == 200
	})
	if code := get(fmt.Sprintf("http://127.0.0.1:%d/", web)); code != 200 {
		t.Fatalf("the example's website answers %d", code)
	}
}

// With sockets passed through LISTEN_FDS (as bushostd.socket does), the
// daemon serves on them rather than making its own, tells them apart by
// path whatever their order, and refuses a socket bound anywhere else.
func TestSocketActivation(t *testing.T) {
	home := filepath.Join(baseDir(t), "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	bind := func(path string) *os.File {
		t.Helper()
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ul := l.(*net.UnixListener)
		ul.SetUnlinkOnClose(false)
		f, err := ul.File()
		if err != nil {
			t.Fatal(err)
		}
		ul.Close()
		t.Cleanup(func() { f.Close() })
		return f
	}
	inode := func(path string) uint64 {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	start := func(files ...*os.File) (*exec.Cmd, string, chan error) {
		t.Helper()
		log := filepath.Join(filepath.Dir(home), "d.log")
		lf, err := os.Create(log)
		if err != nil {
			t.Fatal(err)
		}
		defer lf.Close()
		// LISTEN_PID must be the daemon's pid: the shell sets it to its own
		// and execs the daemon, as systemd does after its fork.
		cmd := exec.Command("/bin/sh", "-c", `export LISTEN_PID=$$ LISTEN_FDS=`+strconv.Itoa(len(files))+`; exec "$0" serve --home "$1"`, bin(t, "bushostd"), home)
		cmd.ExtraFiles = files
		cmd.Stdout, cmd.Stderr = lf, lf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
			}
		})
		return cmd, log, exited
	}

	// A socket bound outside the home is refused, and the daemon exits.
	stray := bind(filepath.Join(filepath.Dir(home), "stray.sock"))
	_, log, exited := start(stray)
	select {
	case err := <-exited:
		b, _ := os.ReadFile(log)
		if err == nil || !strings.Contains(string(b), "stray.sock") {
			t.Fatalf("daemon given a stray socket: exit %v, log:\n%s", err, b)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("daemon given a stray socket kept running")
	}

	// Passed in the other order than the daemon would make them.
	brokerF := bind(filepath.Join(home, "broker.sock"))
	gitF := bind(filepath.Join(home, "git.sock"))
	gitIno, brokerIno := inode(filepath.Join(home, "git.sock")), inode(filepath.Join(home, "broker.sock"))
	cmd, log, exited := start(brokerF, gitF)
	for sock, svc := range map[string]string{"git.sock": "bushost.git.v1.GitService", "broker.sock": "bushost.broker.v1.BrokerService"} {
		conn := dialPlain(t, home, sock)
		if st := healthOf(t, conn, svc); st != healthpb.HealthCheckResponse_SERVING {
			b, _ := os.ReadFile(log)
			t.Fatalf("%s: %s is %v\n%s", sock, svc, st, b)
		}
	}
	if inode(filepath.Join(home, "git.sock")) != gitIno || inode(filepath.Join(home, "broker.sock")) != brokerIno {
		t.Fatal("the daemon replaced the sockets it was given")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		b, _ := os.ReadFile(log)
		t.Fatalf("socket-activated daemon did not exit 0 on SIGTERM: %v\n%s", err, b)
	}
	exited <- nil
	// The service manager owns the socket files: they stay after a stop.
	if inode(filepath.Join(home, "git.sock")) != gitIno {
		t.Fatal("the daemon removed an inherited socket file")
	}
}

// make run needs only what running needs: its packages are git and
// bubblewrap (and the toolchain's), never the container's or the tests';
// make container adds the container tools, make test and .ci/run the
// tests' too.
func TestMakeDepsBySet(t *testing.T) {
	list := func(set string) []string {
		t.Helper()
		out, errs, code := runBin(t, filepath.Join(repoRoot, "scripts/deps.sh"), nil, "--list", set)
		if code != 0 {
			t.Fatalf("deps.sh --list %s: exit %d: %s", set, code, errs)
		}
		return strings.Fields(out)
	}
	has := func(set []string, pkgs ...string) bool {
		for _, p := range pkgs {
			found := false
			for _, s := range set {
				found = found || s == p
			}
			if !found {
				return false
			}
		}
		return true
	}
	run, container, test := list("run"), list("container"), list("test")
	if !has(run, "git", "bubblewrap") {
		t.Fatalf("make run's packages lack git or bubblewrap: %v", run)
	}
	for _, p := range []string{"podman", "runc", "debootstrap", "podman-compose", "iptables", "postgresql", "curl", "python3", "systemd"} {
		if has(run, p) {
			t.Errorf("make run installs %s: %v", p, run)
		}
	}
	if !has(container, append(run, "podman", "runc", "debootstrap")...) || has(container, "postgresql") {
		t.Errorf("make container's packages: %v", container)
	}
	if !has(test, append(container, "postgresql", "curl", "python3", "podman-compose", "systemd", "gcc")...) {
		t.Errorf("make test's packages: %v", test)
	}
	if _, errs, code := runBin(t, filepath.Join(repoRoot, "scripts/deps.sh"), nil, "--list", "everything"); code != 2 || !strings.Contains(errs, "want run, container or test") {
		t.Errorf("deps.sh of an unknown set: exit %d: %s", code, errs)
	}
	for target, want := range map[string]string{"run": "scripts/deps.sh run", "container": "scripts/deps.sh container", "test": "scripts/deps.sh test"} {
		cmd := exec.Command("make", "-n", target)
		cmd.Dir = repoRoot
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), want+"\n") {
			t.Errorf("make -n %s: %v; want %q in\n%s", target, err, want, out)
		}
	}
	ci, err := os.ReadFile(filepath.Join(repoRoot, ".ci/run"))
	if err != nil || !strings.Contains(string(ci), "scripts/deps.sh test\n") {
		t.Errorf(".ci/run does not install the tests' packages (scripts/deps.sh test): %v", err)
	}
}
