package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/sandbox/pid1"
	"github.com/bushost/bushost/internal/testhook"
)

// ExitSandbox is run's exit status when the sandbox itself failed and the
// command never ran (as with env(1) and container runtimes: 126 and 127
// stay "found but not runnable" and "not found"); pid 1's too.
const ExitSandbox = pid1.ExitSandbox

// Run starts the plan's command in its sandbox, waits for it, and returns
// the status run exits with: the command's, or 128+n if a signal ended it.
// An error means the session never started; an *UnavailableError then
// carries the probe's reason. A nil file stands for /dev/null.
//
// The session's pid 1 is sandbox-init (internal/sandbox/pid1), or this
// executable again, started by bwrap with --as-pid-1 and the verb
// pid1.Verb: it dies with the bwrap
// process outside, reaps orphans, forwards the signals run passes on and
// exits with the command's status, which bwrap reports. Run forwards its
// signals to pid 1 and, once bwrap has exited, makes sure pid 1 and so the
// whole session is gone before it returns.
func Run(p *Plan, stdin, stdout, stderr *os.File) (int, error) {
	if len(p.Problems) > 0 {
		return 0, fmt.Errorf("refusing to start the session:\n  %s", strings.Join(p.Problems, "\n  "))
	}
	// run's own messages: on stderr, or nowhere without one.
	var warn io.Writer = io.Discard
	if stderr != nil {
		warn = stderr
	}
	// From here on the signals run forwards are held for the session,
	// not acted on: one that comes while the session is being built (or
	// its trees handed over) reaches the command once pid 1 is ready.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, pid1.Forwarded...)
	defer signal.Stop(sigc)
	var held *lease
	var share *idmapped
	// The workspace was opened and checked once; from here on the
	// session gets that descriptor. A path that no longer names it was
	// swapped under the caller's eyes: refused, never followed.
	testhook.Swap("run.workspace")
	if err := p.ws.Recheck(); err != nil {
		return 0, err
	}
	testhook.Step("recheck")
	if p.User.Dynamic {
		l, err := acquireUID(p.Config.StateDir, p.Config.UIDLow, p.Config.UIDHigh)
		if err != nil {
			return 0, err
		}
		held = l
		testhook.Step("uid")
		// Last of all: the session is gone by the time this runs.
		defer func() {
			if err := l.release(); err != nil {
				fmt.Fprintf(warn, "sandbox: hand the session's files back from uid %d: %v\n", l.uid, err)
			}
			testhook.Step("released")
		}()
		p.User.UID, p.User.GID, p.User.Name = l.uid, l.uid, fmt.Sprintf("%s-%d", dynamicName, l.uid)
		p.Env = p.Config.sessionEnv(p)
		// The run directory's home/ and tmp/ are made (the host's) first,
		// then every tree is handed over under one record.
		if err := p.prepareRunDir(); err != nil {
			return 0, err
		}
		testhook.Step("run-dir")
		trees, err := p.handedTrees()
		if err != nil {
			return 0, err
		}
		share, err = p.share(l, trees, warn)
		for _, t := range trees[2:] {
			unix.Close(t.fd)
		}
		if err != nil {
			return 0, err
		}
		if share != nil {
			defer func() {
				if err := share.close(); err != nil {
					fmt.Fprintf(warn, "sandbox: %v\n", err)
				}
			}()
		}
		testhook.Step("share")
	} else if err := p.prepareRunDir(); err != nil {
		return 0, err
	}
	exe, status, msg := p.lookCommand()
	testhook.Step("command")
	if status != 0 {
		// bwrap would only say "execvp: ..." and exit 1; the shell's
		// statuses tell a caller what went wrong.
		fmt.Fprintf(warn, "sandbox: %s: %s\n", p.Command[0], msg)
		return status, nil
	}
	// Whatever the caller left open beyond stdio must not reach bwrap and
	// the session: every descriptor from 3 up closes on exec, and those
	// handed to bwrap below are put in place by ForkExec.
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}
	var stdio [3]uintptr
	for i, f := range []*os.File{stdin, stdout, stderr} {
		if f == nil {
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return 0, err
			}
			defer null.Close()
			f = null
		}
		stdio[i] = f.Fd()
	}
	// Last but the uid's hand-back: the session, and every process that
	// held the terminal, is gone by then.
	defer keepTerminal(stdin, stdout, stderr)()
	filter, err := Filter()
	if err != nil {
		return 0, &UnavailableError{Reason: err.Error()}
	}
	seccompR, err := filterPipe(filter)
	if err != nil {
		return 0, err
	}
	defer seccompR.Close()
	testhook.Step("seccomp")
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer statusR.Close()
	var ready [2]int
	if err := unix.Pipe2(ready[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return 0, err
	}
	s := &session{pid1FD: -1, readyFD: ready[0]}
	defer s.close()

	limits := p.Config.Limits
	// The cgroup is made, with its limits, before anything starts; a limit
	// that cannot be applied refuses the launch.
	cg, err := newCgroup(limits, p.Config.CgroupParents)
	if err != nil {
		return 0, err
	}
	if cg != nil {
		defer cg.remove()
	}
	testhook.Step("cgroup")
	// A session launched from inside another ends when that one does.
	var leadGone <-chan struct{}
	if p.Config.EndWith != "" {
		fd, err := endWith(p.Config.EndWith)
		if err != nil {
			return 0, err
		}
		defer unix.Close(fd)
		leadGone = waitGone(fd)
	}
	if held != nil {
		// What the session is given, for sandbox serve to bound the
		// sessions it launches by; written before anything of it runs.
		b, err := p.sessionBounds(cg)
		if err == nil && share != nil {
			b.Mapped = share.mapped()
		}
		if err == nil {
			held.rec.Session = b
			err = held.save()
		}
		if err != nil {
			return 0, fmt.Errorf("record the session's bounds: %w", err)
		}
	}
	var eg *egressProxy
	if p.Config.Net == NetProxy {
		log := newLineLimiter(warn)
		// After the proxy and the auditor have stopped.
		defer log.close()
		var audit *auditor
		if p.Config.AuditTokenFile != "" {
			audit = startAuditor(p.bushostExe, p.brokerSocket(), p.Config.AuditTokenFile, log)
			// After the proxy has stopped: its last decisions go too.
			defer audit.stop()
		}
		var err error
		eg, err = startEgress(p.Config, log, audit)
		if err != nil {
			return 0, fmt.Errorf("start the egress proxy: %w", err)
		}
		defer eg.stop()
	}
	argv := append([]string{p.Bwrap}, p.bwrapArgs()...)
	argv = append(argv, initPath, pid1.Verb)
	files := []uintptr{stdio[0], stdio[1], stdio[2], seccompR.Fd(), statusW.Fd(), rawFD(statusR), uintptr(ready[1])}
	var gateW *os.File
	if cg != nil {
		gateR, w, err := os.Pipe()
		if err != nil {
			return 0, err
		}
		defer gateR.Close()
		defer w.Close()
		gateW = w
		files = append(files, gateR.Fd())
		argv = append(argv, pid1.OptGate)
	}
	if p.ScopeAbstract {
		argv = append(argv, pid1.OptScopeAbstract)
	}
	if eg != nil {
		// pid1.FDRelay, after fdGate or a closed one in its place.
		if len(files) == fdGate {
			files = append(files, ^uintptr(0))
		}
		files = append(files, eg.child.Fd())
		argv = append(argv, pid1.OptRelay)
	}
	// fdWorkspace, for bwrap's --bind-fd, after closed ones in the places
	// of those not used.
	for len(files) < fdWorkspace {
		files = append(files, ^uintptr(0))
	}
	files = append(files, uintptr(p.ws.Fd()))
	for _, fd := range p.busFDs { // fdBusSockets on
		files = append(files, uintptr(fd))
	}
	argv = append(argv, exe)
	argv = append(argv, p.Command...)
	attr := &syscall.ProcAttr{
		Dir: "/",
		Env: p.Env,
		// pid 1 inherits the status pipe's read end (pid1.FDMonitor) only to see
		// whether bwrap's outer process is still there, and closes it.
		Files: files,
		// Its own process group: a ^C on the caller's terminal reaches run,
		// which forwards it, instead of killing bwrap and with it the session.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	}
	if p.User.Drop {
		attr.Sys.Credential = &syscall.Credential{Uid: p.User.UID, Gid: p.User.GID, Groups: p.User.Groups}
	}

	// syscall.ForkExec rather than os/exec: os.StartProcess probes pidfd
	// support by starting a throwaway child, one more process per session.
	var bwrapPid int
	testhook.Step("fork")
	startErr := limits.withRlimits(func() (err error) {
		bwrapPid, err = startBwrap(share, p.Bwrap, argv, attr)
		return err
	})
	statusW.Close()
	seccompR.Close()
	if eg != nil {
		eg.launched()
	}
	unix.Close(ready[1])
	if startErr != nil {
		return 0, &UnavailableError{Reason: fmt.Sprintf("start %s: %v", p.Bwrap, startErr)}
	}
	testhook.Step("forked")

	// The status pipe reaches end of file when bwrap exits: only bwrap
	// holds its write end (it closes it in the session before the setup).
	events := make(chan bwrapStatus, 2)
	go readStatus(statusR, events)

	var pending []syscall.Signal
	var retry, timeout, kill <-chan time.Time
	if limits.Timeout > 0 {
		timeout = time.After(limits.Timeout)
	}
	exitCode, timedOut, gated := -1, false, gateW == nil
	var gateErr error
	for events != nil {
		select {
		case ev, ok := <-events:
			switch {
			case !ok:
				events = nil
			case ev.childPid > 0:
				s.started(ev.childPid, ev.pidNS)
			case ev.exitCode >= 0:
				exitCode = ev.exitCode
			}
		case sig := <-sigc:
			pending = append(pending, sig.(syscall.Signal))
		case <-retry:
			retry = nil
		case <-timeout:
			// As timeout(1): SIGTERM to the command, SIGKILL to the
			// whole session if it is still there after the grace.
			timedOut, timeout = true, nil
			pending = append(pending, syscall.SIGTERM)
			kill = time.After(timeoutGrace)
		case <-kill:
			kill = nil
			s.kill(bwrapPid)
		case <-leadGone:
			leadGone = nil
			s.kill(bwrapPid)
		}
		if !gated && s.checkReady() && s.pid1 > 0 {
			// pid 1 is up and waits: put bwrap and it into the cgroup
			// (their children follow), then let it start the command.
			gated = true
			if gateErr = cg.enter(bwrapPid, s.pid1); gateErr == nil {
				_, gateErr = gateW.Write([]byte{1})
			}
			gateW.Close()
			if gateErr != nil {
				s.kill(bwrapPid)
			}
		}
		if len(pending) > 0 && s.forward(pending) {
			pending = nil
		}
		if (len(pending) > 0 || !gated) && retry == nil {
			// pid 1 does not catch signals yet: try again shortly.
			retry = time.After(5 * time.Millisecond)
		}
	}
	ws := waitPid(bwrapPid)
	testhook.Step("bwrap-exited")
	// bwrap is gone: so is the session, whatever the command left behind.
	s.end()
	testhook.Step("ended")
	if cg != nil {
		p.PeakMemory = cg.peakMemory()
	}

	switch {
	case gateErr != nil:
		return 0, refuse(ReasonLimitUnavailable, exitRefused, "put the session into its cgroup: %v", gateErr)
	case timedOut:
		fmt.Fprintf(warn, "sandbox: %s: timed out after %s\n", p.Command[0], limits.Timeout)
		return ExitTimeout, nil
	case exitCode >= 0:
		return exitCode, nil
	case ws.Signaled() && s.pid1FD >= 0:
		// bwrap itself was killed after building the session.
		return 128 + int(ws.Signal()), nil
	}
	if _, perr := Probe(p.Config.User, p.Bwrap); perr != nil {
		return 0, perr
	}
	return 0, fmt.Errorf("bwrap could not build the session or start %s (exit %d): its message is above", p.Command[0], ws.ExitStatus())
}

// startBwrap starts bwrap; with idmapped mounts, from a thread of its own
// that attaches them in a mount namespace of its own first (bwrap starts
// in it and binds them), and ends with this call, taking the namespace
// with it once bwrap is gone too.
func startBwrap(share *idmapped, bwrap string, argv []string, attr *syscall.ProcAttr) (int, error) {
	if share == nil {
		return syscall.ForkExec(bwrap, argv, attr)
	}
	type started struct {
		pid int
		err error
	}
	done := make(chan started, 1)
	go func() {
		// Never unlocked: the thread, in its own mount namespace, exits
		// with this goroutine.
		runtime.LockOSThread()
		if err := share.attach(); err != nil {
			done <- started{0, err}
			return
		}
		pid, err := syscall.ForkExec(bwrap, argv, attr)
		done <- started{pid, err}
	}()
	s := <-done
	return s.pid, s.err
}

// share gives the session's uid its trees: through idmapped mounts, or
// where this kernel or file system has none, by handing them over (and
// back at the end), which it says once on stderr. A tree another session's
// uid owns is refused either way.
func (p *Plan) share(l *lease, trees []tree, warn io.Writer) (*idmapped, error) {
	for _, t := range trees {
		var st unix.Stat_t
		if err := unix.Fstat(t.fd, &st); err != nil {
			return nil, err
		}
		if st.Uid >= l.lo && st.Uid <= l.hi {
			return nil, fmt.Errorf("%s belongs to uid %d, another session's (still running, or its launcher died while it runs): it cannot be given to this one", t.path, st.Uid)
		}
	}
	m, err := p.idmapTrees(trees, l.uid)
	var no *errNoIDMap
	if err == nil || !errors.As(err, &no) {
		return m, err
	}
	fmt.Fprintf(warn, "sandbox: no idmapped mounts here (%s): the workspace and run directory are handed to uid %d by walking them, before and after the session\n", no.why, l.uid)
	return nil, l.handOver(trees...)
}

// bwrapStatus is one thing bwrap reported on --json-status-fd.
type bwrapStatus struct {
	childPid int    // pid 1 of the session, as the host numbers it
	pidNS    string // the session's pid namespace, as /proc/PID/ns/pid reads
	exitCode int    // the command's status; -1 if this is not the exit report
}

// readStatus parses what bwrap writes on --json-status-fd: first
// {"child-pid": N, ..., "pid-namespace": N, ...} right after the clone, then
// {"exit-code": N} only if the command was started (bwrap 0.8 reports no
// exit code when the setup or the exec failed). It reads to end of file,
// which comes when bwrap exits.
func readStatus(r io.Reader, out chan<- bwrapStatus) {
	defer close(out)
	dec := json.NewDecoder(r)
	for {
		var doc struct {
			ChildPid *int   `json:"child-pid"`
			PidNS    uint64 `json:"pid-namespace"`
			ExitCode *int   `json:"exit-code"`
		}
		if err := dec.Decode(&doc); err != nil {
			io.Copy(io.Discard, r)
			return
		}
		if doc.ChildPid != nil {
			out <- bwrapStatus{childPid: *doc.ChildPid, pidNS: fmt.Sprintf("pid:[%d]", doc.PidNS), exitCode: -1}
		}
		if doc.ExitCode != nil {
			out <- bwrapStatus{exitCode: *doc.ExitCode}
		}
	}
}

// session follows a running session from outside through a pidfd of its
// pid 1, which cannot be fooled by a recycled pid once opened and checked.
type session struct {
	pid1    int // pid 1's host pid, once checked
	pid1FD  int
	readyFD int  // pid 1 writes one byte here once it catches signals
	ready   bool // the byte was read
	gone    bool // pid 1 ended without it: there is no one to tell
}

// started records the session's pid 1 once bwrap has reported it, after
// checking the pid still names a process in the session's pid namespace
// (bwrap may already have reaped it if the command was quick).
func (s *session) started(pid int, pidNS string) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	if ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/pid"); err != nil || ns != pidNS {
		unix.Close(fd)
		return
	}
	s.pid1FD, s.pid1 = fd, pid
}

