package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/sandbox/pid1"
)

// Where the sandbox puts its own files inside the session. They live in the
// session's root (a tmpfs made read-only at the end), not under any host
// path, so a build directory under the host's /tmp still works.
const (
	sessionDir    = "/run/sandbox"
	sessionBinDir = sessionDir + "/bin"
)

// Bind kinds, named after the bwrap option each becomes.
const (
	KindROBind    = "ro-bind"
	KindBind      = "bind"
	KindSymlink   = "symlink"
	KindProc      = "proc"
	KindDev       = "dev"
	KindRemountRO = "remount-ro"
)

// Bind is one line of the bind table: what the session gets and why.
type Bind struct {
	Kind   string `json:"kind"`
	Source string `json:"source,omitempty"`
	Target string `json:"target"`
	Why    string `json:"why"`
}

// Flag is a hardening option given to bwrap, and why.
type Flag struct {
	Flag string `json:"flag"`
	Why  string `json:"why"`
}

// Plan is a checked Config: the bind table in mount order and everything
// else bwrap is told. Building it reads the file system but changes nothing.
type Plan struct {
	Config     *Config  `json:"-"`
	User       User     `json:"user"`
	Binds      []Bind   `json:"binds"`
	Namespaces []string `json:"namespaces"`
	Hardening  []Flag   `json:"hardening"`
	// SocketGroups are the groups added to the session user for the bound
	// sockets, each with why.
	SocketGroups []SocketGroup `json:"socket_groups,omitempty"`
	Notes        []string      `json:"notes,omitempty"`
	// Problems would make the launch fail or the session unusable; explain
	// shows them, run refuses.
	Problems []string `json:"problems,omitempty"`

	Bwrap     string   `json:"bwrap"`
	Workspace string   `json:"workspace"`
	RunDir    string   `json:"run_dir"`
	Home      string   `json:"home"`
	Tmp       string   `json:"tmp"`
	Env       []string `json:"-"` // values may be secrets: explain shows names

	Command []string `json:"command,omitempty"`
	// PeakMemory is, once Run has returned, the most memory the session's
	// cgroup used (bytes; 0 without --memory or when it cannot be read).
	PeakMemory int64 `json:"-"`
	// Limits are the session's resource bounds (zero: none).
	Limits Limits `json:"limits"`
	// ScopeAbstract: pid 1 scopes the command off abstract Unix sockets.
	ScopeAbstract bool `json:"scope_abstract_unix,omitempty"`
	// Share says how a session with a uid of its own is given its trees
	// (idmapped mounts, or the walk and why), as explain finds it.
	Share string `json:"share,omitempty"`
	// Network is the session's network mode and egress policy.
	Network Network `json:"network"`
	// Session is the run directory's session.json.
	Session *SessionFile `json:"session"`
	initExe string
	// bushostExe is the client bound into the session ("" if none), which
	// run also records egress decisions with.
	bushostExe string
	// busSockets are the bound broker and git sockets: the only binds
	// whose group the session user is given.
	busSockets []string
	// busFDs hold busSockets, each opened once without following a link
	// and checked to be a socket: bwrap binds these (--ro-bind-fd), never
	// the names again, which the home's owner may swap meanwhile.
	busFDs []int
	// ws and run are the workspace and the run directory, each opened
	// once and checked (internal/safepath): what run hands over, binds
	// and hands back.
	ws, run *safepath.Handle
}

// Close lets go of the workspace's and the run directory's descriptors.
func (p *Plan) Close() {
	p.ws.Close()
	p.run.Close()
	for _, fd := range p.busFDs {
		unix.Close(fd)
	}
	p.busFDs = nil
}

// reserved are session paths the sandbox builds itself; a caller path on
// or under one would be hidden by it or would replace it.
var reserved = []string{"/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/proc", "/dev", "/tmp", "/run/sandbox"}

