package sandbox

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/sandbox/pid1"
	"github.com/bushost/bushost/internal/size"
)

// The capabilities a grant may hold (docs/architecture.md).
const (
	CapPushWorking   = "git.push.working"
	CapReviewRequest = "review.request"
	CapReviewVerdict = "review.verdict"
	CapTaskClose     = "task.close"
	CapEventRecord   = "event.record"
	CapTaskLand      = "task.land"
	// CapSessionLaunch is the role that may launch sessions: only it gets
	// the launch socket.
	CapSessionLaunch = "session.launch"
)

var knownCaps = map[string]bool{
	CapPushWorking: true, CapReviewRequest: true, CapReviewVerdict: true,
	CapTaskClose: true, CapEventRecord: true, CapTaskLand: true, CapSessionLaunch: true,
}

// validRole checks a role name: the rule of business, project and task
// names, and no "..".
func validRole(s string) bool {
	return names.Matches(s) && !strings.Contains(s, "..")
}

// ErrUsage marks a command line that cannot be understood; the caller prints
// the message and exits 2.
var ErrUsage = errors.New("usage")

// Config is what the caller asked for, before any path is checked.
type Config struct {
	RunDir    string
	Workspace string
	// WorkspaceFD, when not 0, is a descriptor of Workspace its caller
	// (sandbox serve) opened and checked: run acts on it, never on the
	// path, and refuses when the path no longer names it.
	WorkspaceFD  int
	Role         string
	Caps         []string
	BrokerSocket string
	GitSocket    string
	// LaunchSocket is sandbox serve's launch.sock, bound (next to the
	// broker socket, where bushost looks for it) only for session.launch.
	LaunchSocket string
	// Net is the session's network: NetNone (the default), NetProxy or
	// NetHost.
	Net string
	// AllowDomains and AllowHosts are the egress policy of --net=proxy;
	// ResolveFile a hosts file the proxy reads before the host's resolver.
	AllowDomains []string
	AllowHosts   []string
	// AllowHostAddrs are the host's own addresses an --allow-domain name
	// may resolve to (by default none: the host is refused like a
	// private range).
	AllowHostAddrs []string
	ResolveFile    string
	// AuditTokenFile is a grant with network.audit the launcher records
	// the egress decisions with; "" logs them to stderr.
	AuditTokenFile string
	EgressConns    int
	EgressIdle     time.Duration
	RO             []string
	Env            []string // NAME=VALUE or NAME (taken from sandbox's own environment)
	User           string   // session user when started as root; "" means the default
	Bushost        string   // "" means: next to the sandbox executable, else on PATH
	Bwrap          string   // "" means /usr/bin/bwrap, else bwrap on PATH
	// Init is the executable bound as the session's pid 1 and run with
	// pid1.Verb; "" means sandbox-init beside this one, else this one
	// (cmd/sandbox hands pid1.Verb to pid1.Main).
	Init string
	JSON bool
	// FreshHome empties RUN/home before the launch, for a run directory
	// whose previous session left it full.
	FreshHome bool
	Limits    Limits
	// AllowAbstractSockets lets a --net session start on a kernel without
	// Landlock's abstract-socket scope, reaching the host's abstract
	// Unix sockets.
	AllowAbstractSockets bool
	// UIDLow-UIDHigh is the range a session's own uid comes from, and
	// StateDir holds its lock files (started as root without --user).
	UIDLow, UIDHigh uint32
	StateDir        string
	// CgroupParents are the cgroup directories of the session that
	// launched this one (sandbox serve passes them): this session's
	// cgroup nests in them, so their limits hold both together.
	CgroupParents []string
	// EndWith is PID:STARTTIME of the launching session's sandbox run:
	// this session ends when that process does.
	EndWith string
	Command []string
}

// HasCap reports whether the role holds capability c.
func (c *Config) HasCap(cap string) bool { return slices.Contains(c.Caps, cap) }

