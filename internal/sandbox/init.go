package sandbox

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Init is the session's pid 1 (sandbox init, started by bwrap with
// --as-pid-1). It tells run that setup succeeded, starts the command,
// forwards signals to it, reaps every orphan, and returns the command's
// status. It refuses to run as anything but pid 1.
func Init(args []string, stderr io.Writer) int {
	if os.Getpid() != 1 {
		fmt.Fprintln(stderr, "sandbox init: runs only as a session's pid 1 (sandbox run starts it)")
		return ExitSandbox
	}
	// With the parent-death signal, the session dies when the bwrap
	// process outside it does: pid 1's death ends its pid namespace.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		fmt.Fprintf(stderr, "sandbox init: set parent-death signal: %v\n", err)
		return ExitSandbox
	}
	if len(args) < 3 || !strings.HasPrefix(args[0], "--ready-fd=") || args[1] != "--" {
		fmt.Fprintln(stderr, "sandbox init: usage: init --ready-fd=N -- COMMAND...")
		return ExitSandbox
	}
	readyFD, err := strconv.Atoi(strings.TrimPrefix(args[0], "--ready-fd="))
	if err != nil || readyFD < 3 {
		fmt.Fprintf(stderr, "sandbox init: bad %s\n", args[0])
		return ExitSandbox
	}
	command := args[2:]

	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, forwarded...)
	if _, err := unix.Write(readyFD, []byte{1}); err != nil {
		fmt.Fprintf(stderr, "sandbox init: tell sandbox run the session is up: %v\n", err)
		return ExitSandbox
	}
	// Whatever bwrap or run left open stays outside the session, and a
	// non-dumpable pid 1 keeps its /proc/1 entries (fd, mem, root) closed
	// to the session's own processes.
	if err := unix.CloseRange(3, math.MaxUint32, 0); err != nil {
		fmt.Fprintf(stderr, "sandbox init: close inherited descriptors: %v\n", err)
		return ExitSandbox
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintf(stderr, "sandbox init: %v\n", err)
		return ExitSandbox
	}

	path, err := exec.LookPath(command[0])
	if err != nil {
		fmt.Fprintf(stderr, "sandbox: %s: command not found\n", command[0])
		return 127
	}
	status := make(chan int, 1)
	started := make(chan int, 1)
	go func() {
		// The command's parent-death signal follows the thread that forks
		// it: this goroutine keeps its thread until the command is reaped.
		runtime.LockOSThread()
		pid, err := syscall.ForkExec(path, command, &syscall.ProcAttr{
			Env:   os.Environ(),
			Files: []uintptr{0, 1, 2},
			Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
		})
		if err != nil {
			fmt.Fprintf(stderr, "sandbox: %s: %v\n", command[0], err)
			started <- 0
			if errors.Is(err, syscall.ENOENT) {
				status <- 127
			} else {
				status <- 126
			}
			return
		}
		started <- pid
		status <- reap(pid)
	}()
	pid := <-started
	for {
		select {
		case s := <-sigc:
			if pid > 0 {
				_ = syscall.Kill(pid, s.(syscall.Signal))
			}
		case st := <-status:
			return st
		}
	}
}

// reap waits for every child pid 1 inherits until the command exits, and
// returns the command's status. Orphans left when it exits die with pid 1.
func reap(cmd int) int {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ExitSandbox
		}
		if pid != cmd {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}