// BuildPlan checks cfg against the file system and lays out the session.
func BuildPlan(cfg *Config) (*Plan, error) {
	u, err := sessionUser(cfg.User)
	if err != nil {
		return nil, err
	}
	p := &Plan{Config: cfg, User: u, Command: cfg.Command, Limits: cfg.Limits}
	if p.Bwrap, err = findBwrap(cfg.Bwrap); err != nil {
		return nil, err
	}
	if p.ws, err = openWorkspace(cfg); err != nil {
		return nil, err
	}
	p.Workspace = p.ws.Path()
	if p.run, err = openRunDir(cfg); err != nil {
		return nil, err
	}
	p.RunDir = p.run.Path()
	if within(p.Workspace, p.RunDir) || within(p.RunDir, p.Workspace) {
		return nil, fmt.Errorf("workspace %s and run directory %s must not contain one another: the workspace leaves as a bundle, the run directory must not go with it", p.Workspace, p.RunDir)
	}
	p.Home = filepath.Join(p.RunDir, "home")
	p.Tmp = filepath.Join(p.RunDir, "tmp")
	sessionJSON := filepath.Join(p.RunDir, "session.json")
	if p.Session, err = readSessionFile(p.run); err != nil {
		return nil, err
	}
	broker, err := p.callerSocket("broker socket", cfg.BrokerSocket)
	if err != nil {
		return nil, err
	}

	system, err := systemBinds()
	if err != nil {
		return nil, err
	}
	p.Binds = append(system,
		Bind{KindProc, "", "/proc", "a /proc of the session's own pid namespace: it lists the session's processes and no host process"},
		Bind{KindDev, "", "/dev", "a minimal /dev (null, zero, full, random, urandom, tty, a private pts): no host device"},
		Bind{KindBind, p.Tmp, "/tmp", "the session's private /tmp, on disk in the run directory so the host can read it after the session"},
	)
	if cfg.Limits.Disk > 0 {
		// bwrap's /dev is a tmpfs of its own, writable by the session:
		// with a disk, everything it writes is on that disk.
		p.Binds = append(p.Binds,
			Bind{KindBind, p.Tmp, "/dev/shm", "--disk: POSIX shared memory in the session's /tmp, on its disk, so that it counts against --disk"},
			Bind{KindRemountRO, "", "/dev", "--disk: nothing else is written to /dev's own tmpfs, which --disk would not bound"},
		)
	}

	caller := []Bind{
		{KindBind, p.Workspace, p.Workspace, "the workspace: the session's work, which leaves only as a git bundle pushed through the git socket; bound from the descriptor opened and checked first (bwrap --bind-fd), never from the path again"},
		{KindBind, p.RunDir, p.RunDir, "the run directory: HOME (home/) and /tmp (tmp/) live here, so the host keeps them after the session"},
		{KindROBind, filepath.Join(p.RunDir, "bundle"), filepath.Join(p.RunDir, "bundle"), "bundles the host hands to the session (a review's fetch); read-only so the session cannot forge them"},
		{KindROBind, sessionJSON, sessionJSON, "the host's description of the session; read-only so the session cannot rewrite what the host will trust"},
		{KindROBind, broker, broker, "the broker socket: events, reviews and task.close, each checked against the role's grant"},
	}
	switch {
	case !cfg.HasCap(CapPushWorking) && !cfg.HasCap(CapReviewVerdict):
		if cfg.GitSocket != "" {
			p.Notes = append(p.Notes, fmt.Sprintf("git socket %s not bound: role %s holds neither %s nor %s", cfg.GitSocket, cfg.Role, CapPushWorking, CapReviewVerdict))
		}
	case cfg.GitSocket == "":
		p.Notes = append(p.Notes, fmt.Sprintf("no --git-socket given: role %s holds a git capability but the session cannot push or fetch", cfg.Role))
	default:
		gs, err := p.callerSocket("git socket", cfg.GitSocket)
		if err != nil {
			return nil, err
		}
		caller = append(caller, Bind{KindROBind, gs, gs, fmt.Sprintf("the git socket, because role %s holds %s: pushes and fetches as bundles, checked by the host", cfg.Role, gitCapsOf(cfg))})
	}
	switch {
	case !cfg.HasCap(CapSessionLaunch):
		if cfg.LaunchSocket != "" {
			p.Notes = append(p.Notes, fmt.Sprintf("launch socket %s not bound: role %s does not hold %s", cfg.LaunchSocket, cfg.Role, CapSessionLaunch))
		}
	case cfg.LaunchSocket == "":
		p.Notes = append(p.Notes, fmt.Sprintf("no --launch-socket given: role %s holds %s but the session cannot launch", cfg.Role, CapSessionLaunch))
	default:
		ls, err := p.callerSocket("launch socket", cfg.LaunchSocket)
		if err != nil {
			return nil, err
		}
		// Beside the broker socket, in the home bushost sees inside.
		caller = append(caller, Bind{KindROBind, ls, home.At(filepath.Dir(broker)).LaunchSock(),
			fmt.Sprintf("the launch socket, because role %s holds %s: sessions from the grant's launch set, checked by sandbox serve", cfg.Role, CapSessionLaunch)})
	}
	for _, r := range cfg.RO {
		rp, err := callerPath("--ro path", r)
		if err != nil {
			return nil, err
		}
		caller = append(caller, Bind{KindROBind, rp, rp, "asked for with --ro by the host that started the session"})
	}
	// A parent must be mounted before its children, or it would hide them.
	slices.SortStableFunc(caller, func(a, b Bind) int { return depth(a.Target) - depth(b.Target) })
	p.Binds = append(p.Binds, caller...)

	bushost, note, err := findBushost(cfg.Bushost)
	if err != nil {
		return nil, err
	}
	p.bushostExe = bushost
	if bushost != "" {
		p.Binds = append(p.Binds, Bind{KindROBind, bushost, sessionBinDir + "/bushost", "the bushost client, the session's only way to push, fetch and talk to the broker; first on PATH"})
	} else {
		p.Notes = append(p.Notes, note)
	}
	initWhich := ""
	if p.initExe, initWhich, err = initExecutable(cfg.Init); err != nil {
		return nil, err
	}
	p.Binds = append(p.Binds,
		Bind{KindROBind, p.initExe, initPath, initWhich + ", run as the session's pid 1: it dies with the bwrap process outside, reaps orphans, forwards SIGTERM, SIGINT and the like to the command and exits with its status"},
		Bind{KindRemountRO, "", "/", "the root bwrap built is made read-only: nothing but the workspace, the run directory and /tmp is writable"},
	)

	p.Namespaces = []string{"user", "pid", "ipc", "uts", "cgroup"}
	p.Network = Network{Mode: cfg.Net}
	switch cfg.Net {
	case NetNone:
		p.Network.Why = "a network namespace of its own with only a loopback: no route anywhere"
	case NetProxy:
		p.Network.Why = "a network namespace of its own with only a loopback, where pid 1 makes a socket listening on " + pid1.RelayAddr + " and hands it to the egress proxy run keeps outside, which serves it (HTTP with CONNECT, SOCKS5), allows only what is listed here and resolves names itself"
		p.Network.Relay = pid1.RelayAddr
		p.Network.Limits = fmt.Sprintf("at most %d connections at once (--egress-conns; one more gets HTTP 503 EGRESS_CONNECTIONS_EXHAUSTED), each closed once idle both ways for %s (--egress-idle)", cfg.EgressConns, cfg.EgressIdle)
		p.Network.Audit = "sandbox run's stderr, a line per decision and per close (no --audit-token-file)"
		if cfg.AuditTokenFile != "" {
			p.Network.Audit = "the broker: a network.egress event per decision and per close, on the task of " + cfg.AuditTokenFile + "'s grant (network.audit), written in batches, a connection's before it is made (and not made if it cannot be), denials past 20 a second counted in one summary a second; the session cannot read that token"
		}
		allow := func(flag string, rules []string, why string) {
			for _, r := range rules {
				p.Network.Allowed = append(p.Network.Allowed, Allowed{flag + " " + r, why})
			}
		}
		const hostWhat = "exactly this host and port, even a loopback or private address"
		allow("--allow-domain", cfg.AllowDomains, "given on the command line: "+domainWhat)
		allow("--allow-host", cfg.AllowHosts, "given on the command line: "+hostWhat)
		allow("--allow-host-address", cfg.AllowHostAddrs, "given on the command line: an --allow-domain name may resolve to this address of the host's own (a name resolving to any other is refused)")
		if n := p.Session.Network; n != nil {
			allow("--allow-domain", n.AllowDomains, "from session.json (sandbox prepare --allow-domain): "+domainWhat)
			allow("--allow-host", n.AllowHosts, "from session.json (sandbox prepare --allow-host): "+hostWhat)
			cfg.AllowDomains = append(cfg.AllowDomains, n.AllowDomains...)
			cfg.AllowHosts = append(cfg.AllowHosts, n.AllowHosts...)
		}
		if cfg.AuditTokenFile != "" {
			p.checkAuditToken()
		} else {
			p.Notes = append(p.Notes, "no --audit-token-file: the egress decisions go to sandbox run's stderr, not to the broker")
		}
		if cfg.ResolveFile != "" {
			p.Notes = append(p.Notes, "--resolve-file "+cfg.ResolveFile+": the proxy looks names up there first")
		}
	case NetHost:
		p.Network.Why = "the host's network namespace: every address the host reaches"
		if p.Session.Network != nil {
			p.Notes = append(p.Notes, "session.json's network allow-list is not enforced: only --net=proxy enforces it")
		}
		p.Notes = append(p.Notes, "--net=host: the session shares the host's network namespace")
		switch abi := landlockABI(); {
		case abi >= landlockScopeABI:
			p.ScopeAbstract = true
		case cfg.AllowAbstractSockets:
			p.Notes = append(p.Notes, fmt.Sprintf("--allow-abstract-sockets: this kernel's Landlock ABI is %d, scopes need %d: the session reaches the host's abstract Unix sockets (containerd-shim, X11, D-Bus)", abi, landlockScopeABI))
		default:
			p.Problems = append(p.Problems, fmt.Sprintf("%s: --net would let the session reach the host's abstract Unix sockets (containerd-shim, X11, D-Bus), and this kernel's Landlock ABI is %d, scopes need %d (Linux 6.12); give --allow-abstract-sockets to start anyway", ReasonAbstractScopeMissing, abi, landlockScopeABI))
		}
	}
	if cfg.Net != NetHost {
		p.Namespaces = append(p.Namespaces, "net")
	}
	p.Hardening = []Flag{
		{Flag: "--new-session", Why: "the session has no controlling terminal, so TIOCSTI cannot push keystrokes into the caller's terminal"},
		{Flag: "--disable-userns", Why: "no nested user namespace, whose capabilities could undo a read-only bind"},
		{Flag: "--cap-drop ALL", Why: "no capability inside the session's user namespace either"},
		{Flag: "--seccomp", Why: "refuses TIOCSTI/TIOCLINUX/TIOCSETD, socket families other than unix, inet, inet6 and netlink route (EAFNOSUPPORT), keyctl, ptrace, mount and the new mount API, listmount/statmount, io_uring, unshare/setns and namespace clones, bpf, userfaultfd, perf_event_open, module and kexec calls, and a set-user-ID or set-group-ID bit in chmod, open, mknod (openat2, whose mode it cannot read, gets ENOSYS)"},
		{Flag: "--as-pid-1", Why: "the sandbox's own init is pid 1, with SIGKILL as its parent-death signal, so the session dies with the bwrap process outside even when sandbox run is gone too; bwrap's own reaper would outlive it"},
		{Flag: "--json-status-fd", Why: "bwrap reports pid 1, which sandbox run passes its signals to and makes sure is gone once bwrap has exited, and the command's status"},
	}
	if p.ScopeAbstract {
		p.Hardening = append(p.Hardening, Flag{Flag: "landlock " + pid1.OptScopeAbstract, Why: "--net shares the host's network namespace, where abstract Unix socket names live: pid 1 starts the command in a Landlock domain (LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET) that cannot connect to one made outside the session"})
	}
	if u.Dynamic {
		p.Hardening = append(p.Hardening, Flag{Flag: fmt.Sprintf("uid %d-%d", cfg.UIDLow, cfg.UIDHigh), Why: fmt.Sprintf("started as root: bwrap and the session run as a uid (and gid) of their own, free in /etc/passwd, /etc/group and among running processes, locked in %s, so no other session can read, write or signal this one", cfg.StateDir)})
	} else if u.Drop {
		p.Hardening = append(p.Hardening, Flag{Flag: "--user " + u.Name, Why: fmt.Sprintf("started as root: bwrap and the session run as uid %d gid %d, never as host root", u.UID, u.GID)})
	}
	p.addSocketGroups()
	p.checkSession()
	p.checkDisk()
	p.Env = cfg.sessionEnv(p)
	p.checkAccess()
	return p, nil
}