// parseCaps reads a comma-separated list of capabilities, each kept once;
// an empty item is skipped with skipEmpty, else refused as unknown.
func parseCaps(list string, skipEmpty bool) ([]string, error) {
	caps := []string{}
	for _, cp := range strings.Split(list, ",") {
		cp = strings.TrimSpace(cp)
		switch {
		case cp == "" && skipEmpty:
		case !knownCaps[cp]:
			return nil, fmt.Errorf("%w: unknown capability %q (known: %s, %s, %s, %s, %s)", ErrUsage, cp,
				CapPushWorking, CapReviewRequest, CapReviewVerdict, CapTaskClose, CapEventRecord)
		case !slices.Contains(caps, cp):
			caps = append(caps, cp)
		}
	}
	return caps, nil
}

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// ParseFlags reads the flags of "explain" or "run" (verb). run requires a
// command after the flags ("--" is optional but recommended); explain takes
// none.
func ParseFlags(verb string, args []string, stderr io.Writer) (*Config, error) {
	c := &Config{}
	fs := flag.NewFlagSet("sandbox "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var caps string
	c.Net = NetNone
	fs.StringVar(&c.RunDir, "run-dir", "", "the run directory (session.json, bundle/, home/, tmp/)")
	fs.StringVar(&c.Workspace, "workspace", "", "the workspace the session works in (read-write)")
	fs.IntVar(&c.WorkspaceFD, "workspace-fd", 0, "a descriptor of --workspace that the caller (sandbox serve) opened and checked: run binds and hands over that directory, and refuses (PATH_CHANGED) if --workspace no longer names it")
	fs.StringVar(&c.Role, "role", "", "the session's role name")
	fs.StringVar(&caps, "caps", "", "the role's capabilities, comma-separated")
	fs.StringVar(&c.BrokerSocket, "broker-socket", "", "the bus host's broker.sock")
	fs.StringVar(&c.GitSocket, "git-socket", "", "the bus host's git.sock (bound only for git.push.working or review.verdict)")
	fs.StringVar(&c.LaunchSocket, "launch-socket", "", "sandbox serve's launch.sock (bound only for session.launch)")
	fs.Var(netFlag{&c.Net}, "net", "the session's network, always with '=': none (the default: loopback only), proxy (loopback and a relay to an egress proxy that allows only --allow-domain and --allow-host), host (the host's network; --net alone means host; needs Landlock ABI 6 to keep off the host's abstract Unix sockets)")
	fs.Var((*listFlag)(&c.AllowDomains), "allow-domain", "with --net=proxy: let the session reach NAME[:PORT]: the name (api.example.com) or every name under it (*.example.com), on PORT, or without one on 443 and 80, if it resolves to public addresses only, none of them the host's own (repeatable)")
	fs.Var((*listFlag)(&c.AllowHostAddrs), "allow-host-address", "with --net=proxy: let an --allow-domain name resolve to ADDR, one of the host's own addresses (refused by default, as a private range is) (repeatable)")
	fs.Var((*listFlag)(&c.AllowHosts), "allow-host", "with --net=proxy: let the session reach exactly HOST:PORT, even a loopback or private address (repeatable)")
	fs.StringVar(&c.ResolveFile, "resolve-file", "", "with --net=proxy: a hosts(5) file the proxy looks names up in before the host's resolver (tests, air-gapped sites)")
	fs.StringVar(&c.AuditTokenFile, "audit-token-file", "", "with --net=proxy: a grant holding network.audit (bushost grant --cap network.audit --out F) that run records every egress decision with, as network.egress events on its task; the session cannot read it (default: decisions go to stderr)")
	fs.IntVar(&c.EgressConns, "egress-conns", DefaultEgressConns, "with --net=proxy: the most connections the session may hold through the proxy at once")
	fs.DurationVar(&c.EgressIdle, "egress-idle", DefaultEgressIdle, "with --net=proxy: close a proxied connection idle this long")
	fs.BoolVar(&c.AllowAbstractSockets, "allow-abstract-sockets", false, "with --net on a kernel without Landlock ABI 6: start anyway, reaching the host's abstract Unix sockets")
	fs.Var((*listFlag)(&c.RO), "ro", "bind PATH read-only at the same path (repeatable)")
	fs.Var((*listFlag)(&c.Env), "env", "set NAME=VALUE in the session, or pass NAME through (repeatable)")
	fs.StringVar(&c.User, "user", "", "run the session as this fixed user when started as root (default: a uid of its own from --uid-range)")
	uidRange := fmt.Sprintf("%d-%d", DefaultUIDLow, DefaultUIDHigh)
	fs.StringVar(&uidRange, "uid-range", uidRange, "started as root without --user: the range LOW-HIGH a session's own uid comes from")
	fs.StringVar(&c.StateDir, "state-dir", DefaultStateDir, "where the lock file of each session uid in use lives (root's)")
	fs.StringVar(&c.Bushost, "bushost", "", "the bushost client to bind; must exist (default: next to sandbox, else on PATH, else none, with a note)")
	fs.StringVar(&c.Bwrap, "bwrap", "", "the bwrap binary (default /usr/bin/bwrap, else on PATH)")
	fs.Var(size.Value{P: &c.Limits.Memory}, "memory", "the session's memory limit (64M, 1G), through a cgroup; refused where none can be made")
	fs.IntVar(&c.Limits.Pids, "pids", 0, "the most tasks (processes and threads) the session may hold, through a cgroup and RLIMIT_NPROC")
	fs.Float64Var(&c.Limits.CPU, "cpu", 0, "the CPU time the session may use, in CPUs (0.5 = half of one), through a cgroup")
	fs.Uint64Var(&c.Limits.NoFile, "nofile", 0, "RLIMIT_NOFILE: the most open files per session process")
	fs.Var(size.Value{P: &c.Limits.FSize}, "fsize", "RLIMIT_FSIZE: the largest file a session process may write (64M, 1G)")
	fs.Var(size.Value{P: &c.Limits.Disk}, "disk", "what the session may write to its run directory (HOME, /tmp) and a workspace on the same file system, together (64M, 1G): run checks the run directory is on a tmpfs of at most this size (sandbox serve mounts one per session) and refuses otherwise; a workspace elsewhere is outside it")
	fs.DurationVar(&c.Limits.Timeout, "timeout", 0, "end the session after this long (SIGTERM, SIGKILL 5s later); run exits 124")
	fs.Var((*listFlag)(&c.CgroupParents), "cgroup-parent", "a cgroup directory (of the session that launched this one) this session's cgroup nests in, one per cgroup v1 controller; set by sandbox serve (repeatable)")
	fs.StringVar(&c.EndWith, "end-with", "", "PID:STARTTIME of a process (the launching session's sandbox run): end this session when it ends; set by sandbox serve")
	fs.BoolVar(&c.FreshHome, "fresh-home", false, "empty the run directory's home/ before the launch (default: refuse a HOME that is not empty)")
	if verb == "explain" {
		fs.BoolVar(&c.JSON, "json", false, "print the plan as JSON")
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if c.Net != NetProxy && (len(c.AllowDomains) > 0 || len(c.AllowHosts) > 0 || len(c.AllowHostAddrs) > 0 || c.ResolveFile != "" || c.AuditTokenFile != "") {
		return nil, fmt.Errorf("%w: --allow-domain, --allow-host, --allow-host-address, --resolve-file and --audit-token-file need --net=proxy", ErrUsage)
	}
	for _, a := range c.AllowHostAddrs {
		if net.ParseIP(a) == nil {
			return nil, fmt.Errorf("%w: --allow-host-address %q: want an IP address", ErrUsage, a)
		}
	}
	for _, d := range c.AllowDomains {
		if err := bounds.CheckDomainPattern(d); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	for _, h := range c.AllowHosts {
		if err := bounds.CheckHostPort(h); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	if c.EgressConns < 1 || c.EgressIdle <= 0 {
		return nil, fmt.Errorf("%w: --egress-conns must be at least 1 and --egress-idle positive", ErrUsage)
	}
	var err error
	if c.UIDLow, c.UIDHigh, err = ParseUIDRange(uidRange); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	rest := fs.Args()
	switch verb {
	case "run":
		if len(rest) == 0 {
			return nil, fmt.Errorf("%w: sandbox run needs a command after the flags (-- COMMAND...)", ErrUsage)
		}
		c.Command = rest
	default:
		if len(rest) != 0 {
			return nil, fmt.Errorf("%w: sandbox %s takes no arguments, got %q", ErrUsage, verb, rest)
		}
	}
	for _, req := range []struct{ name, v string }{
		{"--run-dir", c.RunDir}, {"--workspace", c.Workspace}, {"--role", c.Role}, {"--broker-socket", c.BrokerSocket},
	} {
		if req.v == "" {
			return nil, fmt.Errorf("%w: %s is required", ErrUsage, req.name)
		}
	}
	if l := c.Limits; l.Memory < 0 || l.Pids < 0 || l.CPU < 0 || l.FSize < 0 || l.Timeout < 0 || (l.Memory > 0 && l.Memory < 4<<20) || (l.Pids > 0 && l.Pids < 4) || l.CPU > 1024 {
		return nil, fmt.Errorf("%w: limits must be positive; --memory at least 4M, --pids at least 4, --cpu at most 1024", ErrUsage)
	}
	if !validRole(c.Role) {
		return nil, fmt.Errorf("%w: role %q: want %s and no '..'", ErrUsage, c.Role, names.Pattern)
	}
	if caps != "" {
		if c.Caps, err = parseCaps(caps, false); err != nil {
			return nil, err
		}
	}
	for _, e := range c.Env {
		name, _, _ := strings.Cut(e, "=")
		if name == "" || strings.ContainsAny(name, " \t\n\x00") {
			return nil, fmt.Errorf("%w: --env %q: want NAME=VALUE or NAME", ErrUsage, e)
		}
	}
	return c, nil
}

// sessionEnv is the whole environment of the session: nothing of the
// caller's leaks in except what --env names.
func (c *Config) sessionEnv(p *Plan) []string {
	env := []string{
		"PATH=" + sessionBinDir + ":/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
		"HOME=" + p.Home,
		"TMPDIR=/tmp",
		"USER=" + p.User.Name,
		"LOGNAME=" + p.User.Name,
		"LANG=C.UTF-8",
	}
	if t, ok := os.LookupEnv("TERM"); ok {
		env = append(env, "TERM="+t)
	}
	// bushost inside needs neither --home nor --token-file: the broker
	// socket's directory is the home it sees (the sockets keep their host
	// paths inside), and the token is the run directory's.
	env = append(env, home.Env+"="+filepath.Dir(p.brokerSocket()))
	if s := p.Session; s != nil {
		if s.TokenFile != "" {
			env = append(env, "BUS_TOKEN_FILE="+filepath.Join(p.RunDir, s.TokenFile))
		}
		if s.Git != nil {
			env = append(env, "GIT_AUTHOR_NAME="+s.Git.Name, "GIT_AUTHOR_EMAIL="+s.Git.Email,
				"GIT_COMMITTER_NAME="+s.Git.Name, "GIT_COMMITTER_EMAIL="+s.Git.Email)
		}
	}
	if c.Net == NetProxy {
		// curl reads only the lowercase http_proxy; others the upper.
		for _, name := range []string{"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"} {
			env = append(env, name+"=http://"+pid1.RelayAddr)
		}
		env = append(env, "all_proxy=socks5h://"+pid1.RelayAddr, "ALL_PROXY=socks5h://"+pid1.RelayAddr, "no_proxy=", "NO_PROXY=")
	}
	for _, e := range c.Env {
		if strings.Contains(e, "=") {
			env = append(env, e)
		} else if v, ok := os.LookupEnv(e); ok {
			env = append(env, e+"="+v)
		}
	}
	return env
}

// PrepareConfig is what `sandbox prepare` was asked for.
type PrepareConfig struct {
	RunDir    string
	Session   SessionFile
	TokenFile string // the token to copy in; read once, never bound
}

// ParsePrepareFlags reads the flags of `sandbox prepare`.
func ParsePrepareFlags(args []string, stderr io.Writer) (*PrepareConfig, error) {
	c := &PrepareConfig{Session: SessionFile{Version: SessionVersion}}
	s := &c.Session
	fs := flag.NewFlagSet("sandbox prepare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var caps, gitName, gitEmail string
	var domains, hosts listFlag
	fs.StringVar(&c.RunDir, "run-dir", "", "the run directory to make (must not exist, or be empty)")
	fs.Var(&domains, "allow-domain", "written to session.json: a --net=proxy session may reach this name or *.NAME (repeatable)")
	fs.Var(&hosts, "allow-host", "written to session.json: a --net=proxy session may reach exactly HOST:PORT (repeatable)")
	fs.StringVar(&s.Business, "business", "", "the task's business")
	fs.StringVar(&s.Project, "project", "", "the task's project")
	fs.StringVar(&s.Task, "task", "", "the task the session works on")
	fs.StringVar(&s.Role, "role", "", "the session's role name")
	fs.StringVar(&caps, "caps", "", "the role's capabilities, comma-separated")
	fs.StringVar(&c.TokenFile, "token-file", "", "the grant's token (bushost grant --out FILE), copied in read-only")
	fs.StringVar(&gitName, "git-name", "", "the author and committer name of the session's commits")
	fs.StringVar(&gitEmail, "git-email", "", "the author and committer email of the session's commits")
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("%w: sandbox prepare takes no arguments, got %q", ErrUsage, fs.Args())
	}
	for _, req := range []struct{ name, v string }{
		{"--run-dir", c.RunDir}, {"--business", s.Business}, {"--project", s.Project}, {"--task", s.Task},
		{"--role", s.Role}, {"--token-file", c.TokenFile},
	} {
		if req.v == "" {
			return nil, fmt.Errorf("%w: %s is required", ErrUsage, req.name)
		}
	}
	for _, n := range []struct{ kind, v string }{{"business", s.Business}, {"project", s.Project}, {"task", s.Task}, {"role", s.Role}} {
		if !validRole(n.v) {
			return nil, fmt.Errorf("%w: %s %q: want %s and no '..'", ErrUsage, n.kind, n.v, names.Pattern)
		}
	}
	var err error
	if s.Caps, err = parseCaps(caps, true); err != nil {
		return nil, err
	}
	if (gitName == "") != (gitEmail == "") {
		return nil, fmt.Errorf("%w: --git-name and --git-email go together", ErrUsage)
	}
	if gitName != "" {
		s.Git = &GitIdentity{Name: gitName, Email: gitEmail}
		if err := s.Git.check(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	if len(domains) > 0 || len(hosts) > 0 {
		s.Network = &SessionNetwork{AllowDomains: domains, AllowHosts: hosts}
		if err := s.Network.check(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrUsage, err)
		}
	}
	s.TokenFile = sessionTokenName
	return c, nil
}
