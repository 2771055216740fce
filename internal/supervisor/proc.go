package supervisor

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// signalService sends sig to what the supervisor started as pid: SIGKILL
// to its whole process group, any other signal to pid alone, which for a
// service is the shim, which passes it to the command.
func signalService(pid int, sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		syscall.Kill(-pid, sig)
		return
	}
	syscall.Kill(pid, sig)
}

// ShimArg is the hidden subcommand that runs one service under the shim:
//
//	supervisor service-shim PARENT_PID -- COMMAND [ARG...]
//
// The supervisor starts the shim as the leader of a new process group with
// SIGTERM as its parent-death signal; the shim starts the command in that
// group, and passes it the SIGTERM, SIGINT or SIGHUP the shim gets. When the supervisor dies, even by SIGKILL, the shim kills the whole
// group, grandchildren included, which Pdeathsig alone (one process deep)
// cannot do. When the command exits, the shim kills whatever it left behind
// in the group and exits with the command's status.
const ShimArg = "service-shim"

// RunShim is the shim's main; it returns the exit status.
func RunShim(args []string) int {
	// Pdeathsig of the command is tied to the thread that starts it.
	if len(args) == 1 && args[0] == launcherArg {
		return runLauncher()
	}
	runtime.LockOSThread()
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintf(os.Stderr, "usage: supervisor %s PARENT_PID -- COMMAND [ARG...]\n", ShimArg)
		return 2
	}
	parent, err := strconv.Atoi(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: bad parent pid %q\n", ShimArg, args[0])
		return 2
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	// The supervisor may have died before the kernel armed our Pdeathsig.
	if os.Getppid() != parent {
		return 1
	}
	cmd := exec.Command(args[2], args[3:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "start %s: %v\n", args[2], err)
		return 127
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	for {
		select {
		case sig := <-sigs:
			if os.Getppid() != parent {
				// The supervisor is gone: take the group down, this shim too.
				syscall.Kill(-syscall.Getpgrp(), syscall.SIGKILL)
			}
			// The supervisor's stop, or anyone's lone signal to the pid
			// /status shows: the command gets it, and what it leaves in
			// the group goes when it exits.
			cmd.Process.Signal(sig)
		case <-done:
			killRestOfGroup()
			return exitStatus(cmd.ProcessState)
		}
	}
}

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// killRestOfGroup kills every other live process in the shim's group, so a
// service that exits leaves no background child behind.
func killRestOfGroup() {
	me, pg := os.Getpid(), syscall.Getpgrp()
	for range 20 {
		found := false
		for _, pid := range groupMembers(pg) {
			if pid != me {
				syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		if !found {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// groupMembers lists the live (not zombie) processes whose process group is
// pg, from /proc.
func groupMembers(pg int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		state, _, pgrp, ok := procStat(pid)
		if ok && pgrp == pg && state != "Z" && state != "X" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// procStat reads the state, parent and process group of pid.
func procStat(pid int) (state string, ppid, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, 0, false
	}
	// The command name may hold spaces and parentheses: fields start after
	// the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return "", 0, 0, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	return f[0], ppid, pgrp, err1 == nil && err2 == nil
}

// startLocked starts cmd from a goroutine locked to its OS thread that lives
// until cmd exits: Pdeathsig fires when the *thread* that started the child
// ends, and an unlocked goroutine's thread may end any time. The returned
// channel yields Wait's result.
func startLocked(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: when this goroutine returns, Go retires the
		// thread, and by then the child has been waited for.
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// logSink serialises line-prefixed output of services and the supervisor.
// With json set, each line is a JSON record instead (message "output",
// the prefix as service), so that a JSON log stays JSON throughout.
type logSink struct {
	mu   sync.Mutex
	w    io.Writer
	json bool
}

func (l *logSink) line(prefix string, b []byte) {
	var out []byte
	if !l.json {
		out = fmt.Appendf(nil, "%s | %s\n", prefix, b)
	} else {
		rec, _ := json.Marshal(struct {
			Time    time.Time `json:"time"`
			Level   string    `json:"level"`
			Msg     string    `json:"msg"`
			Service string    `json:"service"`
			Line    string    `json:"line"`
		}{time.Now(), "INFO", "output", prefix, string(b)})
		out = append(rec, '\n')
	}
	l.Write(out)
}

// Write writes p whole, between the lines of others: slog's records
// share the services' serialised output this way.
func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// copyLines prefixes every line read from r with name until r ends.
func (l *logSink) copyLines(name string, r io.Reader) {
	br := bufio.NewReaderSize(r, 16<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			l.line(name, []byte(strings.TrimRight(string(line), "\r\n")))
		}
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}