// domainWhat is what an --allow-domain rule allows, for explain.
const domainWhat = "the name (or every name under *.), on its :PORT or else on 443 and 80, when it resolves to public addresses only, none of them the host's own"

// Network is what explain says of the session's network.
type Network struct {
	Mode    string    `json:"mode"`
	Why     string    `json:"why"`
	Relay   string    `json:"relay,omitempty"`
	Allowed []Allowed `json:"allowed,omitempty"`
	// Limits are the egress proxy's; Audit says where its decisions go.
	Limits string `json:"limits,omitempty"`
	Audit  string `json:"audit,omitempty"`
}

// Allowed is one rule of the egress policy, and where it comes from.
type Allowed struct {
	Rule string `json:"rule"`
	Why  string `json:"why"`
}

// SocketGroup is a supplementary group the session user gets because a
// bound socket belongs to it.
type SocketGroup struct {
	GID     uint32   `json:"gid"`
	Name    string   `json:"name,omitempty"`
	Sockets []string `json:"sockets"`
	Why     string   `json:"why"`
}

// addSocketGroups gives the session user, when run switches to it, the
// group of each socket bound into the session (bushostd serve
// --socket-group makes its home 0710 and the sockets 0660 with that group),
// so that it can traverse the home and connect, and nothing more: exactly
// those groups, never group 0. Only the bus sockets count: a socket bound
// with --ro gives no group, or `--ro /var/run/docker.sock` would hand the
// session the docker group, which is root.
func (p *Plan) addSocketGroups() {
	if !p.User.Drop {
		return
	}
	for i, sock := range p.busSockets {
		var st unix.Stat_t
		if unix.Fstat(p.busFDs[i], &st) != nil {
			continue
		}
		gid := st.Gid
		if gid == 0 {
			continue // group root is never a session's, whatever the socket says
		}
		if i := slices.IndexFunc(p.SocketGroups, func(g SocketGroup) bool { return g.GID == gid }); i >= 0 {
			p.SocketGroups[i].Sockets = append(p.SocketGroups[i].Sockets, sock)
			continue
		}
		g := SocketGroup{GID: gid, Name: groupName(gid), Sockets: []string{sock}}
		if p.User.inGroup(gid) {
			g.Why = fmt.Sprintf("the sockets' group; %s is already a member", p.User.Name)
		} else {
			g.Why = "the sockets' group (bushostd serve --socket-group): lets the session traverse the bus host home and connect, nothing else"
			p.User.Groups = append(p.User.Groups, gid)
		}
		p.SocketGroups = append(p.SocketGroups, g)
	}
}

