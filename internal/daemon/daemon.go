// Package daemon is bushostd: it owns the bus host's home (one daemon per
// home, enforced by a lock), the host's admin token, the broker's store, the
// git service, and the two sockets they are served on. It starts nothing an
// agent controls and serves nothing but the two Unix sockets.
package daemon

import (
	"context"
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
	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/sock"
)

// Options configure a daemon. Zero values mean the documented defaults.
type Options struct {
	// Home is the bus host's home (default ./bus-host), made 0700.
	Home string
	// BrokerDSN selects the broker's store: "" for SQLite in
	// <home>/broker.db, or postgres://... for a shared PostgreSQL.
	BrokerDSN string
	// MaxBundleBytes bounds one pushed bundle (default 256 MiB).
	MaxBundleBytes int64
	// IdleTimeout cuts a push stream that sends nothing this long.
	IdleTimeout time.Duration
	// DrainTimeout bounds how long a stop waits for calls in flight.
	DrainTimeout time.Duration
	// MaxConns and MaxInFlight bound each socket's connections and calls;
	// beyond them a caller gets ResourceExhausted.
	MaxConns    int
	MaxInFlight int
	// SocketGroup, when set, is the group (name or number) given to both
	// sockets and to the home, which becomes 0710: members may reach the
	// sockets (a sandboxed session's user gets it) and nothing else there.
	SocketGroup string
	// Logger receives the daemon's log (default: text on stderr).
	Logger *slog.Logger
}

// Defaults for Options.
const (
	DefaultHome         = "./bus-host"
	DefaultMaxBundle    = 256 << 20
	DefaultIdleTimeout  = 30 * time.Second
	DefaultDrainTimeout = 30 * time.Second
	DefaultMaxConns     = 256
	DefaultMaxInFlight  = 64
)

// File names inside the home (DESIGN.md, "The bus host home").
const (
	GitSocket    = "git.sock"
	BrokerSocket = "broker.sock"
	AdminToken   = "admin.token"
	BrokerDB     = "broker.db"
	ReposDir     = "repos"
	LockFile     = "bushostd.lock"
	gitHomeDir   = "git-home"
)

func (o *Options) fill() {
	if o.Home == "" {
		o.Home = DefaultHome
	}
	if o.MaxBundleBytes == 0 {
		o.MaxBundleBytes = DefaultMaxBundle
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxInFlight == 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
}

// ErrHomeBusy is returned when another process serves the same home.
var ErrHomeBusy = errors.New("home is in use")

// Serve runs the daemon until ctx is cancelled, then drains: calls in
// flight finish (up to DrainTimeout), new calls get Unavailable. It returns
// nil after a clean drain.
func Serve(ctx context.Context, o Options) error {
	o.fill()
	log := o.Logger
	if o.MaxBundleBytes < 0 || o.IdleTimeout < 0 || o.DrainTimeout < 0 || o.MaxConns < 0 || o.MaxInFlight < 0 {
		return errors.New("limits must not be negative")
	}
	gid := -1
	if o.SocketGroup != "" {
		g, err := lookupGroup(o.SocketGroup)
		if err != nil {
			return err
		}
		gid = g
	}
	if err := prepareHome(o.Home, gid); err != nil {
		return err
	}
	lock, err := lockHome(o.Home)
	if err != nil {
		return err
	}
	defer lock.Unlock()

	token, created, err := adminToken(filepath.Join(o.Home, AdminToken))
	if err != nil {
		return err
	}
	if created {
		log.Info("made the host's admin token", "path", filepath.Join(o.Home, AdminToken))
	}

	dsn := o.BrokerDSN
	if dsn == "" {
		dsn = filepath.Join(o.Home, BrokerDB)
	}
	b, err := broker.Open(ctx, broker.Options{DSN: dsn, AdminToken: token})
	if err != nil {
		return fmt.Errorf("open broker: %w", err)
	}
	defer b.Close()

	svc, err := gitd.New(gitd.Options{
		ReposDir:       filepath.Join(o.Home, ReposDir),
		GitHome:        filepath.Join(o.Home, gitHomeDir),
		MaxBundleBytes: o.MaxBundleBytes,
		IdleTimeout:    o.IdleTimeout,
		Authority:      b,
	})
	if err != nil {
		return fmt.Errorf("git service: %w", err)
	}
	if err := svc.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile refs with the broker's log: %w", err)
	}

	gitSrv := newServer(o)
	gitv1.RegisterGitServiceServer(gitSrv, gitd.NewServer(svc))
	brokerSrv := newServer(o)
	brokerv1.RegisterBrokerServiceServer(brokerSrv, broker.NewServer(b))

	gitL, err := listen(o, GitSocket, gid)
	if err != nil {
		return err
	}
	brokerL, err := listen(o, BrokerSocket, gid)
	if err != nil {
		gitL.Close()
		return err
	}

	errc := make(chan error, 2)
	go func() { errc <- gitSrv.Serve(gitL) }()
	go func() { errc <- brokerSrv.Serve(brokerL) }()
	log.Info("serving", "home", o.Home, "git", filepath.Join(o.Home, GitSocket), "broker", filepath.Join(o.Home, BrokerSocket), "pid", os.Getpid())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		log.Error("a server stopped", "err", serveErr)
	}
	log.Info("draining", "timeout", o.DrainTimeout)
	drain(o.DrainTimeout, gitSrv, brokerSrv)
	log.Info("stopped")
	return serveErr
}

