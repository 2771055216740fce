package integration

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// make install lays out the binaries, the units (with the binaries' path
// written in), the sysusers entry and the docs under DESTDIR; installed
// where the units' paths are real, systemd-analyze verify finds nothing
// wrong in them.
func TestMakeInstallAndVerifyUnits(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is missing: scripts/deps.sh installs it")
	}
	build := filepath.Join(baseDir(t), "build")
	dest := baseDir(t)
	install := func(args ...string) {
		t.Helper()
		cmd := exec.Command("make", append([]string{"-s", "install", "BIN=" + build}, args...)...)
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make install %v: %v\n%s", args, err, out)
		}
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
	// (verify would say so): install again with PREFIX inside a temp dir,
	// so that the binaries sit where the units expect them.
	prefix := filepath.Join(baseDir(t), "usr")
	install("PREFIX=" + prefix)
	var paths []string
	for _, u := range units {
		paths = append(paths, filepath.Join(prefix, "lib/systemd/system", u))
	}
	out, err := exec.Command(analyze, append([]string{"verify", "--man=no"}, paths...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
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