// checkSession records where session.json and the command line disagree
// on the role, and a token file it names that is not a regular file.
func (p *Plan) checkSession() {
	s := p.Session
	if s.Role != "" && s.Role != p.Config.Role {
		p.Problems = append(p.Problems, fmt.Sprintf("--role %s, but session.json says role %s", p.Config.Role, s.Role))
	}
	if s.Caps != nil && !sameCaps(s.Caps, p.Config.Caps) {
		p.Problems = append(p.Problems, fmt.Sprintf("--caps %s, but session.json says %s", strings.Join(p.Config.Caps, ","), strings.Join(s.Caps, ",")))
	}
	if s.TokenFile != "" {
		tok := filepath.Join(p.RunDir, s.TokenFile)
		if st, err := os.Lstat(tok); err != nil || !st.Mode().IsRegular() {
			p.Problems = append(p.Problems, fmt.Sprintf("session.json names token file %s, which is not a regular file", tok))
		}
	}
}

// checkAuditToken records why --audit-token-file cannot be used: a token
// the session could read through a bind would let it record
// network.egress itself.
func (p *Plan) checkAuditToken() {
	f := p.Config.AuditTokenFile
	real, err := realPath(f)
	if err != nil {
		p.Problems = append(p.Problems, fmt.Sprintf("--audit-token-file %s: %v", f, err))
		return
	}
	if st, err := os.Stat(real); err != nil || !st.Mode().IsRegular() {
		p.Problems = append(p.Problems, fmt.Sprintf("--audit-token-file %s is not a regular file", f))
		return
	}
	for _, b := range p.Binds {
		if (b.Kind == KindBind || b.Kind == KindROBind) && b.Source != "" && within(real, b.Source) {
			p.Problems = append(p.Problems, fmt.Sprintf("--audit-token-file %s is under %s, which the session sees: keep the audit grant out of every bind", f, b.Source))
			return
		}
	}
	if p.bushostExe == "" {
		p.Problems = append(p.Problems, "--audit-token-file: no bushost client to record the decisions with (give --bushost PATH)")
		return
	}
	p.Config.AuditTokenFile = real
	p.Notes = append(p.Notes, "--audit-token-file: every egress decision is a network.egress event on the audit grant's task, recorded by sandbox run in batches: an allowed connection's before it is made, the rest each second")
}

