package launch

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/sandbox"
	"github.com/bushost/bushost/internal/sock"
)

// ServeFlags reads the flags of `sandbox serve`.
func ServeFlags(args []string, stderr io.Writer) (*Options, error) {
	o := &Options{}
	fs := flag.NewFlagSet("sandbox serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Home, "home", "", "the launcher's home, where it serves launch.sock (default $BUSHOST_HOME, else /var/lib/bushost)")
	fs.StringVar(&o.State, "launch-state", "", "the launcher's state directory: launch.lock, sessions/ and all root writes per session; every directory of its path root's and writable by root alone (default: the home when it is root's, else "+StateBase+"/HASH-OF-HOME)")
	fs.StringVar(&o.Sandbox, "sandbox", "", "the sandbox executable sessions run with (sandbox serve sets it to itself)")
	fs.StringVar(&o.BusHome, "bus-home", "", "bushostd's home: broker.sock, git.sock and the host's admin.token (default --home)")
	fs.IntVar(&o.MaxPerGrant, "max-sessions-per-grant", 8, "sessions one launcher grant may run at once")
	fs.IntVar(&o.MaxSessions, "max-sessions", 64, "sessions the host runs at once (0: no bound)")
	fs.IntVar(&o.KeepEnded, "keep-ended", DefaultKeepEnded, "ended sessions kept per launcher grant (listed, waited for, their logs served); older ones are forgotten and their directories removed")
	fs.IntVar(&o.MaxDepth, "max-launch-depth", 1, "how deep launches may go: 1 lets only the host's grants launch; 2 lets a session they launch hold session.launch too")
	fs.StringVar(&o.UIDRange, "uid-range", "", "passed to sandbox run: the range sessions' uids come from")
	fs.StringVar(&o.StateDir, "state-dir", "", "passed to sandbox run: where uid leases are kept")
	fs.DurationVar(&o.StopGrace, "stop-grace", 10*time.Second, "session stop: how long after SIGTERM before SIGKILL")
	fs.DurationVar(&o.KeepWorkspaces, "keep-workspaces", 24*time.Hour, "how long the workspace the launcher made for a session (and, with --disk, its disk) is kept after the session ended; 0 keeps it until session rm")
	defaults := map[string]*string{}
	for _, l := range bounds.Limits {
		defaults[l.Name] = fs.String("default-"+l.Name, l.Default, fmt.Sprintf("the --%s a launch naming none gets, and the ceiling of a grant that names none (--launch-max-%s): %s; 'none' for no default", l.Name, l.Name, l.Help))
	}
	o.Sock = DefaultSockLimits()
	o.Sock.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.Defaults = bounds.Values{}
	for name, v := range defaults {
		if *v == "none" || *v == "" {
			continue
		}
		l, _ := bounds.Lookup(name)
		n, err := l.Parse(*v)
		if err != nil {
			return nil, fmt.Errorf("--default-%s: %v", name, err)
		}
		o.Defaults[name] = n
	}
	if err := o.Sock.check(); err != nil {
		return nil, err
	}
	if o.UIDRange != "" {
		if _, _, err := sandbox.ParseUIDRange(o.UIDRange); err != nil {
			return nil, err
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.Home = cmp.Or(o.Home, os.Getenv(home.Env), home.LauncherDefault)
	if o.Sandbox == "" {
		return nil, errors.New("--sandbox is required: start the launcher as `sandbox serve`")
	}
	if o.KeepWorkspaces < 0 {
		return nil, errors.New("--keep-workspaces must not be negative")
	}
	if o.MaxPerGrant < 1 || o.MaxSessions < 0 || o.MaxDepth < 1 || o.KeepEnded < 1 {
		return nil, errors.New("--max-sessions-per-grant, --max-launch-depth and --keep-ended must be at least 1, --max-sessions at least 0")
	}
	return o, nil
}

// Serve is `sandbox serve` (which execs `bushostd launcher --sandbox
// ITSELF`, since the sandbox binary links no gRPC): it serves LaunchService on HOME/launch.sock
// until SIGTERM or SIGINT, and returns the exit status. The sessions it
// started keep running when it stops, however it stops.
func Serve(args []string, stderr io.Writer) int {
	o, err := ServeFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "sandbox serve: %v\n", err)
		}
		return 2
	}
	if err := serve(o, stderr); err != nil {
		fmt.Fprintf(stderr, "sandbox serve: %v\n", err)
		return 1
	}
	return 0
}

func serve(o *Options, stderr io.Writer) error {
	if os.Geteuid() != 0 {
		return errors.New("must run as root: it gives each session a uid of its own")
	}
	o.Log = stderr
	// Root's files here, and the sessions it starts (which inherit it),
	// are never group- or world-writable by a umask it was given: with
	// 000, what a session made in its workspace was anyone's to rewrite.
	// A stricter umask is kept.
	syscall.Umask(syscall.Umask(0o022) | 0o022)
	// The defaults are given to every launch naming none: a host that
	// cannot apply them would start sessions that are refused at once.
	if err := sandbox.ProbeCgroup(sandbox.LimitsOf(o.Defaults)); err != nil {
		return fmt.Errorf("the default limits cannot be applied on this host (%v): give sandbox serve --default-memory none --default-pids none --default-cpu none, or make a cgroup available", err)
	}
	// One launcher per state directory: two would both adopt the same
	// sessions.
	abs, state, lock, err := openHome(o.Home, o.State)
	if err != nil {
		return err
	}
	defer lock.Close()
	o.Home, o.State = abs, state
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("another sandbox serve runs on %s (state %s): %w", o.Home, o.State, err)
	}
	if disk, ok := o.Defaults["disk"]; ok {
		// As for the cgroup: a default disk that cannot be mounted here
		// would refuse every launch naming none.
		if err := sandbox.ProbeDisk(home.At(o.State).ProbeDisk(), disk); err != nil {
			return fmt.Errorf("the default --disk cannot be applied on this host (%v): give sandbox serve --default-disk none, or let it mount a tmpfs", err)
		}
	}
	s, err := New(*o)
	if err != nil {
		return err
	}
	defer s.Close()
	path := home.At(o.Home).LaunchSock()
	// The socket group is bushostd's: whoever may reach broker.sock may
	// reach the launcher, whose every call the broker's grant then rules.
	// broker.sock is looked at, not through: a link there names no group.
	gid := -1
	if st, err := os.Lstat(home.At(s.o.BusHome).BrokerSock()); err == nil && st.Mode()&os.ModeSocket != 0 {
		gid = int(st.Sys().(*syscall.Stat_t).Gid)
	}
	l, err := sock.Listen(path, 0o660, gid)
	if err != nil {
		return err
	}
	srv, adm := newServer(o.Sock, s.admin)
	l = adm.Listener(l)
	// The launcher's own memory: what the socket's bounds let callers
	// make it hold, as a soft limit the collector keeps to.
	debug.SetMemoryLimit(o.Sock.Budget() * 5 / 4)
	launchv1.RegisterLaunchServiceServer(srv, s)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Stop() // a Wait in flight would hold a graceful stop forever
	}()
	fmt.Fprintf(stderr, "sandbox serve: serving %s, state in %s\n", path, o.State)
	return srv.Serve(l)
}
