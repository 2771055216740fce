package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"
	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/gitcmd"
	"github.com/bushost/bushost/internal/metrics"
)

// Service states, as /status reports them.
const (
	StateRunning  = "running"
	StateBackoff  = "backoff"  // exited; restarts after the backoff
	StateStopping = "stopping" // signalled; waiting for it to exit
	StateStopped  = "stopped"
	StateBricked  = "bricked" // crash-looping; not restarted
)

// keptExits is how many recent exits /status shows per service.
const keptExits = 10

// Options are the parts of a run that do not come from the file.
type Options struct {
	// Shim starts the service shim; ShimArg is appended. Default: this
	// executable.
	Shim []string
	// Log receives the supervisor's log and the services' prefixed output.
	// Default: os.Stderr.
	Log io.Writer
	// Ready, if set, is called with the health server's address (or "")
	// once the services have been started.
	Ready func(addr string)
	// LogFormat is "text" (default) or "json"; LogLevel is debug, info
	// (default), warn or error (--log-format, --log-level). In JSON, the
	// services' output lines are JSON records too, whatever the level.
	LogFormat string
	LogLevel  string
}

// ExitRecord is one exit of a service.
type ExitRecord struct {
	At   time.Time `json:"at"`
	Code int       `json:"code"`
	Ran  string    `json:"ran"`
}