// checkAccess records what the session user could not reach.
func (p *Plan) checkAccess() {
	// The run directory itself is the host's (sandbox prepare makes it):
	// the session only passes through it to home/ and tmp/, which run
	// hands to the session user.
	want := map[string]uint32{p.Workspace: accR | accW | accX, p.RunDir: accR | accX, p.initExe: accX}
	if p.User.Dynamic {
		// Handed to the session's own uid at launch: only the way there
		// must be open to it.
		want[p.Workspace], want[p.RunDir] = 0, 0
	}
	for _, b := range p.Binds {
		if b.Source == "" || b.Kind == KindSymlink {
			continue
		}
		if p.User.Dynamic && (within(b.Source, p.RunDir) || within(b.Source, p.Workspace)) {
			// Handed to the session's uid at launch (a launcher that
			// died may have left them with another session uid, which
			// run reclaims first).
			continue
		}
		w, ok := want[b.Source]
		if !ok && slices.Contains(p.busSockets, b.Source) {
			w = accW // connect(2) needs write permission on the socket
		}
		if _, err := os.Lstat(b.Source); err != nil && filepath.Dir(b.Source) == p.RunDir {
			continue // made by run before the launch
		}
		if err := checkAccess(p.User, b.Source, w); err != nil {
			msg := fmt.Sprintf("session user %s cannot use %s: %v", p.User.Name, b.Source, err)
			if w == accW {
				msg += "; start bushostd serve with --socket-group GROUP (home 0710, sockets 0660 of GROUP, a group other than root) and the session gets GROUP"
			}
			p.Problems = append(p.Problems, msg)
		}
	}
	if ents, err := os.ReadDir(p.Home); err == nil && len(ents) > 0 && !p.Config.FreshHome {
		p.Problems = append(p.Problems, fmt.Sprintf("%s is not empty: a session starts with an empty HOME (--fresh-home empties it)", p.Home))
	}
}