// checkReady reads, without blocking, whether pid 1 has said it is up.
func (s *session) checkReady() bool {
	if !s.ready && !s.gone {
		var b [1]byte
		n, err := unix.Read(s.readyFD, b[:])
		switch {
		case n == 1:
			s.ready = true
		case n == 0 && err == nil:
			s.gone = true
		}
	}
	return s.ready
}

// kill ends the session at once: through pid 1 when it is known, else
// through bwrap, whose death pid 1's parent-death signal follows.
func (s *session) kill(bwrapPid int) {
	if s.pid1FD >= 0 {
		_ = unix.PidfdSendSignal(s.pid1FD, unix.SIGKILL, nil, 0)
		return
	}
	_ = syscall.Kill(bwrapPid, syscall.SIGKILL)
}

// forward sends sigs to pid 1, which passes them on to the command, and
// reports whether they are dealt with: false while pid 1 is not yet
// catching them (pid 1 of a namespace would drop them).
func (s *session) forward(sigs []syscall.Signal) bool {
	s.checkReady()
	if s.gone {
		return true
	}
	if !s.ready || s.pid1FD < 0 {
		return false
	}
	for _, sig := range sigs {
		// ESRCH once pid 1 has exited: nothing left to tell.
		_ = unix.PidfdSendSignal(s.pid1FD, sig, nil, 0)
	}
	return true
}