// RevertRecord is one attempt at reverting to the good commit.
type RevertRecord struct {
	At      time.Time `json:"at"`
	Service string    `json:"service"`
	Reason  string    `json:"reason"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Commit  string    `json:"commit,omitempty"`
	Error   string    `json:"error,omitempty"`
}

type service struct {
	cfg   *ServiceConfig
	dir   string
	env   []string
	state string
	gen   int
	pid   int
	// startedAt is when the current or last process started.
	startedAt time.Time
	restarts  int
	// Counted for the metrics: exits the supervisor did not ask for, and
	// reverts this service's crash loops caused.
	exitsZero, exitsNonZero int
	reverted, revertsFailed int
	exits                   []ExitRecord
	// crashes are the times of non-zero exits inside crash_window.
	crashes []time.Time
	backoff time.Duration
	// healthySince is zero unless the service runs and its check passes.
	healthySince time.Time
	healthErr    string
	checking     bool
	lastCheck    time.Time
	afterStop    func()
	timer        *time.Timer
}

// Supervisor runs the services of one workspace. Everything below mu is
// changed only by the loop goroutine, holding mu, so that the HTTP handlers
// can read a consistent state.
type Supervisor struct {
	cfg  *Config
	opts Options
	// run starts the services: as the services' user through the launcher
	// init started, or as this process's user.
	run  procRunner
	log  *slog.Logger
	sink *logSink
	repo *Repo
	// notify sends events to notify_url (nil without one); reg is what
	// GET /metrics serves.
	notify *notifier
	reg    *prometheus.Registry

	events chan func()
	closed chan struct{}

	// status is the state as of the last time the loop was free (see
	// Status): what the health endpoints give while it runs git.
	status atomic.Pointer[Status]
	// metrics: the same for GET /metrics (see stateMetrics).
	metrics atomic.Pointer[[]prometheus.Metric]

	mu            sync.Mutex
	services      []*service
	head, good    string
	headChangedAt time.Time
	halted        bool
	haltReason    string
	failedReverts int
	// revertPending: a revert happened and no commit has been good since.
	revertPending bool
	// troubled is the service whose crash loop led to the last revert or
	// halt, named again by the recovery that ends it.
	troubled          string
	halts, recoveries int
	reverts           []RevertRecord
	lastErr           string
	dirtySince        time.Time
	debounce          *time.Timer
	// unrecorded is why the agent's edits could not be committed, ""
	// while the trees are recorded; retry commits again until they are.
	unrecorded string
	retry      *time.Timer
	retryDelay time.Duration
	// awaitingAck is a first commit that adopted a workspace with no
	// history: no commit becomes good until `supervisor ack`.
	awaitingAck string
	haltService string
	// unfinished is the reason of a revert that failed and has not
	// succeeded since: kept in the git dir, so that a restart (whose init
	// restores what only root can, such as an ACL the agent set) finishes
	// it before the services start.
	unfinished string
	// rules keeps AGENTS.md's rules part the host's (nil: not guarded).
	rules *rulesGuard
}

// stopTimer cancels svc's pending restart, kill or revert retry.
func (svc *service) stopTimer() {
	if svc.timer != nil {
		svc.timer.Stop()
		svc.timer = nil
	}
}

// New checks the options; Run does the work.
func New(cfg *Config, opts Options) (*Supervisor, error) {
	if opts.Log == nil {
		opts.Log = os.Stderr
	}
	if len(opts.Shim) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find own executable for the service shim: %w", err)
		}
		opts.Shim = []string{exe}
	}
	sink := &logSink{w: opts.Log, json: opts.LogFormat == "json"}
	log, err := NewLogger(sink, opts.LogFormat, opts.LogLevel)
	if err != nil {
		return nil, err
	}
	var run procRunner = localRunner{shim: opts.Shim}
	if l, err := launcherFromEnv(); err != nil {
		return nil, err
	} else if l != nil {
		run = l
	}
	s := &Supervisor{
		cfg: cfg, opts: opts, sink: sink, run: run,
		log:    log,
		events: make(chan func(), 64),
		closed: make(chan struct{}),
	}
	if cfg.NotifyURL != "" {
		s.notify = newNotifier(cfg.NotifyURL, log)
	}
	s.reg = metrics.NewRegistry()
	s.reg.MustRegister(collector{s})
	for i := range cfg.Services {
		sc := &cfg.Services[i]
		s.services = append(s.services, &service{
			cfg: sc, dir: filepath.Join(cfg.Workspace, sc.Dir), env: serviceEnv(sc),
			state: StateStopped, backoff: cfg.RestartBackoff.Duration,
		})
	}
	return s, nil
}

// NewLogger is the supervisor's log (run's and init's): cmdline's formats
// and levels, and in JSON a duration is written as a Go duration string
// ("1.5s", "250ms"), as the text format writes it, not as nanoseconds.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	l, err := cmdline.Logger(w, format, level)
	if err != nil || format != "json" {
		return l, err
	}
	var lvl slog.Level
	if level != "" {
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return nil, err
		}
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationString})), nil
}

func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// gitTimeout bounds each git operation of the loop.
const gitTimeout = 2 * time.Minute

func (s *Supervisor) gitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), gitTimeout)
}

// Run prepares the repository, starts the services and the health server,
// and supervises until ctx ends; then it stops every service.
func (s *Supervisor) Run(ctx context.Context) error {
	cfg := s.cfg
	// A process of the same uid (a service, when services share it) must
	// not read this one's memory or attach to it: PR_SET_DUMPABLE 0 makes
	// /proc/PID/mem and ptrace need CAP_SYS_PTRACE.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("make the supervisor non-dumpable: %w", err)
	}
	// Files the supervisor and its services create stay writable by the
	// agent's group.
	syscall.Umask(0o002)
	gitHome, err := os.MkdirTemp("", "bushost-supervisor-git-")
	if err != nil {
		return fmt.Errorf("git home: %w", err)
	}
	defer os.RemoveAll(gitHome)
	git, err := gitcmd.New(gitHome)
	if err != nil {
		return err
	}
	s.repo = NewRepo(git.WithTimeout(gitTimeout), cfg.Workspace, cfg.GitDir, cfg.Watch, cfg.Ignore, s.log)
	if err := s.repo.Ensure(ctx); err != nil {
		return err
	}
	state, err := loadState(cfg.GitDir)
	if err != nil {
		return fmt.Errorf("git_dir state: %w", err)
	}
	head, adopted, err := s.repo.InitialCommit(ctx, cfg.Supervisor)
	if err != nil {
		return fmt.Errorf("initial commit: %w", err)
	}
	if adopted {
		state.AwaitingAck = head
		if err := saveState(cfg.GitDir, state); err != nil {
			return fmt.Errorf("git_dir state: %w", err)
		}
		s.log.Error("HISTORY MISSING: the workspace holds files but git_dir held no history (a new or lost git_dir volume?): "+
			"they were committed as found, and no commit becomes good until `supervisor ack` (as root or the supervisor's user) acknowledges them",
			"commit", short(head), "git_dir", cfg.GitDir)
		s.notify.send(Notification{Event: EventHistoryMissing, Workspace: cfg.Workspace, Head: head, Commit: head,
			Reason: "the workspace holds files but git_dir " + cfg.GitDir + " held no history; no commit becomes good until `supervisor ack`"})
	}
	good, err := s.repo.Good(ctx)
	if err != nil {
		return err
	}
	w, err := newWatcher(cfg.Workspace, cfg.Watch, cfg.Ignore, s.log)
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer w.close()
	s.warnUnheard()
	if s.rules, err = newRulesGuard(cfg.Workspace, cfg.GitDir); err != nil {
		s.log.Warn("AGENTS.md's rules part is not guarded", "err", err)
	} else if s.rules != nil {
		defer s.rules.close()
	}
	guard := time.NewTicker(rulesEvery(cfg.Debounce.Duration))
	defer guard.Stop()
	if s.notify != nil {
		nctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { s.notify.run(nctx) })
		defer func() { stop(); wg.Wait() }()
	}

	addr := ""
	if cfg.HealthAddr != "" {
		ln, err := net.Listen("tcp", cfg.HealthAddr)
		if err != nil {
			return fmt.Errorf("health_addr: %w", err)
		}
		defer s.serve(ln, maxHealthConns)()
		addr = ln.Addr().String()
	}
	if cfg.HealthSocket != "" {
		ln, err := listenUnix(cfg.HealthSocket)
		if err != nil {
			return fmt.Errorf("health_socket: %w", err)
		}
		defer s.serve(ln, maxSocketConns)()
	}

	s.mu.Lock()
	s.head, s.good, s.headChangedAt = head, good, time.Now()
	s.debounce = time.NewTimer(time.Hour)
	s.debounce.Stop()
	s.awaitingAck = state.AwaitingAck
	if state.Halted {
		s.halted, s.haltReason, s.haltService, s.troubled = true, state.HaltReason, state.HaltService, state.HaltService
		s.lastErr = "recovery halted (before the last restart): " + state.HaltReason
		s.log.Error("recovery is still halted from before the restart: no reverts until a commit stays healthy for good_after", "reason", state.HaltReason)
	}
	if s.awaitingAck != "" && s.awaitingAck != head {
		s.log.Warn("waiting for `supervisor ack`: no commit becomes good until the adopted one is acknowledged", "adopted", short(s.awaitingAck))
	}
	s.snapshot()
	// Edits made while the supervisor was stopped: committed now, or
	// retried until they can be (files changing under git, a tree that
	// cannot be recorded must not keep the supervisor from starting). No
	// service runs yet: each starts below.
	s.record()
	if state.UnfinishedRevert != "" {
		s.troubled = state.HaltService
		s.finishRevert(state.UnfinishedRevert)
	}
	s.log.Info("supervisor started", "workspace", cfg.Workspace, "head", short(s.head), "good", short(good), "health_addr", addr)
	for _, svc := range s.services {
		s.start(svc)
	}
	s.mu.Unlock()
	if s.opts.Ready != nil {
		s.opts.Ready(addr)
	}

	tick := time.NewTicker(s.tickInterval())
	defer tick.Stop()
	for {
		var step func()
		select {
		case <-ctx.Done():
			s.shutdown()
			return nil
		case step = <-s.events:
		case <-w.dirty:
			step = s.noteDirty
		case <-s.debounce.C:
			step = func() {
				s.dirtySince = time.Time{}
				s.commitEdits()
			}
		case <-guard.C:
			step = s.guardRules
		case <-tick.C:
			step = func() {
				s.checkHealth()
				s.evaluateGood()
				s.snapshot()
			}
		}
		s.locked(step)
	}
}

// locked runs fn holding mu.
func (s *Supervisor) locked(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn()
}

// warnUnheard says loudly, at start, when no one will hear of a revert or
// a halt: notify_url unset, or still a placeholder (a .invalid name, as in
// the seed container's example, never resolves).
func (s *Supervisor) warnUnheard() {
	u, _ := url.Parse(s.cfg.NotifyURL)
	switch {
	case s.cfg.NotifyURL == "":
		s.log.Warn("NO WEBHOOK: notify_url is not set, so reverts, halts and blocked commits reach nobody but this log; set notify_url")
	case u != nil && strings.HasSuffix(u.Hostname(), ".invalid"):
		s.log.Warn("NO WEBHOOK: notify_url is a placeholder that never resolves, so reverts, halts and blocked commits reach nobody but this log; replace it", "notify_url", s.cfg.NotifyURL)
	}
}

// The health listeners hold at most this many connections at once (more
// wait in the kernel's backlog, costing no descriptor of the
// supervisor's), each for a bounded time: whoever floods health_addr
// cannot take the descriptors that git, the watcher and the services'
// pipes need. health_socket, which the agent cannot reach, keeps a cap of
// its own, so that the container's HEALTHCHECK is answered however busy
// health_addr is.
const (
	maxHealthConns = 64
	maxSocketConns = 16
)

// serve answers the health endpoints on ln, and returns what stops it.
func (s *Supervisor) serve(ln net.Listener, maxConns int) func() {
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    8 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	go srv.Serve(netutil.LimitListener(ln, maxConns))
	return func() { srv.Close() }
}

// listenUnix listens on the socket path, replacing a socket left there
// (never anything else).
func listenUnix(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	return ln, nil
}

func (s *Supervisor) tickInterval() time.Duration {
	d := min(time.Second, s.cfg.GoodAfter.Duration/4)
	for _, sc := range s.cfg.Services {
		if sc.Health != nil {
			d = min(d, sc.Health.Interval.Duration)
		}
	}
	return max(d, 10*time.Millisecond)
}

// post runs fn on the loop; it gives up once the loop has stopped.
func (s *Supervisor) post(fn func()) {
	select {
	case s.events <- fn:
	case <-s.closed:
	}
}

// after runs fn on the loop after d.
func (s *Supervisor) after(d time.Duration, fn func()) *time.Timer {
	return time.AfterFunc(d, func() { s.post(fn) })
}

func (s *Supervisor) fail(what string, err error) {
	s.lastErr = fmt.Sprintf("%s: %s: %v", time.Now().Format(time.RFC3339), what, err)
	s.log.Error(what, "err", err)
}

// start runs svc's command under the shim, as the leader of a new process
// group whose parent-death signal reaches the shim.
func (s *Supervisor) start(svc *service) {
	svc.stopTimer()
	// gen counts the starts: each but the first is a restart.
	svc.gen++
	gen := svc.gen
	if gen > 1 {
		svc.restarts++
	}
	now := time.Now()
	svc.startedAt = now
	fail := func(err error) {
		s.fail("start "+svc.cfg.Name, err)
		// Counted as a crash, from outside the loop's current step.
		go s.post(func() { s.exited(svc, gen, 127, time.Now()) })
	}
	r, w, err := os.Pipe()
	if err != nil {
		fail(err)
		return
	}
	pid, done, err := s.run.start(true, svc.cfg.Command, svc.dir, svc.env, w)
	w.Close()
	if err != nil {
		r.Close()
		fail(err)
		return
	}
	svc.pid = pid
	svc.state = StateRunning
	svc.healthErr = ""
	svc.healthySince = time.Time{}
	svc.lastCheck = time.Time{}
	if svc.cfg.Health == nil {
		svc.healthySince = now
	}
	go func() {
		s.sink.copyLines(svc.cfg.Name, r)
		r.Close()
	}()
	go func() {
		code := <-done
		s.post(func() { s.exited(svc, gen, code, time.Now()) })
	}()
	s.log.Info("service started", "service", svc.cfg.Name, "pid", svc.pid, "restarts", svc.restarts)
}

// stop signals svc's group with SIGTERM, then SIGKILL after stop_grace, and
// runs then (if not nil) on the loop once it has exited.
func (s *Supervisor) stop(svc *service, then func()) {
	svc.stopTimer()
	if svc.pid == 0 {
		if svc.state != StateBricked {
			svc.state = StateStopped
		}
		if then != nil {
			then()
		}
		return
	}
	svc.afterStop = then
	if svc.state == StateStopping {
		return
	}
	svc.state = StateStopping
	pid, gen := svc.pid, svc.gen
	s.run.signal(pid, syscall.SIGTERM)
	svc.timer = s.after(s.cfg.StopGrace.Duration, func() {
		if svc.gen == gen && svc.pid == pid {
			s.log.Warn("service ignored SIGTERM; killing its process group", "service", svc.cfg.Name, "pid", pid)
			s.run.signal(pid, syscall.SIGKILL)
		}
	})
}

func (s *Supervisor) restart(svc *service) {
	s.stop(svc, func() { s.start(svc) })
}

// restartAfresh restarts svc with its crash count and backoff reset: the
// tree it runs changed.
func (s *Supervisor) restartAfresh(svc *service) {
	svc.crashes = nil
	svc.backoff = s.cfg.RestartBackoff.Duration
	s.restart(svc)
}

// exited handles the end of generation gen of svc.
func (s *Supervisor) exited(svc *service, gen, code int, at time.Time) {
	if gen != svc.gen {
		return
	}
	svc.stopTimer()
	ran := at.Sub(svc.startedAt)
	svc.pid = 0
	svc.healthySince = time.Time{}
	if svc.state == StateStopping {
		svc.state = StateStopped
		s.log.Info("service stopped", "service", svc.cfg.Name, "code", code)
		if then := svc.afterStop; then != nil {
			svc.afterStop = nil
			then()
		}
		return
	}
	if code == 0 {
		svc.exitsZero++
	} else {
		svc.exitsNonZero++
	}
	svc.exits = append(svc.exits, ExitRecord{At: at, Code: code, Ran: ran.Round(time.Millisecond).String()})
	if len(svc.exits) > keptExits {
		svc.exits = svc.exits[len(svc.exits)-keptExits:]
	}
	if code != 0 {
		svc.crashes = append(slices.DeleteFunc(svc.crashes, func(t time.Time) bool {
			return at.Sub(t) >= s.cfg.CrashWindow.Duration
		}), at)
	}
	if len(svc.crashes) >= s.cfg.CrashThreshold {
		svc.state = StateBricked
		s.log.Error("service is crash-looping: bricked, not restarted", "service", svc.cfg.Name,
			"exits", len(svc.crashes), "window", s.cfg.CrashWindow.Duration, "code", code)
		s.bricked(svc)
		return
	}
	if ran >= s.cfg.MaxBackoff.Duration {
		svc.backoff = s.cfg.RestartBackoff.Duration
	}
	delay := svc.backoff
	svc.backoff = min(2*svc.backoff, s.cfg.MaxBackoff.Duration)
	svc.state = StateBackoff
	s.log.Warn("service exited; restarting after backoff", "service", svc.cfg.Name, "code", code, "ran", ran.Round(time.Millisecond), "backoff", delay)
	svc.timer = s.after(delay, func() {
		if svc.gen == gen && svc.state == StateBackoff {
			s.start(svc)
		}
	})
}

// bricked decides what a crash loop of svc leads to.
func (s *Supervisor) bricked(svc *service) {
	switch {
	case !svc.cfg.IsRevertable():
		s.log.Error("service is not revertable: it stays stopped until an agent edit", "service", svc.cfg.Name)
	case s.halted:
		s.log.Error("recovery is halted: service stays stopped", "service", svc.cfg.Name, "reason", s.haltReason)
	default:
		s.recover(svc, fmt.Sprintf("%s exited non-zero %d times within %v", svc.cfg.Name, len(svc.crashes), s.cfg.CrashWindow.Duration))
	}
}

// recover reverts the tree to the good commit and restarts every service,
// unless max_failed_reverts reverts in a row have not brought health back.
func (s *Supervisor) recover(svc *service, reason string) {
	s.troubled = svc.cfg.Name
	if s.revertPending {
		s.failedReverts++
	}
	if s.failedReverts >= s.cfg.MaxFailedReverts {
		s.halt(svc, fmt.Sprintf("%d consecutive reverts did not bring health back (max_failed_reverts = %d); last: %s",
			s.failedReverts, s.cfg.MaxFailedReverts, reason))
		return
	}
	if s.good == "" {
		s.halt(svc, "no commit has been good yet, so there is nothing to revert to; last: "+reason)
		return
	}
	ctx, cancel := s.gitCtx()
	defer cancel()
	rec := RevertRecord{At: time.Now(), Service: svc.cfg.Name, Reason: reason, From: s.head, To: s.good}
	from, commit, err := s.repo.Revert(ctx, s.good, s.cfg.Agent, s.cfg.Supervisor, reason)
	if errors.Is(err, ErrNothingToRevert) {
		if from != "" && from != s.head {
			s.head, s.headChangedAt = from, time.Now()
		}
		s.halt(svc, err.Error()+"; last: "+reason)
		return
	}
	s.revertPending = true
	if from != "" {
		rec.From = from
	}
	rec.Commit = commit
	if commit != "" {
		s.head, s.headChangedAt = commit, time.Now()
	}
	if err != nil {
		svc.revertsFailed++
		s.noteRevert(rec, "revert", err)
		if s.unfinished == "" {
			s.unfinished = reason
			s.persist()
		}
		// Try again later; each try counts toward max_failed_reverts.
		svc.timer = s.after(s.cfg.RestartBackoff.Duration, func() {
			if svc.state == StateBricked && !s.halted {
				s.recover(svc, reason)
			}
		})
		return
	}
	svc.reverted++
	if s.unfinished != "" {
		s.unfinished = ""
		s.persist()
	}
	s.noteRevert(rec, "", nil)
	for _, other := range s.services {
		s.restartAfresh(other)
	}
}

// finishRevert does, at start, the revert that failed before the restart
// (it was written to the git dir), so that the trees end as the good
// commit before any service runs: what kept it from succeeding may have
// been something only init, as root, could undo.
func (s *Supervisor) finishRevert(reason string) {
	s.unfinished = reason
	if s.good == "" {
		return
	}
	s.log.Warn("finishing the revert that failed before the restart", "good", short(s.good), "reason", reason)
	ctx, cancel := s.gitCtx()
	defer cancel()
	rec := RevertRecord{At: time.Now(), Service: s.troubled, Reason: reason, From: s.head, To: s.good}
	from, commit, err := s.repo.Revert(ctx, s.good, s.cfg.Agent, s.cfg.Supervisor, reason)
	if from != "" {
		rec.From = from
		s.head = from
	}
	if err != nil && !errors.Is(err, ErrNothingToRevert) {
		s.noteRevert(rec, "finish the revert that failed before the restart", err)
		return
	}
	if commit != "" {
		rec.Commit = commit
		s.head, s.headChangedAt = commit, time.Now()
		s.noteRevert(rec, "", nil)
	}
	s.unfinished = ""
	s.persist()
}

// noteRevert keeps rec for /status and tells the log and notify_url of
// it: a revert that made rec.Commit, or one that failed (what, err).
func (s *Supervisor) noteRevert(rec RevertRecord, what string, err error) {
	event := EventRevert
	if err != nil {
		rec.Error, event = err.Error(), EventRevertFailed
		s.fail(what, err)
	} else {
		s.log.Warn("reverted to the good commit", "commit", short(rec.Commit), "good", short(s.good), "reason", rec.Reason)
	}
	s.reverts = append(s.reverts, rec)
	s.notify.send(s.notification(event, rec.Service, rec))
}

// halt stops automatic recovery, loudly; svc's crash loop led to it.
func (s *Supervisor) halt(svc *service, reason string) {
	s.halted, s.haltReason, s.haltService = true, reason, svc.cfg.Name
	s.halts++
	s.persist()
	s.notify.send(s.notification(EventHalt, svc.cfg.Name, RevertRecord{Reason: reason}))
	s.lastErr = "recovery halted: " + reason
	banner := "RECOVERY HALTED: " + reason + ". No more reverts until a commit stays healthy for good_after; bricked services stay stopped until an agent edit."
	s.log.Error(banner)
	if s.sink.json {
		// The record above says it all to a log reader; the banner is for
		// a person reading text.
		return
	}
	bar := strings.Repeat("!", 72)
	for _, l := range []string{bar, banner, bar} {
		s.sink.line("supervisor", []byte(l))
	}
}

// persist writes the halt and the pending acknowledgement to the git dir,
// so that a restart does not forget them.
func (s *Supervisor) persist() {
	p := persisted{AwaitingAck: s.awaitingAck, UnfinishedRevert: s.unfinished}
	if s.unfinished != "" {
		p.HaltService = s.troubled
	}
	if s.halted {
		p.Halted, p.HaltReason, p.HaltService = true, s.haltReason, s.haltService
	}
	if err := saveState(s.cfg.GitDir, p); err != nil {
		s.fail("persist the halt state in git_dir", err)
	}
}

// notification describes an event for notify_url, from the state after
// it; rec carries the commits and the reason of a revert.
func (s *Supervisor) notification(event, service string, rec RevertRecord) Notification {
	return Notification{
		Event: event, At: time.Now(), Workspace: s.cfg.Workspace, Service: service,
		Reason: rec.Reason, Head: s.head, Good: s.good,
		From: rec.From, To: rec.To, Commit: rec.Commit, Error: rec.Error,
	}
}

// noteDirty (re)arms the debounce: commit once edits pause for debounce, or
// at the latest 10 debounces after the first edit of a burst.
func (s *Supervisor) noteDirty() {
	now := time.Now()
	if s.dirtySince.IsZero() {
		s.dirtySince = now
	}
	d := s.cfg.Debounce.Duration
	if left := s.dirtySince.Add(10 * d).Sub(now); left < d {
		d = max(left, 0)
	}
	s.debounce.Reset(d)
}

// commitEdits records the agent's edits and restarts the services they
// touch, plus every bricked one (the edit may be its fix).
func (s *Supervisor) commitEdits() {
	paths := s.record()
	if len(paths) == 0 {
		return
	}
	touches := func(svc *service) bool {
		return slices.ContainsFunc(paths, func(p string) bool { return under(p, svc.cfg.Dir) })
	}
	// A path no service's dir holds may be shared by any of them.
	shared := slices.ContainsFunc(paths, func(p string) bool {
		return !slices.ContainsFunc(s.services, func(svc *service) bool { return under(p, svc.cfg.Dir) })
	})
	for _, svc := range s.services {
		if shared || touches(svc) || svc.state == StateBricked {
			s.restartAfresh(svc)
		}
	}
}

// record commits the agent's edits, or notes why it could not (and
// retries); it returns the paths of a commit it made.
func (s *Supervisor) record() []string {
	ctx, cancel := s.gitCtx()
	defer cancel()
	commit, paths, err := s.repo.CommitPending(ctx, s.cfg.Agent)
	if err != nil {
		s.unrecordedBy(err)
		return nil
	}
	s.recorded()
	if commit == "" {
		return nil
	}
	s.head, s.headChangedAt = commit, time.Now()
	s.log.Info("committed agent edits", "commit", short(commit), "files", len(paths), "first", paths[0])
	return paths
}

// maxCommitRetry bounds the delay between tries of a commit that failed.
const maxCommitRetry = 30 * time.Second

// unrecordedBy notes that the agent's edits could not be committed, says
// so once per distinct reason (a tree that cannot be recorded also to
// notify_url), and tries again after a delay that doubles up to
// maxCommitRetry: an edit is never left unrecorded because one try failed.
func (s *Supervisor) unrecordedBy(err error) {
	msg := err.Error()
	if msg != s.unrecorded {
		s.fail("commit agent edits (retried until they are recorded)", err)
		var be *BlockedError
		if errors.As(err, &be) {
			s.notify.send(Notification{Event: EventCommitBlocked, Workspace: s.cfg.Workspace, Head: s.head, Good: s.good, Reason: msg})
		}
	}
	s.unrecorded = msg
	if s.retryDelay == 0 {
		s.retryDelay = max(s.cfg.Debounce.Duration, 100*time.Millisecond)
	} else {
		s.retryDelay = min(2*s.retryDelay, maxCommitRetry)
	}
	if s.retry != nil {
		s.retry.Stop()
	}
	s.retry = s.after(s.retryDelay, func() {
		if s.unrecorded != "" {
			s.commitEdits()
		}
	})
}

// recorded notes that the trees are recorded again.
func (s *Supervisor) recorded() {
	if s.unrecorded != "" {
		s.log.Info("the agent's edits are recorded again")
	}
	s.unrecorded, s.retryDelay = "", 0
	if s.retry != nil {
		s.retry.Stop()
		s.retry = nil
	}
}

func under(p, dir string) bool {
	return dir == "." || p == dir || strings.HasPrefix(p, dir+"/")
}

// checkHealth starts the checks that are due.
func (s *Supervisor) checkHealth() {
	now := time.Now()
	for _, svc := range s.services {
		h := svc.cfg.Health
		if h == nil || svc.state != StateRunning || svc.checking || now.Sub(svc.lastCheck) < h.Interval.Duration {
			continue
		}
		svc.checking, svc.lastCheck = true, now
		gen := svc.gen
		go func() {
			err := probe(context.Background(), h, svc.dir, svc.env, s.run)
			s.post(func() {
				svc.checking = false
				if gen != svc.gen || svc.state != StateRunning {
					return
				}
				if err != nil {
					if !svc.healthySince.IsZero() || svc.healthErr == "" {
						s.log.Warn("health check failing", "service", svc.cfg.Name, "err", err)
					}
					svc.healthySince, svc.healthErr = time.Time{}, err.Error()
					return
				}
				if svc.healthySince.IsZero() {
					s.log.Info("service healthy", "service", svc.cfg.Name)
					svc.healthySince = time.Now()
				}
				svc.healthErr = ""
			})
		}()
	}
}

// evaluateGood moves refs/supervisor/good to HEAD once every revertable
// service has been healthy under it for good_after.
func (s *Supervisor) evaluateGood() {
	if s.head == "" || s.head == s.good {
		return
	}
	since := s.headChangedAt
	for _, svc := range s.services {
		if !svc.cfg.IsRevertable() {
			continue
		}
		if svc.state != StateRunning || svc.healthySince.IsZero() {
			return
		}
		if svc.healthySince.After(since) {
			since = svc.healthySince
		}
	}
	if time.Since(since) < s.cfg.GoodAfter.Duration {
		return
	}
	if s.awaitingAck != "" {
		if !acknowledged(s.cfg.GitDir, s.awaitingAck) {
			return
		}
		s.log.Warn("the adopted commit was acknowledged (supervisor ack)", "commit", short(s.awaitingAck))
		s.awaitingAck = ""
		s.persist()
	}
	ctx, cancel := s.gitCtx()
	defer cancel()
	if err := s.repo.SetGood(ctx, s.head, s.good); err != nil {
		// The good commit in memory stays what it was: the revert target
		// comes from the supervisor's own state, never from what the ref
		// happens to hold after a failed update.
		s.fail("advance good commit", err)
		return
	}
	s.log.Info("commit is good", "commit", short(s.head), "healthy_for", s.cfg.GoodAfter.Duration)
	s.good = s.head
	if s.revertPending || s.halted {
		s.recoveries++
		s.log.Info("recovered: a commit stayed healthy after a revert or a halt", "commit", short(s.head), "service", s.troubled)
		s.notify.send(s.notification(EventRecovery, s.troubled, RevertRecord{Commit: s.head}))
	}
	s.failedReverts, s.revertPending = 0, false
	if s.unfinished != "" {
		s.unfinished = ""
		s.persist()
	}
	if s.halted {
		s.halted, s.haltReason, s.haltService = false, "", ""
		s.persist()
		s.log.Warn("recovery resumed: a commit stayed healthy", "commit", short(s.head))
	}
}

// shutdown stops every service and waits for them, at most stop_grace plus
// a second.
func (s *Supervisor) shutdown() {
	defer close(s.closed)
	s.locked(func() {
		s.debounce.Stop()
		s.log.Info("supervisor stopping services")
		for _, svc := range s.services {
			s.stop(svc, nil)
		}
	})
	// kill signals each service still running; it reports whether any is.
	kill := func(sig syscall.Signal) (running bool) {
		s.locked(func() {
			for _, svc := range s.services {
				if svc.pid != 0 {
					running = true
					if sig != 0 {
						s.run.signal(svc.pid, sig)
					}
				}
			}
		})
		return running
	}
	deadline := time.After(s.cfg.StopGrace.Duration + time.Second)
	for kill(0) {
		select {
		case fn := <-s.events:
			s.locked(fn)
		case <-deadline:
			kill(syscall.SIGKILL)
			return
		}
	}
}
