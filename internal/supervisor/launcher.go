package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Services run as a user of their own (services_user), so that a service
// the agent edits can neither signal nor trace the supervisor. The
// supervisor, unprivileged after init, cannot start a process as another
// user; so init, before it drops to app, starts a launcher as the services'
// user, joined to the supervisor by a socket pair. The supervisor asks it to
// start a service (under the shim) or an exec health check, and to signal
// the process group of one it started; it reports each exit. The launcher
// can do nothing the services' user could not do anyway, and it dies with
// the supervisor (parent-death signal), taking the services down with it.
//
// Without a launcher (`supervisor run` on its own), services run as the
// supervisor's own user.

// launcherEnv names, in `supervisor run`, the descriptor of the socket to
// the launcher.
const launcherEnv = "BUSHOST_SUPERVISOR_LAUNCHER_FD"

// launcherPidEnv names, in `supervisor run`, the launcher's pid: its
// parent is the supervisor (init execs into it), which waits for it once
// it is gone.
const launcherPidEnv = "BUSHOST_SUPERVISOR_LAUNCHER_PID"

// launcherArg, after ShimArg, makes the shim entry point run the launcher:
// `supervisor service-shim --launcher`, with the socket as descriptor 3.
const launcherArg = "--launcher"

// maxLaunchMessage bounds one message on the launcher's socket.
const maxLaunchMessage = 1 << 20

// launchTimeout bounds how long the supervisor waits for the launcher to
// answer a start: a stopped launcher must not stop the supervisor's loop.
const launchTimeout = 5 * time.Second