// end makes sure the session's pid 1, and with it every process of the pid
// namespace, is gone. bwrap has exited by now: either pid 1 exited and bwrap
// reaped it, or bwrap was killed, and pid 1's parent-death signal is on
// its way; this covers the case where bwrap died before pid 1 had set it.
func (s *session) end() {
	if s.pid1FD < 0 {
		return
	}
	if err := unix.PidfdSendSignal(s.pid1FD, unix.SIGKILL, nil, 0); err != nil {
		return
	}
	// A pidfd polls readable once the process has exited, which for a
	// namespace's pid 1 is after every other process in it was reaped.
	fds := []unix.PollFd{{Fd: int32(s.pid1FD), Events: unix.POLLIN}}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, err := unix.Poll(fds, int(time.Until(deadline)/time.Millisecond)+1)
		if n > 0 || (err != nil && err != unix.EINTR) {
			return
		}
	}
}

func (s *session) close() {
	for _, fd := range []int{s.pid1FD, s.readyFD} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// rawFD is f's descriptor, without File.Fd's switch to blocking mode (which
// would cost readStatus a thread of its own).
func rawFD(f *os.File) uintptr {
	var fd uintptr
	if c, err := f.SyscallConn(); err == nil {
		_ = c.Control(func(d uintptr) { fd = d })
	}
	return fd
}

// lookCommand finds the command as the session will: a path with a slash
// relative to the workspace, else on the session's PATH, each seen through
// the bind table. It returns the path inside the session that pid 1 runs
// and 0, or 127 (not found) or 126 (not executable) and why. A file found
// here may still fail to run inside if a symlink on its way leads outside
// the binds; pid 1 then says so and exits 127 or 126.
func (p *Plan) lookCommand() (string, int, string) {
	name := p.Command[0]
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			name = filepath.Join(p.Workspace, name)
		}
		status, msg := p.executable(p.hostPath(name, 0))
		return name, status, msg
	}
	path := ""
	for _, e := range p.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		inside := filepath.Join(dir, name)
		if status, _ := p.executable(p.hostPath(inside, 0)); status == 0 {
			return inside, 0, ""
		}
	}
	return "", 127, "command not found"
}