func gitCapsOf(cfg *Config) string {
	var held []string
	for _, c := range []string{CapPushWorking, CapReviewVerdict} {
		if cfg.HasCap(c) {
			held = append(held, c)
		}
	}
	return strings.Join(held, " and ")
}

// systemBinds gives the session the host's programs and configuration,
// read-only. /bin, /lib, /lib64 and /sbin stay the symlinks they are on a
// merged-/usr host and are bound where they are real directories.
func systemBinds() ([]Bind, error) {
	binds := []Bind{{KindROBind, "/usr", "/usr", "the host's programs and libraries (git, a shell, compilers), read-only"}}
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		st, err := os.Lstat(d)
		switch {
		case os.IsNotExist(err):
			continue
		case err != nil:
			return nil, err
		case st.Mode()&os.ModeSymlink != 0:
			to, err := os.Readlink(d)
			if err != nil {
				return nil, err
			}
			binds = append(binds, Bind{KindSymlink, to, d, "the same symlink as on the host, so programs find their interpreters and libraries"})
		default:
			binds = append(binds, Bind{KindROBind, d, d, "a real directory on this host holding programs or libraries, read-only"})
		}
	}
	binds = append(binds, Bind{KindROBind, "/etc", "/etc", "users, name service, TLS roots and system-wide config that programs read; read-only"})
	return binds, nil
}

// callerDir makes a directory path the caller gave absolute, without
// resolving links (safepath refuses them), and refuses the host's root and
// the paths the sandbox builds itself.
func callerDir(what, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	if abs == "/" {
		return "", fmt.Errorf("%s %s is the host's root", what, path)
	}
	for _, r := range reserved {
		if within(abs, r) {
			if r == "/tmp" {
				return "", fmt.Errorf("%s %s is under /tmp, which the session's private /tmp hides; put it outside /tmp (for example under /var/tmp)", what, path)
			}
			return "", fmt.Errorf("%s %s is under %s, which the sandbox builds itself for the session", what, path, r)
		}
	}
	return abs, nil
}

