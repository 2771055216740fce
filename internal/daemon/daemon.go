// Package daemon is bushostd: it owns the bus host's home (one daemon per
// home, enforced by a lock), the host's admin token, the broker's store, the
// git service, and the two sockets they are served on. It starts nothing an
// agent controls and serves nothing but the two Unix sockets.
package daemon

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
	"github.com/bushost/bushost/broker"
	"github.com/bushost/bushost/gitd"
	"github.com/bushost/bushost/internal/cmdline"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/sock"
	"github.com/bushost/bushost/internal/testhook"
)

// Options configure a daemon. Zero values mean the documented defaults.
type Options struct {
	// Home is the bus host's home (default ./bus-host), made 0700.
	Home string
	// BrokerDSN selects the broker's store: "" for SQLite in
	// <home>/broker.db, or postgres://... for a shared PostgreSQL.
	BrokerDSN string
	// BrokerPostgres bounds what this host's connections to a PostgreSQL
	// broker may hold: transactions, lock waits, statements, silence.
	BrokerPostgres broker.PostgresOptions
	// HostID names this host for project placement ("" reads HOME/host-id,
	// made at first start).
	HostID string
	// DrainTimeout bounds how long a stop waits for calls in flight.
	DrainTimeout time.Duration
	// Limits are every bound the daemon, its git service and its broker
	// keep (internal/limits, docs/limits.md): the transport per socket,
	// uid, connection and grant, the objects a push may carry, the quotas
	// on what pushes store and the rates of recorded events. Zero: the
	// defaults.
	limits.Limits
	// SocketGroup, when set, is the group (name or number) given to both
	// sockets and to the home, which becomes 0710: members may reach the
	// sockets (a sandboxed session's user gets it) and nothing else there.
	SocketGroup string
	// CheckpointFile, when set, is where the broker appends each new head
	// of its log ("SEQ HASH" lines, fsynced) and what it checks the log
	// against at start (broker.Options.CheckpointFile).
	CheckpointFile string
	// LogKey is the file holding the key this host signs the broker's
	// events with ("": HOME/log.key), made 0600 at first start;
	// LogTrustedKeys lists the public keys of the other hosts sharing the
	// store ("": none; this host's own key is always trusted). logkey.go.
	LogKey         string
	LogTrustedKeys string
	// Committer is "NAME <EMAIL>" of the merge commits `task land --merge`
	// makes (gitd.DefaultCommitter when empty).
	Committer string
	// MergeTimeout and MergeRenameLimit bound the merge of `task land
	// --merge` (gitd.Options).
	MergeTimeout     time.Duration
	MergeRenameLimit int
	// Housekeeping is "auto" (the default; "" too): each push and landing
	// queues its repository for the background housekeeping of
	// docs/git-service.md; "off": only `bushost repo optimize` housekeeps.
	Housekeeping string
	// Logger receives the daemon's log (default: Observe's format and
	// level on stderr).
	Logger *slog.Logger
	// Observe: logs, metrics, drain grace (observe.go).
	Observe Observe
}

// Defaults for Options.
const DefaultDrainTimeout = 30 * time.Second

func (o *Options) fill() {
	o.Home = cmp.Or(o.Home, home.Default)
	o.DrainTimeout = cmp.Or(o.DrainTimeout, DefaultDrainTimeout)
	o.Limits.Fill()
	o.Observe.DrainGrace = cmp.Or(o.Observe.DrainGrace, DefaultDrainGrace)
}

// ErrHomeBusy is returned when another process serves the same home.
var ErrHomeBusy = errors.New("home is in use")