// executable says whether hostPath names a file the session may run. In
// the workspace, which the caller controls, it looks beneath the
// workspace's descriptor and follows no link: a link is left for pid 1
// to follow inside, where it means what the session sees, so that root
// never tells the caller about a file outside.
func (p *Plan) executable(hostPath string) (int, string) {
	if hostPath == "" {
		return 127, "command not found"
	}
	var st unix.Stat_t
	var err error
	if rel, ok := strings.CutPrefix(hostPath, p.Workspace+"/"); ok && p.ws != nil {
		var fd int
		fd, err = safepath.OpenBeneath(p.ws.Fd(), rel, unix.O_PATH)
		if errors.Is(err, unix.ELOOP) {
			return 0, ""
		}
		if err == nil {
			err = unix.Fstat(fd, &st)
			unix.Close(fd)
		}
	} else {
		err = unix.Stat(hostPath, &st)
	}
	switch {
	case errors.Is(err, unix.ENOENT):
		return 127, "command not found"
	case err != nil:
		return 126, err.Error()
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return 126, "is a directory"
	case st.Mode&0o111 == 0:
		return 126, "permission denied"
	}
	return 0, ""
}

// hostPath maps a path inside the session to the host path bound there,
// or "" when the session has nothing at that path.
func (p *Plan) hostPath(inside string, depth int) string {
	if depth > 8 {
		return ""
	}
	var best *Bind
	for i := range p.Binds {
		b := &p.Binds[i]
		if within(inside, b.Target) && (best == nil || len(b.Target) > len(best.Target)) {
			best = b
		}
	}
	if best == nil {
		return ""
	}
	rest := strings.TrimPrefix(inside, best.Target)
	switch best.Kind {
	case KindBind, KindROBind:
		return best.Source + rest
	case KindSymlink:
		to := best.Source
		if !filepath.IsAbs(to) {
			to = filepath.Join(filepath.Dir(best.Target), to)
		}
		return p.hostPath(to+rest, depth+1)
	}
	return ""
}