// openWorkspace opens the workspace once: the descriptor sandbox serve
// opened and checked for its caller (--workspace-fd), or the path itself
// from /, following no link, every directory on the way root's or the
// user's root acts for (the caller, or as root the workspace's owner) and
// writable by nobody else (internal/safepath). The session is given this
// descriptor, and the hand-over acts on it.
func openWorkspace(cfg *Config) (*safepath.Handle, error) {
	abs, err := callerDir("workspace", cfg.Workspace)
	if err != nil {
		return nil, err
	}
	if cfg.WorkspaceFD > 0 {
		var st unix.Stat_t
		if err := unix.Fstat(cfg.WorkspaceFD, &st); err != nil {
			return nil, fmt.Errorf("--workspace-fd %d: %w", cfg.WorkspaceFD, err)
		}
		h, err := safepath.FromFd(cfg.WorkspaceFD, abs, int(st.Uid))
		if err == nil && !h.IsDir() {
			err = fmt.Errorf("--workspace-fd %d is not a directory", cfg.WorkspaceFD)
		}
		return h, err
	}
	uid := os.Geteuid()
	if uid == 0 {
		// Root acts for whoever owns the workspace: the directories on
		// the way may be that user's. What a swap in between makes of
		// this guess, the walk refuses.
		var st unix.Stat_t
		if err := unix.Lstat(abs, &st); err == nil {
			uid = int(st.Uid)
		}
	}
	return safepath.OpenDir(abs, uid)
}

// openRunDir opens the run directory once, from /, following no link:
// it and every directory on the way are root's or the caller's, writable
// by nobody else (internal/safepath). session.json and the token are read
// through it. As root giving sessions uids of their own, a run directory
// a session uid still owns is the record of a launcher that died: it is
// opened, and the hand-back of that record (or the refusal of a tree a
// running session holds) decides.
func openRunDir(cfg *Config) (*safepath.Handle, error) {
	abs, err := callerDir("run directory", cfg.RunDir)
	if err != nil {
		return nil, err
	}
	uid := os.Geteuid()
	var st unix.Stat_t
	if uid == 0 && cfg.User == "" && unix.Lstat(abs, &st) == nil && st.Uid >= cfg.UIDLow && st.Uid <= cfg.UIDHigh {
		uid = int(st.Uid)
	}
	return safepath.OpenDir(abs, uid)
}

// callerPath resolves a socket or --ro path the host gave to the absolute
// real path that is both bind source and target (paths mean the same
// inside and out).
func callerPath(what, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	if _, err := os.Stat(real); err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	return callerDir(what, real)
}

// callerSocket is a bus socket the host named: links in the directories
// above it are followed (its real path is bind source and target), but
// its last name must be the socket itself, opened there once without
// following a link (O_PATH) and checked to be a socket with that name
// alone; anything else is refused. A link there, symbolic or hard, would
// be whoever may write that directory (a home's owner) choosing which
// socket on the host the session reaches, and its group, which the
// session is given (addSocketGroups): docker.sock's is root. The socket
// goes to busSockets and its descriptor to busFDs, which bwrap binds, so
// that the name swapped after this check changes nothing.
func (p *Plan) callerSocket(what, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	real, err := callerDir(what, filepath.Join(dir, filepath.Base(abs)))
	if err != nil {
		return "", err
	}
	fd, err := unix.Open(real, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", what, path, err)
	}
	var st unix.Stat_t
	switch err = unix.Fstat(fd, &st); {
	case err != nil:
		err = fmt.Errorf("%s %s: %w", what, real, err)
	case st.Mode&unix.S_IFMT == unix.S_IFSOCK && st.Nlink != 1:
		// A hard link, where the host lets users link files of
		// others (fs.protected_hardlinks=0): as above.
		err = fmt.Errorf("%s %s is a socket with %d names: name one that has only its own; another name would be whoever may write %s choosing which socket the session reaches, and its group", what, real, st.Nlink, dir)
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		to, _ := os.Readlink(real)
		err = fmt.Errorf("%s %s is a link (to %s): name the socket itself; through a link, whoever may write %s would choose which socket the session reaches, and its group", what, real, to, dir)
	case st.Mode&unix.S_IFMT != unix.S_IFSOCK:
		err = fmt.Errorf("%s %s is not a socket", what, real)
	}
	if err != nil {
		unix.Close(fd)
		return "", err
	}
	p.busSockets = append(p.busSockets, real)
	p.busFDs = append(p.busFDs, fd)
	return real, nil
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

func findBwrap(flagPath string) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
	if st, err := os.Stat("/usr/bin/bwrap"); err == nil && !st.IsDir() {
		return "/usr/bin/bwrap", nil
	}
	p, err := exec.LookPath("bwrap")
	if err != nil {
		return "", &UnavailableError{Reason: "bwrap not found (install bubblewrap)"}
	}
	return p, nil
}