// Serve runs the daemon until ctx is cancelled, then drains: calls in
// flight finish (up to DrainTimeout), new calls get Unavailable. It returns
// nil after a clean drain.
func Serve(ctx context.Context, o Options) error {
	o.fill()
	// What the daemon makes with a mode of its own (repositories made by
	// git, the broker's files) is never group- or world-writable, whatever
	// umask it was started with: with 000, a project's pool.git came out
	// 0777, and the daemon then refused to serve it. A stricter umask is
	// kept.
	syscall.Umask(syscall.Umask(0o022) | 0o022)
	// Text on stderr is for a person: the next steps go there too.
	person := o.Logger == nil && o.Observe.LogFormat != "json"
	if o.Logger == nil {
		l, err := cmdline.Logger(os.Stderr, o.Observe.LogFormat, o.Observe.LogLevel)
		if err != nil {
			return err
		}
		o.Logger = l
	}
	log := o.Logger
	if o.MaxBundleBytes < 0 || o.DrainTimeout < 0 ||
		o.MaxObjectBytes < 0 || o.MaxCommitBytes < 0 || o.MaxTreeBytes < 0 || o.MaxPackObjects < 0 || o.MaxPushInflated < 0 || o.MaxTreePaths < 0 || o.MaxTreeDepth < 0 || o.MaxTaskBytes < 0 || o.MaxProjectBytes < 0 ||
		o.EventRate < 0 || o.EventBytesRate < 0 || o.MergeTimeout < 0 || o.MergeRenameLimit < 0 || o.EgressRate < 0 || o.EgressBytesRate < 0 || o.Observe.DrainGrace < 0 {
		return errors.New("limits must not be negative")
	}
	if o.MaxTreeDepth > gitd.MaxTreeDepthBound {
		return fmt.Errorf("--max-tree-depth: %d is over %d, git's own core.maxTreeDepth", o.MaxTreeDepth, gitd.MaxTreeDepthBound)
	}
	if o.Housekeeping != "" && o.Housekeeping != "auto" && o.Housekeeping != "off" {
		return fmt.Errorf("--housekeeping: %q is neither auto nor off", o.Housekeeping)
	}
	if o.Committer != "" {
		if _, _, err := gitd.ParseCommitter(o.Committer); err != nil {
			return fmt.Errorf("--committer: %w", err)
		}
	}
	if err := o.Limits.Check(); err != nil {
		return err
	}
	// Go's collector would let the heap grow to twice what is live; keep
	// it near the budget instead (unless the operator set GOMEMLIMIT).
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(budget(o.Limits) + budget(o.Limits)/4)
	}
	gid, err := lookupGroup(o.SocketGroup)
	if err != nil {
		return err
	}
	h := home.At(o.Home)
	if err := prepareHome(h, gid); err != nil {
		return err
	}
	lock, err := lockHome(h)
	if err != nil {
		return err
	}
	defer lock.Close()

	// A home without an admin token is new: it served no log before
	// signing, so it vouches for none. Its key is kept at once and signs
	// nothing at start, whatever the store holds: a database writer that
	// stripped every signature does not get a joining host to sign what
	// it wrote (docs/broker.md, "A log written before signing").
	_, err = os.Lstat(h.AdminToken())
	newHome := errors.Is(err, fs.ErrNotExist)
	hostID, err := hostID(h, o.HostID)
	if err != nil {
		return err
	}
	signingKey, trusted, keyMade, keepKey, err := logKeys(h, o.LogKey, o.LogTrustedKeys, hostID)
	if err != nil {
		return err
	}
	adopt := keyMade && !newHome
	if keyMade && newHome {
		if err := keepKey(); err != nil {
			return err
		}
	}

	token, created, err := adminToken(h.AdminToken())
	if err != nil {
		return err
	}
	if created {
		log.Info("made the host's admin token", "path", h.AdminToken())
	}
	b, err := broker.Open(ctx, broker.Options{DSN: cmp.Or(o.BrokerDSN, h.BrokerDB()), AdminToken: token, Limits: o.Limits, CheckpointFile: o.CheckpointFile, HostID: hostID,
		ReposDir: h.Repos(), Postgres: o.BrokerPostgres,
		SigningKey: signingKey, TrustedKeys: trusted, AdoptUnsigned: adopt})
	if err != nil {
		return fmt.Errorf("open broker: %w", err)
	}
	defer b.Close()
	if keyMade {
		// Kept only now that the broker opened with it, so that a start
		// that failed before makes the same key again and adopts the log.
		if adopt {
			if err := keepKey(); err != nil {
				return err
			}
		}
		log.Info("made the host's log signing key; list its public key in every host's --log-trusted-keys when hosts share the broker",
			"key", broker.KeyID(signingKey.Public().(ed25519.PublicKey)), "public", h.LogPub())
	}
	if n := b.Adopted(); n > 0 {
		log.Info("signed the log's events written before signing", "through_seq", n)
	}
	halted := b.Halted()
	if halted != nil {
		log.Error("the broker refuses to serve; the git service serves fetches only (docs/broker.md, \"When the log does not match\")", "err", halted)
	}

	svc, err := gitd.New(gitd.Options{
		ReposDir:         h.Repos(),
		GitHome:          h.GitHome(),
		Limits:           o.Limits,
		Authority:        b,
		Logger:           log,
		Committer:        o.Committer,
		MergeTimeout:     o.MergeTimeout,
		MergeRenameLimit: o.MergeRenameLimit,
		Housekeeping:     o.Housekeeping != "off",
	})
	if err != nil {
		return fmt.Errorf("git service: %w", err)
	}
	// A log that does not match its checkpoint must not move refs.
	if halted == nil {
		if err := svc.Reconcile(ctx); err != nil {
			return fmt.Errorf("reconcile refs with the broker's log: %w", err)
		}
	}

	// Started after Reconcile, stopped (a run in progress cancelled) once
	// the servers drained.
	stopHousekeeping := svc.StartHousekeeping(ctx)
	defer stopHousekeeping()

	ds := newDrainState()
	grants := newGrantLimiter(o.Limits, token)
	// git.sock takes a pushed bundle's descriptor, unless a test's build
	// plays a daemon from before descriptor passing.
	gitSrv, gitAdm := newServer(o, grants, newObserver("git", log, ds), !testhook.Skipped().FDPassing)
	gitv1.RegisterGitServiceServer(gitSrv, gitd.NewServer(svc))
	brokerSrv, brokerAdm := newServer(o, grants, newObserver("broker", log, ds), false)
	brokerv1.RegisterBrokerServiceServer(brokerSrv, broker.NewServer(b))
	healths := []healthOf{healthFor(gitSrv, gitv1.GitService_ServiceDesc.ServiceName), healthFor(brokerSrv, brokerv1.BrokerService_ServiceDesc.ServiceName)}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchStore(wctx, log, b.Ping, healths)

	inherited, err := inheritedSockets(h)
	if err != nil {
		return err
	}
	gitL, err := listen(h, home.GitSockName, gid, inherited, gitAdm)
	if err != nil {
		return err
	}
	brokerL, err := listen(h, home.BrokerSockName, gid, inherited, brokerAdm)
	if err != nil {
		gitL.Close()
		return err
	}
	if o.Observe.MetricsAddr != "" {
		closeMetrics, err := serveMetrics(o.Observe.MetricsAddr, log)
		if err != nil {
			gitL.Close()
			brokerL.Close()
			return err
		}
		defer closeMetrics()
	}

	errc := make(chan error, 2)
	go func() { errc <- gitSrv.Serve(gitL) }()
	go func() { errc <- brokerSrv.Serve(brokerL) }()
	log.Info("serving", "home", o.Home, "git", h.GitSock(), "broker", h.BrokerSock(), "pid", os.Getpid())
	if person {
		fmt.Fprint(os.Stderr, nextSteps(o.Home))
	}

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		log.Error("a server stopped", "err", serveErr)
	}
	// Probes see NOT_SERVING for the grace, new calls get Unavailable;
	// then the sockets close and calls in flight get DrainTimeout.
	ds.begin(healths)
	log.Info("draining", "grace", o.Observe.DrainGrace, "timeout", o.DrainTimeout)
	if serveErr == nil {
		time.Sleep(o.Observe.DrainGrace)
	}
	ds.end()
	drain(o.DrainTimeout, gitSrv, brokerSrv)
	log.Info("stopped")
	return serveErr
}