// prepareRunDir makes the run's home/ and tmp/ (0700, the session user's)
// and bundle/. The run directory may be writable by the session user, so
// every step refuses symlinks and works on the descriptor it opened.
func (p *Plan) prepareRunDir() error {
	runFD := p.run.Fd()
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
		err = p.prepareDir(f, d.mode, d.owned, d.empty)
		f.Close()
		if err != nil {
			return err
		}
	}
	if name := p.Session.TokenFile; name != "" {
		// The token is the session user's to read, and no one else's;
		// one another user owns or can write is not the host's grant.
		// A fixed --user was given it by an earlier session.
		uid := os.Geteuid()
		if p.User.Drop && !p.User.Dynamic {
			uid = int(p.User.UID)
		}
		f, err := openInRunDir(p.run, name, uid)
		if err != nil {
			return fmt.Errorf("the token: %w", err)
		}
		defer f.Close()
		fd := int(f.Fd())
		if p.User.Drop && !p.User.Dynamic {
			if err := unix.Fchown(fd, int(p.User.UID), int(p.User.GID)); err != nil {
				return fmt.Errorf("chown the token to %s: %w", p.User.Name, err)
			}
		}
		if err := unix.Fchmod(fd, 0o400); err != nil {
			return fmt.Errorf("chmod the token: %w", err)
		}
	}
	return nil
}

