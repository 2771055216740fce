package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testenv"
)

// openPty returns a new pseudo-terminal's master and slave.
func openPty(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		testenv.Missing(t, "pseudo-terminals", "the terminal checks (%v)", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open pty slave: %v", err)
	}
	t.Cleanup(func() { slave.Close() })
	return master, slave
}

// pendingInput is how many bytes wait in the terminal's input queue: what
// the caller's shell would read, and run, next.
func pendingInput(t *testing.T, slave *os.File) int {
	t.Helper()
	n, err := unix.IoctlGetInt(int(slave.Fd()), unix.TIOCINQ)
	if err != nil {
		t.Fatalf("TIOCINQ: %v", err)
	}
	return n
}

// runOnTty runs argv with the pty as its controlling terminal and stdin.
func runOnTty(t *testing.T, slave *os.File, argv ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	var out bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	default:
		t.Fatalf("run %q: %v", argv, err)
		return "", -1
	}
}

func TestSandboxTIOCSTI(t *testing.T) {
	e := newSandboxEnv(t)

	// The control: outside the sandbox, on its own controlling terminal,
	// the helper can push input, unless this kernel forbids TIOCSTI for
	// everyone (dev.tty.legacy_tiocsti=0).
	_, slave := openPty(t)
	out, code := runOnTty(t, slave, e.helper, "tiocsti")
	injected := pendingInput(t, slave)
	t.Logf("control outside the sandbox: exit %d, %d bytes injected: %s", code, injected, out)
	if code == 0 && injected == 0 {
		t.Fatalf("control: the helper claims success but nothing reached the terminal")
	}

	_, slave = openPty(t)
	before := e.snapshot(t)
	args := append([]string{e.sandbox, "run"}, e.flags("git.push.working")...)
	out, code = runOnTty(t, slave, append(args, "--", e.helper, "tiocsti")...)
	if code != 3 || !strings.Contains(out, "REFUSED") {
		t.Errorf("TIOCSTI inside the sandbox: exit %d: %s; want REFUSED", code, out)
	}
	if n := pendingInput(t, slave); n != 0 {
		t.Errorf("the session pushed %d bytes into the caller's terminal", n)
	}
	e.assertUnchanged(t, before)
}

// TestSandboxTIOCSETD: a session given the caller's terminal as stdin
// cannot change its line discipline, which would outlive the session; the
// caller's line discipline and termios are as they were.
func TestSandboxTIOCSETD(t *testing.T) {
	e := newSandboxEnv(t)
	state := func(slave *os.File) (int, unix.Termios) {
		t.Helper()
		ldisc, err := unix.IoctlGetInt(int(slave.Fd()), unix.TIOCGETD)
		if err != nil {
			t.Fatalf("TIOCGETD: %v", err)
		}
		tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatalf("TCGETS: %v", err)
		}
		return ldisc, *tio
	}
	// The control: outside the sandbox the helper changes the discipline
	// (unless this kernel lacks N_NULL).
	_, slave := openPty(t)
	before, _ := state(slave)
	out, code := runOnTty(t, slave, e.helper, "tiocsetd")
	after, err := unix.IoctlGetInt(int(slave.Fd()), unix.TIOCGETD)
	if err != nil {
		t.Fatalf("TIOCGETD: %v", err)
	}
	t.Logf("control outside the sandbox: exit %d, line discipline %d -> %d: %s", code, before, after, out)
	if code == 0 && after == before {
		t.Fatalf("control: the helper claims success but the line discipline is unchanged")
	}

	_, slave = openPty(t)
	ldisc, tio := state(slave)
	snap := e.snapshot(t)
	args := append([]string{e.sandbox, "run"}, e.flags("git.push.working")...)
	out, code = runOnTty(t, slave, append(args, "--", e.helper, "tiocsetd")...)
	if code != 3 || !strings.Contains(out, "REFUSED") {
		t.Errorf("TIOCSETD inside the sandbox: exit %d: %s; want REFUSED", code, out)
	}
	if l, tio2 := state(slave); l != ldisc || tio2 != tio {
		t.Errorf("the caller's terminal changed: line discipline %d -> %d, termios %+v -> %+v", ldisc, l, tio, tio2)
	}
	e.assertUnchanged(t, snap)
}