// drain stops both servers gracefully: GracefulStop refuses new calls with
// Unavailable and waits for those in flight; past the timeout, Stop cuts them.
func drain(timeout time.Duration, srvs ...*grpc.Server) {
	var wg sync.WaitGroup
	for _, s := range srvs {
		wg.Go(func() {
			done := make(chan struct{})
			go func() { s.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(timeout):
				s.Stop()
			}
		})
	}
	wg.Wait()
}

// newServer is the one place where the transport's bounds are set
// (docs/limits.md gives the memory they add up to): the HTTP/2 settings
// and windows, the admission of connections and calls per socket and uid
// (before a request is read), the request, send and idle deadlines, and
// the per-grant counters; ob logs and counts every call (observe.go). It returns the server and the admission its
// listener must be wrapped in.
func newServer(o Options, grants *grantLimiter, ob *observer, passFDs bool) (*grpc.Server, *sock.Admission) {
	l := o.Limits
	adm := sock.NewAdmission(sock.AdmitLimits{
		MaxConns: l.MaxConns, MaxCalls: l.MaxInFlight,
		MaxConnsPerUID: l.MaxConnsPerUID, MaxCallsPerUID: l.MaxCallsPerUID,
		ReservedConns: l.ReservedConns, ReservedCalls: l.ReservedCalls,
		OwnUID:         os.Getuid(),
		RequestTimeout: l.RequestTimeout,
		SendTimeout:    l.SendTimeout,
	})
	log := o.Logger
	adm.OnRefused(func(r errdefs.Reason) { log.Debug("refused", "reason", r) })
	// git.sock takes a pushed bundle file's descriptor (passFDs).
	srv := adm.Server(passFDs, maxRecvMsg, uint32(l.MaxStreamsPerConn), uint32(l.MaxHeaderBytes), l.IdleTimeout,
		// grpcerr runs first: every error any handler or interceptor
		// returns leaves as its status.
		grpc.ChainUnaryInterceptor(grpcerr.UnaryServer, ob.unary, adm.Unary, grants.unary),
		grpc.ChainStreamInterceptor(grpcerr.StreamServer, ob.stream, adm.Stream, grants.stream),
	)
	return srv, adm
}