// handedTrees are what a session's own uid is given: the workspace and
// the run directory by the descriptors opened and checked first, home/,
// tmp/ and the token opened beneath the run directory following no link.
// The caller closes the descriptors of all but the first two.
func (p *Plan) handedTrees() ([]tree, error) {
	trees := []tree{{p.ws.Fd(), p.Workspace, true, true}, {p.run.Fd(), p.RunDir, false, true}}
	names := []entry{{"home", unix.O_RDONLY | unix.O_DIRECTORY}, {"tmp", unix.O_RDONLY | unix.O_DIRECTORY}}
	if p.Session.TokenFile != "" {
		names = append(names, entry{p.Session.TokenFile, unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY})
	}
	for _, n := range names {
		fd, err := safepath.OpenBeneath(p.run.Fd(), n.name, n.flags)
		if err != nil {
			for _, t := range trees[2:] {
				unix.Close(t.fd)
			}
			return nil, fmt.Errorf("open %s (never a symlink): %w", filepath.Join(p.RunDir, n.name), err)
		}
		dir := n.flags&unix.O_DIRECTORY != 0
		trees = append(trees, tree{fd, filepath.Join(p.RunDir, n.name), dir, dir})
	}
	return trees, nil
}

// emptyDir removes everything in the directory f, through an os.Root on
// it: a link the previous session left leads nowhere outside.
func emptyDir(f *os.File) error {
	root, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		return fmt.Errorf("--fresh-home: open %s: %w", f.Name(), err)
	}
	defer root.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("--fresh-home: read %s: %w", f.Name(), err)
	}
	for _, n := range names {
		if err := root.RemoveAll(n); err != nil {
			return fmt.Errorf("--fresh-home: empty %s: %w", f.Name(), err)
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return nil
}

func (p *Plan) prepareDir(f *os.File, mode uint32, owned, empty bool) error {
	if empty && p.Config.FreshHome {
		if err := emptyDir(f); err != nil {
			return err
		}
	}
	if empty {
		names, err := f.Readdirnames(1)
		if err != nil && err != io.EOF {
			return fmt.Errorf("read %s: %w", f.Name(), err)
		}
		if len(names) > 0 {
			return fmt.Errorf("%s is not empty: a session starts with an empty HOME (--fresh-home empties it)", f.Name())
		}
	}
	if u := p.User; owned && u.Drop && !u.Dynamic {
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
