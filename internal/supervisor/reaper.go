package supervisor

import (
	"errors"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

// In a container without an init (no `--init`, no `init: true`), the
// supervisor's init is PID 1, and the kernel makes PID 1 the parent of
// every orphan in the container: the agent's background processes once
// their exec session ends, the services' launcher once it dies. Nothing
// in a Go program waits for children it did not start, so they would stay
// zombies, each holding a pid until the container's pids limit is reached
// and nothing forks any more. So PID 1 does what an init does, and only
// that: it starts the rest of the work as its child, forwards the signals
// a container runtime sends, reaps every process that ends, and exits with
// its child's status when the child ends (the kernel then kills what is
// left in the container).

// forwarded are the signals PID 1 passes to its child.
var forwarded = []os.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// ReapAsPID1, when this process is PID 1, runs this program again with the
// same arguments as its child and reaps until that child exits: ok is
// true and code is the child's exit status (128+signal if killed). When
// this process is not PID 1 it returns ok false and does nothing.
func ReapAsPID1() (code int, ok bool) {
	if os.Getpid() != 1 {
		return 0, false
	}
	exe, err := os.Executable()
	code = 1
	if err == nil {
		code, err = reapChild(exe, os.Args)
	}
	if err != nil {
		os.Stderr.WriteString("supervisor: PID 1: " + err.Error() + "\n")
	}
	return code, true
}

// reapChild starts exe with argv (stdin, stdout and stderr shared),
// forwards the signals a container runtime sends to it, and waits for
// every child of this process (orphans included, for PID 1 or a
// subreaper) until exe's process has exited; it returns exe's status.
func reapChild(exe string, argv []string) (int, error) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	p, err := os.StartProcess(exe, argv, &os.ProcAttr{Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		return 1, err
	}
	go func() {
		for s := range sigs {
			p.Signal(s)
		}
	}()
	// Wait4 blocks its thread; nothing else here needs it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return 1, err
		}
		if pid != p.Pid {
			continue
		}
		if ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ws.ExitStatus(), nil
	}
}