// listen makes the socket name in the home, or takes the one the service
// manager passed (its unit sets the mode and group); adm admits its
// connections.
func listen(h home.Home, name string, gid int, inherited map[string]net.Listener, adm *sock.Admission) (net.Listener, error) {
	l, ok := inherited[name]
	if !ok {
		var err error
		if l, err = sock.Listen(h.Path(name), 0o660, gid); err != nil {
			return nil, err
		}
	}
	return adm.Listener(countConns(l, strings.TrimSuffix(name, ".sock"))), nil
}

// lookupGroup resolves a group name or number from /etc/group; "" is
// none (-1).
func lookupGroup(name string) (int, error) {
	if name == "" {
		return -1, nil
	}
	if n, err := strconv.Atoi(name); err == nil && n >= 0 {
		return n, nil
	}
	b, err := os.ReadFile("/etc/group")
	if err != nil {
		return 0, fmt.Errorf("socket group %q: %w", name, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && f[0] == name {
			if n, err := strconv.Atoi(f[2]); err == nil {
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("socket group %q: no such group in /etc/group", name)
}

// prepareHome checks the home as sshd's StrictModes checks a user's
// files (internal/safepath): every directory above it is root's or ours and
// writable by nobody else (a root-owned sticky directory like /tmp
// excepted), and the home itself, never followed if it is a link, is ours
// and writable by nobody else. Then it makes the home 0700 (0710 with the
// socket group, so that the group can reach the sockets but list nothing),
// and repos/ inside it 0700, after the same checks on what is there.
func prepareHome(h home.Home, gid int) error {
	dir := h.Dir()
	uid := os.Geteuid()
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("home %s: %w", dir, err)
	}
	// Opened once, from /, following no link, every directory on the way
	// checked as given (what is missing is made); from here on, work on
	// the descriptor, so that what was checked is what is changed.
	dh, err := safepath.MkdirAll(abs, uid, 0o700)
	if err != nil {
		return err
	}
	d, err := dh.File()
	dh.Close()
	if err != nil {
		return err
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return err
	}
	if err := safepath.Dir(dir, fi, uid); err != nil {
		return err
	}
	// What the daemon opens at the top of the home, checked before
	// anything is written there.
	for _, path := range []string{h.Lock(), h.AdminToken(), h.BrokerDB(), h.BrokerDB() + "-wal", h.BrokerDB() + "-shm", h.HostID()} {
		if err := safepath.IfExists(path, uid, safepath.File); err != nil {
			return err
		}
	}
	for _, path := range []string{h.Repos(), h.GitHome()} {
		if err := safepath.IfExists(path, uid, safepath.Dir); err != nil {
			return err
		}
	}
	mode := os.FileMode(0o700)
	if gid >= 0 {
		if err := d.Chown(-1, gid); err != nil {
			return fmt.Errorf("home %s: give it to group %d: %w", dir, gid, err)
		}
		mode = 0o710
	}
	if fi.Mode().Perm() != mode {
		if err := d.Chmod(mode); err != nil {
			return fmt.Errorf("home %s: make it %04o: %w", dir, mode, err)
		}
	}
	return safepath.MkdirOwned(h.Repos(), uid, 0o700)
}

// lockHome takes the home's lock for the daemon's lifetime and writes our
// pid into it, so that a second daemon can say who holds it. The lock file
// is opened without following a link and must be ours; closing it (no
// child inherits it) lets the lock go.
func lockHome(h home.Home) (*os.File, error) {
	dir, path := h.Dir(), h.Lock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, safepath.Linked(path, err))
	}
	fi, err := f.Stat()
	if err == nil {
		err = safepath.File(path, fi, os.Geteuid())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		holder := "another process"
		if b, err := io.ReadAll(io.LimitReader(f, 64)); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				holder = fmt.Sprintf("bushostd pid %d", pid)
			}
		}
		return nil, errdefs.FailedPrecondition(errdefs.HomeInUse, "%v: %s is served by %s (lock %s)", ErrHomeBusy, dir, holder, path).
			With("home", dir).With("holder", holder).Wrap(ErrHomeBusy)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: write pid: %w", path, err)
	}
	return f, nil
}

// writeNew makes path (never following a link, never over an existing
// file: fs.ErrExist then) with data, on disk when it returns; a file it
// could not finish is removed.
func writeNew(path string, mode os.FileMode, data string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	if _, err = f.WriteString(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// adminToken reads the host's token, making it (0600, 32 random bytes) at
// first start. A token file that is a link, another user's, or readable by
// others is refused: it is the host.
func adminToken(path string) (token string, created bool, err error) {
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", false, err
	}
	tok := hex.EncodeToString(raw[:])
	err = writeNew(path, 0o600, tok+"\n")
	if err == nil {
		return tok, true, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return "", false, fmt.Errorf("admin token %s: %w", path, safepath.Linked(path, err))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", false, fmt.Errorf("admin token %s: %w", path, safepath.Linked(path, err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", false, err
	}
	if err := safepath.File(path, fi, os.Geteuid()); err != nil {
		return "", false, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", false, fmt.Errorf("admin token %s is readable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := io.ReadAll(io.LimitReader(f, 4096))
	if err != nil {
		return "", false, err
	}
	tok = strings.TrimSpace(string(b))
	if len(tok) < 32 {
		return "", false, fmt.Errorf("admin token %s is too short to be one this daemon made", path)
	}
	return tok, false, nil
}