// InitName is the session's pid 1 run binds from beside its own
// executable: cmd/sandbox-init, a small binary whose start faults in far
// fewer pages than this one's, and every session's start waits for it.
const InitName = "sandbox-init"

// initPath is where pid 1's binary is bound in the session, to be run by
// bwrap (--as-pid-1) as `init [OPTIONS] EXE ARGV...` (internal/sandbox/pid1).
const initPath = sessionDir + "/init"

// initExecutable is the session's pid 1, and which binary it is, for the
// bind's why: the given path; else InitName beside this executable, if it
// is a regular file of the same owner that no one else may write, in a
// directory no one but its owner may write (as trusted as this
// executable, then); else this executable, whose main
// hands pid1.Verb to pid1.Main.
func initExecutable(flagPath string) (string, string, error) {
	exe, err := flagPath, error(nil)
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return "", "", fmt.Errorf("find the sandbox executable for the session's pid 1: %w", err)
		}
	}
	if exe, err = realPath(exe); err != nil {
		return "", "", fmt.Errorf("find the executable for the session's pid 1: %w", err)
	}
	if flagPath != "" {
		return exe, "the given init binary", nil
	}
	exe, which := initBeside(exe)
	return exe, which, nil
}

// initBeside is InitName beside the executable self, if it may be pid 1
// (see initExecutable), else self; and which of the two it is.
func initBeside(self string) (string, string) {
	var own, dir, st unix.Stat_t
	next := filepath.Join(filepath.Dir(self), InitName)
	if unix.Stat(self, &own) == nil && unix.Stat(filepath.Dir(self), &dir) == nil && unix.Lstat(next, &st) == nil &&
		dir.Mode&0o022 == 0 && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Uid == own.Uid && st.Mode&0o022 == 0 && st.Mode&0o111 != 0 {
		return next, InitName + ", the small pid 1 binary beside this one"
	}
	return self, "this sandbox binary (no " + InitName + " of its owner beside it, so each start pays this binary's start twice)"
}

// realPath is path with every link resolved, absolute.
func realPath(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	return filepath.Abs(real)
}

// findBushost returns the client to bind, or "" and why it is not bound. A
// client named with --bushost must be there: the caller asked for it, and a
// session without it could not push, so a wrong path is an error, not a note.
func findBushost(flagPath string) (path, note string, err error) {
	if flagPath != "" {
		real, err := realPath(flagPath)
		if err != nil {
			return "", "", fmt.Errorf("--bushost %s: %w", flagPath, err)
		}
		if st, err := os.Stat(real); err != nil || !st.Mode().IsRegular() {
			return "", "", fmt.Errorf("--bushost %s is not a regular file", flagPath)
		}
		return real, "", nil
	}
	if exe, err := os.Executable(); err == nil {
		next := filepath.Join(filepath.Dir(exe), "bushost")
		if st, err := os.Stat(next); err == nil && st.Mode().IsRegular() {
			if real, err := realPath(next); err == nil {
				return real, "", nil
			}
		}
	}
	if p, err := exec.LookPath("bushost"); err == nil {
		if real, err := realPath(p); err == nil {
			return real, "", nil
		}
	}
	return "", "bushost not bound: none next to the sandbox executable nor on PATH (give --bushost PATH)", nil
}

// brokerSocket is the bound broker socket's path, the same inside and out.
func (p *Plan) brokerSocket() string { return p.busSockets[0] }