// TestSandboxTermiosRestored: a session given the caller's terminal as its
// stdin switches echo and canonical mode off (`stty -echo -icanon`) and
// exits; the caller's termios is as it was before the session.
func TestSandboxTermiosRestored(t *testing.T) {
	e := newSandboxEnv(t)
	termios := func(slave *os.File) unix.Termios {
		t.Helper()
		tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatalf("TCGETS: %v", err)
		}
		return *tio
	}
	// The control: outside the sandbox, stty changes the terminal for good.
	_, slave := openPty(t)
	before := termios(slave)
	if before.Lflag&(unix.ECHO|unix.ICANON) != unix.ECHO|unix.ICANON {
		t.Fatalf("a new pty without echo or canonical mode: lflag %#x", before.Lflag)
	}
	if out, code := runOnTty(t, slave, "/usr/bin/stty", "-echo", "-icanon"); code != 0 {
		t.Fatalf("control: stty: exit %d: %s", code, out)
	}
	if after := termios(slave); after.Lflag&(unix.ECHO|unix.ICANON) != 0 {
		t.Fatalf("control: stty -echo -icanon left lflag %#x", after.Lflag)
	}

	_, slave = openPty(t)
	before = termios(slave)
	snap := e.snapshot(t)
	args := append([]string{e.sandbox, "run"}, e.flags("git.push.working")...)
	out, code := runOnTty(t, slave, append(args, "--", "/bin/sh", "-c", "stty -echo -icanon && stty -a")...)
	if code != 0 || !strings.Contains(out, "-icanon") || !strings.Contains(out, "-echo ") {
		t.Fatalf("the session's stty: exit %d: %s", code, out)
	}
	if after := termios(slave); after != before {
		t.Errorf("the caller's termios changed: %+v -> %+v", before, after)
	}
	e.assertUnchanged(t, snap)
}

// TestSandboxTerminalOnStdoutRestored: the caller's terminal reaches the
// session as its stdout and stderr only (stdin is /dev/null, as for
// `sandbox run ... </dev/null`): the session switches echo and canonical
// mode off through descriptor 1 and puts the terminal in exclusive mode
// (TIOCEXCL: no one but root could open it again); after the session the
// terminal is as it was.
func TestSandboxTerminalOnStdoutRestored(t *testing.T) {
	e := newSandboxEnv(t)
	state := func(slave *os.File) (unix.Termios, int) {
		t.Helper()
		tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatalf("TCGETS: %v", err)
		}
		excl, err := unix.IoctlGetInt(int(slave.Fd()), unix.TIOCGEXCL)
		if err != nil {
			t.Fatalf("TIOCGEXCL: %v", err)
		}
		return *tio, excl
	}
	run := func(slave *os.File, argv ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = slave, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return out.String(), 0
		case errors.As(err, &ee):
			return out.String(), ee.ExitCode()
		}
		t.Fatalf("run %q: %v", argv, err)
		return "", -1
	}
	attack := "stty -echo -icanon <&1 && " + e.helper + " tiocexcl 3 3>&1 >&2"

	// The control: outside the sandbox the same commands change the
	// terminal for good.
	_, slave := openPty(t)
	tio, excl := state(slave)
	if out, code := run(slave, "/bin/sh", "-c", attack); code != 0 {
		t.Fatalf("control: exit %d: %s", code, out)
	}
	if tio2, excl2 := state(slave); tio2 == tio || excl2 == excl {
		t.Fatalf("control: the terminal did not change: termios %v, exclusive %d -> %d", tio2 == tio, excl, excl2)
	}

	_, slave = openPty(t)
	tio, excl = state(slave)
	snap := e.snapshot(t)
	args := append([]string{e.sandbox, "run"}, e.flags("git.push.working")...)
	out, code := run(slave, append(args, "--", "/bin/sh", "-c", attack)...)
	if code != 0 || !strings.Contains(out, "ESCAPED") {
		t.Fatalf("the session's attack did not run: exit %d: %s", code, out)
	}
	if tio2, excl2 := state(slave); tio2 != tio || excl2 != excl {
		t.Errorf("the caller's terminal changed: termios %+v -> %+v, exclusive %d -> %d", tio, tio2, excl, excl2)
	}
	e.assertUnchanged(t, snap)
}