type launchRequest struct {
	Op   string   `json:"op"` // "start" or "signal"
	ID   uint64   `json:"id"`
	Shim bool     `json:"shim,omitempty"`
	Argv []string `json:"argv,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	Env  []string `json:"env,omitempty"`
	Sig  int      `json:"sig,omitempty"`
}

type launchReply struct {
	Op     string `json:"op"` // "started" or "exited"
	ID     uint64 `json:"id"`
	PID    int    `json:"pid,omitempty"`
	Status int    `json:"status"`
	Err    string `json:"err,omitempty"`
}

// procRunner starts processes for the supervisor and signals their groups.
type procRunner interface {
	// start runs argv in dir with env, its output to out, as the leader of
	// a new process group; under the shim if shim is set. done yields the
	// exit status once.
	start(shim bool, argv []string, dir string, env []string, out *os.File) (pid int, done <-chan int, err error)
	// signal sends sig to what it started as pid (signalService).
	signal(pid int, sig syscall.Signal)
}

// localRunner starts processes as the supervisor's own user.
type localRunner struct{ shim []string }

func (l localRunner) start(shim bool, argv []string, dir string, env []string, out *os.File) (int, <-chan int, error) {
	argv, pdeath := underShim(l.shim, shim, argv)
	return startGroup(argv, dir, env, out, pdeath)
}

// underShim is argv run under the shim (the command shimCmd, this process
// the shim's parent) if shim is set, else argv itself; and the
// parent-death signal to start it with: SIGTERM for the shim, which then
// takes its group down, SIGKILL for anything else.
func underShim(shimCmd []string, shim bool, argv []string) ([]string, syscall.Signal) {
	if !shim {
		return argv, syscall.SIGKILL
	}
	return slices.Concat(shimCmd, []string{ShimArg, strconv.Itoa(os.Getpid()), "--"}, argv), syscall.SIGTERM
}

func (localRunner) signal(pid int, sig syscall.Signal) { signalService(pid, sig) }

// startGroup starts argv as a process group leader with a parent-death
// signal, from a locked thread (see startLocked).
func startGroup(argv []string, dir string, env []string, out *os.File, pdeath syscall.Signal) (int, <-chan int, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: pdeath}
	waited, err := startLocked(cmd)
	if err != nil {
		return 0, nil, err
	}
	done := make(chan int, 1)
	go func() {
		<-waited
		done <- exitStatus(cmd.ProcessState)
	}()
	return cmd.Process.Pid, done, nil
}

// remoteRunner asks the launcher.
type remoteRunner struct {
	conn *net.UnixConn
	// pid is the launcher's, this process's child: waited for once gone.
	pid int
	wmu sync.Mutex

	mu      sync.Mutex
	next    uint64
	started map[uint64]chan launchReply
	exited  map[uint64]chan int
	ids     map[int]uint64
	dead    bool
}

// launcherFromEnv returns the runner for the launcher init started, or nil
// if there is none. The variable is removed so services never see it, and
// the descriptor is closed on exec so git never inherits it.
func launcherFromEnv() (*remoteRunner, error) {
	v, ok := os.LookupEnv(launcherEnv)
	if !ok {
		return nil, nil
	}
	os.Unsetenv(launcherEnv)
	pid, _ := strconv.Atoi(os.Getenv(launcherPidEnv))
	os.Unsetenv(launcherPidEnv)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q is not a descriptor", launcherEnv, v)
	}
	syscall.CloseOnExec(fd)
	f := os.NewFile(uintptr(fd), "launcher")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("launcher socket: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("launcher socket is not a unix socket")
	}
	r := &remoteRunner{conn: uc, pid: pid, started: map[uint64]chan launchReply{}, exited: map[uint64]chan int{}, ids: map[int]uint64{}}
	go r.read()
	return r, nil
}

func (r *remoteRunner) send(req launchRequest, oob []byte) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if len(b) > maxLaunchMessage {
		return fmt.Errorf("launcher request of %d bytes, over %d", len(b), maxLaunchMessage)
	}
	r.wmu.Lock()
	defer r.wmu.Unlock()
	r.conn.SetWriteDeadline(time.Now().Add(launchTimeout))
	_, _, err = r.conn.WriteMsgUnix(b, oob, nil)
	return err
}

func (r *remoteRunner) start(shim bool, argv []string, dir string, env []string, out *os.File) (int, <-chan int, error) {
	r.mu.Lock()
	if r.dead {
		r.mu.Unlock()
		return 0, nil, errors.New("the services' launcher is gone")
	}
	r.next++
	id := r.next
	started := make(chan launchReply, 1)
	done := make(chan int, 1)
	r.started[id], r.exited[id] = started, done
	r.mu.Unlock()
	forget := func() {
		r.mu.Lock()
		delete(r.started, id)
		delete(r.exited, id)
		r.mu.Unlock()
	}
	req := launchRequest{Op: "start", ID: id, Shim: shim, Argv: argv, Dir: dir, Env: env}
	if err := r.send(req, syscall.UnixRights(int(out.Fd()))); err != nil {
		forget()
		return 0, nil, fmt.Errorf("launcher: %w", err)
	}
	select {
	case rep, ok := <-started:
		if !ok {
			return 0, nil, errors.New("the services' launcher is gone")
		}
		if rep.Err != "" {
			forget()
			return 0, nil, errors.New(rep.Err)
		}
		r.mu.Lock()
		r.ids[rep.PID] = id
		r.mu.Unlock()
		return rep.PID, done, nil
	case <-time.After(launchTimeout):
		forget()
		return 0, nil, fmt.Errorf("the services' launcher did not answer within %v", launchTimeout)
	}
}

func (r *remoteRunner) signal(pid int, sig syscall.Signal) {
	r.mu.Lock()
	id, ok := r.ids[pid]
	r.mu.Unlock()
	if ok {
		r.send(launchRequest{Op: "signal", ID: id, Sig: int(sig)}, nil)
	}
}

// read dispatches the launcher's replies. When the launcher is gone, every
// process it started counts as killed.
func (r *remoteRunner) read() {
	buf := make([]byte, 64<<10)
	for {
		n, _, _, _, err := r.conn.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			break
		}
		var rep launchReply
		if json.Unmarshal(buf[:n], &rep) != nil {
			continue
		}
		r.mu.Lock()
		switch rep.Op {
		case "started":
			if c := r.started[rep.ID]; c != nil {
				delete(r.started, rep.ID)
				c <- rep
			} else if rep.Err == "" {
				// Started after the supervisor gave up waiting: nobody
				// tracks it, so it must not run.
				go r.send(launchRequest{Op: "signal", ID: rep.ID, Sig: int(syscall.SIGKILL)}, nil)
			}
		case "exited":
			if c := r.exited[rep.ID]; c != nil {
				delete(r.exited, rep.ID)
				maps.DeleteFunc(r.ids, func(_ int, id uint64) bool { return id == rep.ID })
				c <- rep.Status
			}
		}
		r.mu.Unlock()
	}
	r.mu.Lock()
	r.dead = true
	for id, c := range r.started {
		close(c)
		delete(r.started, id)
	}
	for id, c := range r.exited {
		c <- 128 + int(syscall.SIGKILL)
		delete(r.exited, id)
	}
	r.mu.Unlock()
	if r.pid > 0 {
		// No zombie of it is left while the supervisor runs on.
		syscall.Wait4(r.pid, nil, 0, nil)
	}
}

// startLauncher starts the launcher as user svc with its end of a new socket
// pair as descriptor 3, and returns the supervisor's end (inheritable, for
// the exec that follows). It must run on the OS thread that will exec: the
// launcher's parent-death signal follows that thread.
func startLauncher(exe string, svc Account, env []string) (fd, pid int, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("launcher socket: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[1]), "launcher")
	defer theirs.Close()
	groups := make([]uint32, len(svc.Groups))
	for i, g := range svc.Groups {
		groups[i] = uint32(g)
	}
	cmd := exec.Command(exe, ShimArg, launcherArg)
	cmd.Dir = "/"
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(svc.UID), Gid: uint32(svc.GID), Groups: groups},
		Pdeathsig:  syscall.SIGKILL,
		Setsid:     true,
	}
	if err := cmd.Start(); err != nil {
		unix.Close(fds[0])
		return -1, 0, fmt.Errorf("start the services' launcher as %s: %w", svc.Name, err)
	}
	// Waited for by the supervisor this process execs into, once the
	// launcher is gone (remoteRunner.read); if the supervisor dies first,
	// the launcher's orphan goes to PID 1, which reaps (ReapAsPID1).
	pid = cmd.Process.Pid
	cmd.Process.Release()
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETFD, 0); err != nil {
		unix.Close(fds[0])
		return -1, 0, err
	}
	return fds[0], pid, nil
}

// runLauncher is the launcher's main: it serves the supervisor on
// descriptor 3 until the supervisor goes, then kills every group it
// started.
func runLauncher() int {
	// Services run as this user too: none of them may read this process's
	// memory or attach to it.
	unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	f := os.NewFile(3, "supervisor")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		fmt.Fprintf(os.Stderr, "launcher: %v\n", err)
		return 1
	}
	conn := c.(*net.UnixConn)
	var (
		wmu  sync.Mutex
		mu   sync.Mutex
		pids = map[uint64]int{}
	)
	reply := func(rep launchReply) {
		b, _ := json.Marshal(rep)
		wmu.Lock()
		conn.WriteMsgUnix(b, nil, nil)
		wmu.Unlock()
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "launcher: %v\n", err)
		return 1
	}
	buf := make([]byte, maxLaunchMessage)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			break
		}
		// The output descriptor, if any, is the started process's alone
		// once the request is served.
		out := receivedFile(oob[:oobn])
		var req launchRequest
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			req.Op = ""
		}
		switch req.Op {
		case "start":
			if out == nil || len(req.Argv) == 0 || req.Argv[0] == "" {
				reply(launchReply{Op: "started", ID: req.ID, Err: "launcher: a start needs a command and an output descriptor"})
				break
			}
			argv, pdeath := underShim([]string{exe}, req.Shim, req.Argv)
			pid, done, err := startGroup(argv, req.Dir, req.Env, out, pdeath)
			if err != nil {
				reply(launchReply{Op: "started", ID: req.ID, Err: err.Error()})
				break
			}
			mu.Lock()
			pids[req.ID] = pid
			mu.Unlock()
			reply(launchReply{Op: "started", ID: req.ID, PID: pid})
			go func(id uint64) {
				status := <-done
				mu.Lock()
				delete(pids, id)
				mu.Unlock()
				reply(launchReply{Op: "exited", ID: id, Status: status})
			}(req.ID)
		case "signal":
			mu.Lock()
			pid, ok := pids[req.ID]
			mu.Unlock()
			if ok && req.Sig > 0 && req.Sig < 65 {
				signalService(pid, syscall.Signal(req.Sig))
			}
		}
		if out != nil {
			out.Close()
		}
	}
	mu.Lock()
	for _, pid := range pids {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
	mu.Unlock()
	return 0
}

// receivedFile returns the one descriptor passed in oob, closing any more.
func receivedFile(oob []byte) *os.File {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var f *os.File
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd)
			if f == nil {
				f = os.NewFile(uintptr(fd), "output")
			} else {
				syscall.Close(fd)
			}
		}
	}
	return f
}
