// Package pid1 is a session's pid 1, which bwrap starts (--as-pid-1) as
// `init [OPTIONS] EXE ARGV...`. It is its own package, importing little,
// so that cmd/sandbox-init, the small binary run as pid 1, starts with
// few pages to fault in and few package initialisations: every session's
// start waits for it. cmd/sandbox runs it too (its `init` verb), where
// no sandbox-init lies beside it.
package pid1

import (
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/testhook"
)

// Verb is the first argument of pid 1's command line. A main that calls
// sandbox.Run without a sandbox-init beside it must hand this verb to
// Main before anything else it does: Run binds that main's executable
// as pid 1.
const Verb = "init"

// The options before EXE.
const (
	// OptScopeAbstract makes pid 1 start the command in a Landlock
	// domain scoped off abstract Unix sockets (see scopeAbstractUnix).
	OptScopeAbstract = "--scope-abstract-unix"
	// OptGate makes pid 1 wait, before it starts the command, for run's
	// byte on FDGate.
	OptGate = "--gate"
	// OptRelay makes pid 1 make the relay's listening socket of a
	// --net=proxy session and hand it to the egress proxy (handOffRelay).
	OptRelay = "--relay"
)

// The descriptors pid 1 inherits from sandbox run, through bwrap.
const (
	FDMonitor = 5 // the status pipe's read end: it hangs up when bwrap's outer process dies
	FDReady   = 6 // pid 1 writes a byte here once it forwards signals
	FDGate    = 7 // with limits: run writes a byte here once the session is in its cgroup
	FDRelay   = 8 // with --net=proxy: pid 1 sends the relay's listening socket here
)

// ExitSandbox is pid 1's status when it failed and the command never ran:
// sandbox run's own (sandbox.ExitSandbox).
const ExitSandbox = 125

// Forwarded are the signals sandbox run passes on to the command through
// pid 1. The job-control and fatal ones stay with run.
var Forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}