// drain stops both servers gracefully: GracefulStop refuses new calls with
// Unavailable and waits for those in flight; past the timeout, Stop cuts them.
func drain(timeout time.Duration, srvs ...*grpc.Server) {
	var wg sync.WaitGroup
	for _, s := range srvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() { s.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(timeout):
				s.Stop()
			}
		}()
	}
	wg.Wait()
}

func newServer(o Options) *grpc.Server {
	lim := sock.NewLimiter(o.MaxInFlight)
	return grpc.NewServer(
		grpc.Creds(sock.PeerCred{}),
		// Bundles come in chunks of at most 1 MiB; nothing legitimate is
		// bigger than that plus framing.
		grpc.MaxRecvMsgSize(2<<20),
		grpc.UnaryInterceptor(lim.Unary),
		grpc.StreamInterceptor(lim.Stream),
	)
}

func listen(o Options, name string, gid int) (net.Listener, error) {
	path := filepath.Join(o.Home, name)
	l, err := sock.Listen(path, 0o660)
	if err != nil {
		return nil, err
	}
	if gid >= 0 {
		if err := os.Lchown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("give %s to group %d: %w", path, gid, err)
		}
	}
	return sock.LimitConns(l, o.MaxConns), nil
}

// lookupGroup resolves a group name or number from /etc/group.
func lookupGroup(name string) (int, error) {
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
func prepareHome(home string, gid int) error {
	uid := os.Geteuid()
	if err := safepath.Parents(home, uid); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Clean(home)), 0o755); err != nil {
		return fmt.Errorf("home %s: %w", home, err)
	}
	if err := os.Mkdir(home, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("home %s: %w", home, err)
	}
	fi, err := os.Lstat(home)
	if err != nil {
		return fmt.Errorf("home %s: %w", home, err)
	}
	if fi.Mode().IsRegular() {
		return fmt.Errorf("home %s is not a directory", home)
	}
	if err := safepath.Dir(home, fi, uid); err != nil {
		return err
	}
	// From here on, work on the directory opened without following a
	// link, so that what was checked is what is changed.
	d, err := os.OpenFile(home, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return safepath.Linked(home, err)
	}
	defer d.Close()
	if fi, err = d.Stat(); err != nil {
		return err
	}
	if err := safepath.Dir(home, fi, uid); err != nil {
		return err
	}
	// What the daemon opens at the top of the home, checked before
	// anything is written there.
	for _, name := range []string{LockFile, AdminToken, BrokerDB, BrokerDB + "-wal", BrokerDB + "-shm"} {
		if err := safepath.IfExists(filepath.Join(home, name), uid, safepath.File); err != nil {
			return err
		}
	}
	if err := safepath.IfExists(filepath.Join(home, ReposDir), uid, safepath.Dir); err != nil {
		return err
	}
	mode := os.FileMode(0o700)
	if gid >= 0 {
		if err := d.Chown(-1, gid); err != nil {
			return fmt.Errorf("home %s: give it to group %d: %w", home, gid, err)
		}
		mode = 0o710
	}
	if fi.Mode().Perm() != mode {
		if err := d.Chmod(mode); err != nil {
			return fmt.Errorf("home %s: make it %04o: %w", home, mode, err)
		}
	}
	repos := filepath.Join(home, ReposDir)
	if err := os.Mkdir(repos, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := safepath.IfExists(repos, uid, safepath.Dir); err != nil {
		return err
	}
	r, err := os.OpenFile(repos, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return safepath.Linked(repos, err)
	}
	defer r.Close()
	return r.Chmod(0o700)
}

// homeLock is the home's lock, held for the daemon's lifetime.
type homeLock struct{ f *os.File }

func (l *homeLock) Unlock() {
	syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	l.f.Close()
}

// lockHome takes the home's lock for the daemon's lifetime and writes our
// pid into it, so that a second daemon can say who holds it. The lock file
// is opened without following a link and must be ours.
func lockHome(home string) (*homeLock, error) {
	path := filepath.Join(home, LockFile)
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
		return nil, fmt.Errorf("%w: %s is served by %s (lock %s)", ErrHomeBusy, home, holder, path)
	}
	l := &homeLock{f: f}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		l.Unlock()
		return nil, fmt.Errorf("lock %s: write pid: %w", path, err)
	}
	return l, nil
}

// adminToken reads the host's token, making it (0600, 32 random bytes) at
// first start. A token file that is a link, another user's, or readable by
// others is refused: it is the host.
func adminToken(path string) (token string, created bool, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err == nil {
		var raw [32]byte
		if _, err := rand.Read(raw[:]); err != nil {
			f.Close()
			os.Remove(path)
			return "", false, err
		}
		tok := hex.EncodeToString(raw[:])
		if _, err := f.WriteString(tok + "\n"); err != nil {
			f.Close()
			os.Remove(path)
			return "", false, fmt.Errorf("write %s: %w", path, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return "", false, err
		}
		return tok, true, f.Close()
	}
	if !errors.Is(err, fs.ErrExist) {
		return "", false, fmt.Errorf("admin token %s: %w", path, safepath.Linked(path, err))
	}
	f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
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
	tok := strings.TrimSpace(string(b))
	if len(tok) < 32 {
		return "", false, fmt.Errorf("admin token %s is too short to be one this daemon made", path)
	}
	return tok, false, nil
}
