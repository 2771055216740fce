package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ExitSandbox is run's exit status when the sandbox itself failed and the
// command never ran (as with env(1) and container runtimes: 126 and 127
// stay "found but not runnable" and "not found").
const ExitSandbox = 125

// forwarded are the signals run passes on to the session's pid 1, which
// passes them to the command. The job-control and fatal ones stay with run.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH}

// Run starts the plan's command in its sandbox, waits for it, and returns
// the status run exits with: the command's, or 128+n if a signal ended it.
// An error means the session never started; an *UnavailableError then
// carries the probe's reason.
func Run(p *Plan, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(p.Problems) > 0 {
		return 0, fmt.Errorf("refusing to start the session:\n  %s", strings.Join(p.Problems, "\n  "))
	}
	if err := p.prepareRunDir(); err != nil {
		return 0, err
	}
	filter, err := Filter()
	if err != nil {
		return 0, &UnavailableError{Reason: err.Error()}
	}
	seccompR, err := filterPipe(filter)
	if err != nil {
		return 0, err
	}
	defer seccompR.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer readyR.Close()
	infoR, infoW, err := os.Pipe()
	if err != nil {
		readyW.Close()
		return 0, err
	}
	defer infoR.Close()

	args := p.bwrapArgs()
	args = append(args, initPath, "init", fmt.Sprintf("--ready-fd=%d", fdReady), "--")
	args = append(args, p.Command...)
	cmd := exec.Command(p.Bwrap, args...)
	cmd.Env = p.Env
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.ExtraFiles = []*os.File{seccompR, readyW, infoW}
	// Its own process group: a ^C on the caller's terminal reaches run,
	// which forwards it, instead of killing bwrap and with it the session.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if p.User.Drop {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: p.User.UID, Gid: p.User.GID, Groups: p.User.Groups}
	}

	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, forwarded...)
	defer signal.Stop(sigc)

	startErr := cmd.Start()
	readyW.Close()
	infoW.Close()
	seccompR.Close()
	if startErr != nil {
		return 0, &UnavailableError{Reason: fmt.Sprintf("start %s: %v", p.Bwrap, startErr)}
	}

	// pid 1 writes one byte once bwrap has built the session and exec'd
	// it; end of file without it means bwrap failed during setup.
	ready := make(chan bool, 1)
	go func() {
		var b [1]byte
		n, _ := readyR.Read(b[:])
		ready <- n == 1
	}()
	// bwrap reports pid 1's host pid on --info-fd, right after the clone.
	childPid := make(chan int, 1)
	go func() {
		var info struct {
			ChildPid int `json:"child-pid"`
		}
		if err := json.NewDecoder(infoR).Decode(&info); err != nil {
			childPid <- 0
			return
		}
		childPid <- info.ChildPid
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var pending []os.Signal
	pid1, started := 0, false
	readyc := ready
	var waitErr error
loop:
	for {
		select {
		case ok := <-readyc:
			readyc = nil
			if !ok {
				continue
			}
			started = true
			pid1 = <-childPid
			for _, s := range pending {
				forward(pid1, s)
			}
			pending = nil
		case s := <-sigc:
			if started {
				forward(pid1, s)
			} else {
				pending = append(pending, s)
			}
		case waitErr = <-done:
			break loop
		}
	}
	if !started && readyc != nil {
		started = <-readyc
	}
	status := exitStatus(cmd.ProcessState, waitErr)
	if !started {
		if _, perr := Probe(p.Config.User, p.Bwrap); perr != nil {
			return 0, perr
		}
		return 0, fmt.Errorf("bwrap could not build the session (exit %d): its message is above", status)
	}
	return status, nil
}

func forward(pid int, s os.Signal) {
	if pid > 0 {
		// pid 1 of a namespace only gets signals it handles; init does.
		_ = syscall.Kill(pid, s.(syscall.Signal))
	}
}

func exitStatus(ps *os.ProcessState, err error) int {
	if ps == nil {
		return ExitSandbox
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// prepareRunDir makes the run's home/ and tmp/ (0700, the session user's)
// and bundle/. The run directory may be writable by the session user, so
// every step refuses symlinks and works on the descriptor it opened.
func (p *Plan) prepareRunDir() error {
	runFD, err := unix.Open(p.RunDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open run directory %s: %w", p.RunDir, err)
	}
	defer unix.Close(runFD)
	for _, d := range []struct {
		name  string
		mode  uint32
		owned bool
		empty bool
	}{
		{"home", 0o700, true, true},
		{"tmp", 0o700, true, false},
		{"bundle", 0o755, false, false},
	} {
		if err := unix.Mkdirat(runFD, d.name, d.mode); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("make %s: %w", filepath.Join(p.RunDir, d.name), err)
		}
		fd, err := unix.Openat(runFD, d.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s (a directory, not a symlink): %w", filepath.Join(p.RunDir, d.name), err)
		}
		f := os.NewFile(uintptr(fd), filepath.Join(p.RunDir, d.name))
		err = prepareDir(f, p.User, d.mode, d.owned, d.empty)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func prepareDir(f *os.File, u User, mode uint32, owned, empty bool) error {
	if empty {
		names, err := f.Readdirnames(1)
		if err != nil && err != io.EOF {
			return fmt.Errorf("read %s: %w", f.Name(), err)
		}
		if len(names) > 0 {
			return fmt.Errorf("%s is not empty: a session starts with an empty HOME", f.Name())
		}
	}
	if owned && u.Drop {
		if err := unix.Fchown(int(f.Fd()), int(u.UID), int(u.GID)); err != nil {
			return fmt.Errorf("chown %s to %s: %w", f.Name(), u.Name, err)
		}
	}
	if owned {
		if err := unix.Fchmod(int(f.Fd()), mode); err != nil {
			return fmt.Errorf("chmod %s: %w", f.Name(), err)
		}
	}
	return nil
}