// Main is the session's pid 1. It dies with the bwrap process outside
// (SIGKILL as its parent-death signal), tells run it is ready for signals,
// starts the command, forwards run's signals to it, reaps every orphan, and
// returns the command's status (128+n if signal n ended it). Whatever is
// left when the command exits dies with pid 1 and the pid namespace.
//
// args are the command's path inside the session (run looked it up, so pid
// 1 does not search PATH) and its argv. It is the only work a session's
// start adds to bwrap's, so it does no more than this, allocates little,
// and writes only when something fails.
func Main(args []string, stderr io.Writer) int {
	var gate, scope, relay bool
	for len(args) > 0 && strings.HasPrefix(args[0], "--") {
		switch args[0] {
		case OptGate:
			gate = true
		case OptScopeAbstract:
			scope = true
		case OptRelay:
			relay = true
		default:
			return initFailed(stderr, "unknown option "+args[0], nil)
		}
		args = args[1:]
	}
	testhook.Step("init")
	if os.Getpid() != 1 || len(args) < 2 {
		return initFailed(stderr, "runs only as a session's pid 1 (sandbox run starts it)", nil)
	}
	// The parent-death signal belongs to the thread that sets it (the
	// kernel looks at each thread of a child whose parent died): keep this
	// goroutine, and so that thread, until pid 1 exits.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return initFailed(stderr, "set the parent-death signal", err)
	}
	// bwrap may have died before the prctl, and then no signal comes. Its
	// outer process alone holds the status pipe's write end: a hang-up on
	// the read end run handed down means it is gone.
	if !monitorAlive() {
		return ExitSandbox
	}
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, Forwarded...)
	// A channel of its own, so a burst of forwarded signals cannot crowd
	// out the one that says a child exited.
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	// Signals the Go runtime would turn into a crash with a stack dump
	// when a session process sends them with kill(2): caught and dropped,
	// so that no process of the session can end pid 1 (and so the session)
	// with a status that is not its command's.
	dropped := make(chan os.Signal, 4)
	signal.Notify(dropped, crashSignals...)
	// From here on run's signals are caught; before, pid 1 of a namespace
	// would have dropped them, so run holds them until it reads this byte.
	if _, err := unix.Write(FDReady, []byte{1}); err != nil {
		return initFailed(stderr, "tell sandbox run the session is up", err)
	}
	// Nothing run or bwrap handed down reaches the command, and a
	// non-dumpable pid 1 keeps its /proc/1 entries (fd, root, mem, environ)
	// closed to the session's own processes. The inherited descriptors are
	// marked close-on-exec rather than closed: the Go runtime may already
	// hold its own among them (the netpoller's, made at the first timer of
	// a package's init, takes the lowest free number), and closing it
	// under the runtime crashes pid 1.
	unix.Close(FDReady)
	if gate {
		// run puts the session into its cgroup, then says go: the command
		// never runs outside its limits. End of file means run is gone.
		var b [1]byte
		n, err := unix.Read(FDGate, b[:])
		for err == unix.EINTR {
			n, err = unix.Read(FDGate, b[:])
		}
		if n != 1 {
			return initFailed(stderr, "wait for sandbox run to apply the limits", err)
		}
		unix.Close(FDGate)
	}
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return initFailed(stderr, "close inherited descriptors", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return initFailed(stderr, "make pid 1 non-dumpable", err)
	}

	// The relay listens before the command starts, so no session process
	// can take its port first.
	if relay {
		if err := handOffRelay(); err != nil {
			return initFailed(stderr, "hand the egress proxy a socket listening on "+RelayAddr, err)
		}
	}
	// Landlock binds the thread that asks, and this goroutine's thread is
	// locked: the command, forked from it below, starts in the domain.
	if scope {
		if err := scopeAbstractUnix(); err != nil {
			return initFailed(stderr, "scope the session off abstract Unix sockets (Landlock)", err)
		}
	}
	testhook.Step("init-exec")
	// The command gets no parent-death signal of its own: when pid 1 dies,
	// the kernel kills every process of its pid namespace.
	command, err := syscall.ForkExec(args[0], args[1:], &syscall.ProcAttr{
		Env:   syscall.Environ(),
		Files: []uintptr{0, 1, 2},
	})
	if err != nil {
		io.WriteString(stderr, "sandbox: "+args[1]+": "+err.Error()+"\n")
		if err == syscall.ENOENT {
			return 127
		}
		return 126
	}
	for {
		select {
		case sig := <-sigc:
			// ESRCH only once the command is gone; then nothing to tell.
			_ = syscall.Kill(command, sig.(syscall.Signal))
		case <-chld:
			if status, done := reap(command); done {
				testhook.Step("init-reaped")
				return status
			}
		case <-dropped:
		}
	}
}

// crashSignals are those whose default in a Go program is to exit, with a
// stack dump, and that run does not forward.
var crashSignals = []os.Signal{syscall.SIGABRT, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGSTKFLT,
	syscall.SIGSYS, syscall.SIGSEGV, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGPIPE}

// monitorAlive reports whether bwrap's outer process still holds the write
// end of the status pipe whose read end is FDMonitor, and closes it.
func monitorAlive() bool {
	fds := []unix.PollFd{{Fd: FDMonitor, Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, 0)
		if err != unix.EINTR {
			unix.Close(FDMonitor)
			return err == nil && fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) == 0
		}
	}
}

// reap waits for every child that has exited, without blocking, and
// reports the command's status once the command is among them.
func reap(command int) (int, bool) {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil || pid <= 0:
			return 0, false
		case pid != command:
			continue
		case ws.Signaled():
			return 128 + int(ws.Signal()), true
		default:
			return ws.ExitStatus(), true
		}
	}
}

// initFailed says what failed and is pid 1's status then, ExitSandbox.
func initFailed(stderr io.Writer, what string, err error) int {
	msg := "sandbox init: " + what
	if err != nil {
		msg += ": " + err.Error()
	}
	io.WriteString(stderr, msg+"\n")
	return ExitSandbox
}
