// Package launch is sandbox serve: the launcher that lets a grant holding
// session.launch start sessions, each confined as `sandbox run` confines
// one, with a role and capabilities from the grant's launch set and never
// more. It mints each session's grant through the broker with the host's
// admin token, prepares its run directory (sandbox.PrepareRunDir), and
// runs it as a detached `sandbox keep` (sandbox run that leaves its exit
// status in a file), so that a session outlives the launcher; a restarted
// launcher re-adopts the sessions in its state directory. It never gives
// a session the admin token, and records session.launched and
// session.ended itself (docs/launch.md).
package launch

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/grpcerr"
	"github.com/bushost/bushost/internal/home"
	"github.com/bushost/bushost/internal/names"
	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/sandbox"
	"github.com/bushost/bushost/internal/sock"
	"github.com/bushost/bushost/internal/testhook"
	"github.com/bushost/bushost/internal/textsafe"
)

// DefaultKeepEnded is sandbox serve's --keep-ended.
const DefaultKeepEnded = 16

// Options configure a launcher.
type Options struct {
	// Home holds launch.sock; State (default Home) is the state
	// directory: launch.lock, sessions/, root's alone (see openHome).
	Home, State string
	// BusHome is bushostd's home: broker.sock, git.sock, admin.token.
	BusHome string
	// Sandbox is the sandbox executable sessions are run with.
	Sandbox string
	// MaxPerGrant bounds the sessions one launcher grant runs at once,
	// MaxSessions those of the whole host; MaxDepth how many launches
	// deep session.launch may be handed on (1: only the host's grants
	// launch).
	MaxPerGrant, MaxSessions, MaxDepth int
	// KeepEnded is how many ended sessions of each launcher grant are
	// kept (listed, waited for, their logs served); older ones are
	// forgotten and their directories removed.
	KeepEnded int
	// UIDRange and StateDir are passed to sandbox run ("" for its defaults).
	UIDRange, StateDir string
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
	StopGrace time.Duration
	// LogBytes is how far back from its end Logs reads each stream (its
	// tail), in answers of at most logChunk each.
	LogBytes int64
	// KeepWorkspaces is how long a workspace the launcher made (ws/) is
	// kept after its session ended (0: until session rm).
	KeepWorkspaces time.Duration
	// Defaults are the limits a launch naming none gets, and the ceilings
	// of a grant naming none (sandbox serve --default-NAME).
	Defaults bounds.Values
	// Sock bounds launch.sock's connections and calls.
	Sock SockLimits
	Log  io.Writer
}

// Server is the LaunchService.
type Server struct {
	launchv1.UnimplementedLaunchServiceServer
	o     Options
	admin string
	conn  *grpc.ClientConn
	bc    brokerv1.BrokerServiceClient

	mu       sync.Mutex
	sessions map[string]*live
	// quit ends the sweep of workspaces kept past --keep-workspaces.
	quit chan struct{}
}

// live is a session this launcher follows.
type live struct {
	mu   sync.Mutex
	rec  record
	dir  string
	done chan struct{} // closed once it ended and session.ended is recorded
	// exited is closed when the process is gone (own child reaped, or an
	// adopted one's pidfd readable).
	exited chan struct{}
	status int  // from Wait of an own child
	known  bool // status is known from Wait
}

func (l *live) snapshot() record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rec
}

// set changes the record under the lock, save also writes it to the
// session's directory.
func (l *live) set(f func(r *record)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.rec)
}

func (l *live) save(f func(r *record)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.rec)
	return l.rec.save(l.dir)
}

func (s *Server) sessionsDir() string { return home.At(s.o.State).Sessions() }

// New opens the launcher's state: it reads the admin token, connects to
// the broker, and re-adopts every session its state directory records.
func New(o Options) (*Server, error) {
	o.BusHome, o.State = cmp.Or(o.BusHome, o.Home), cmp.Or(o.State, o.Home)
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	if o.LogBytes <= 0 {
		o.LogBytes = 1 << 20
	}
	if o.KeepEnded <= 0 {
		o.KeepEnded = DefaultKeepEnded
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	bus := home.At(o.BusHome)
	tok, err := readAdminToken(o.BusHome)
	if err != nil {
		return nil, fmt.Errorf("the host's admin token (--bus-home %s): %w", o.BusHome, err)
	}
	// broker.sock lies in bushostd's home, whose owner may swap it for a
	// link: root dials the socket there, never what a link names.
	conn, err := grpc.NewClient("unix://"+bus.BrokerSock(),
		append(grpcerr.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				return sock.DialNoFollow(ctx, bus.BrokerSock())
			}))...)
	if err != nil {
		return nil, err
	}
	s := &Server{o: o, admin: tok, conn: conn, bc: brokerv1.NewBrokerServiceClient(conn), sessions: map[string]*live{}, quit: make(chan struct{})}
	// Root's, 0711, reached through no link.
	if err := safepath.MkdirOwned(s.sessionsDir(), 0, 0o711); err != nil {
		conn.Close()
		return nil, err
	}
	s.adopt()
	if o.KeepWorkspaces > 0 {
		go s.sweep()
	}
	return s, nil
}

// Close lets go of the broker connection; running sessions keep running.
func (s *Server) Close() error {
	close(s.quit)
	return s.conn.Close()
}

func (s *Server) logf(format string, args ...any) {
	fmt.Fprintf(s.o.Log, "sandbox serve: "+format+"\n", args...)
}

func withToken(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// caller resolves the call's token: the host (admin.token) or a grant,
// which the broker describes (Whoami).
func (s *Server) caller(ctx context.Context) (authz.Grant, error) {
	tok := authz.TokenFromContext(ctx)
	if tok == "" {
		return authz.Grant{}, errdefs.Unauthenticated(errdefs.TokenMissing, "no token: send 'authorization: Bearer <token>'")
	}
	if subtle.ConstantTimeCompare([]byte(tok), []byte(s.admin)) == 1 {
		return authz.Grant{ID: authz.HostID, Host: true}, nil
	}
	w, err := s.bc.Whoami(withToken(ctx, tok), &brokerv1.WhoamiRequest{})
	if err != nil {
		return authz.Grant{}, err
	}
	lb := w.GetLaunchBounds()
	g := authz.Grant{ID: w.GrantId, Business: w.Business, Project: w.Project, Task: w.Task, Role: w.Role, Caps: w.Capabilities,
		LaunchedBy: w.LaunchedBy, LaunchDepth: int(w.LaunchDepth), Launch: map[string][]string{},
		LaunchBounds: bounds.Launch{Nets: lb.GetNet(), Max: lb.GetMax(), Tasks: lb.GetTasks(), AllowDomains: lb.GetAllowDomains(), AllowHosts: lb.GetAllowHosts()}}
	for _, r := range w.Launch {
		g.Launch[r.Role] = r.Capabilities
	}
	return g, nil
}

// allowed checks a launch request against the launcher grant g and
// returns what is missing from its launch set ("" if nothing).
func (s *Server) allowed(g authz.Grant, business, project, task, role string, caps []string) []string {
	var missing []string
	if business != g.Business || project != g.Project {
		missing = append(missing, fmt.Sprintf("task of %s/%s (the launcher's is %s/%s)", business, project, g.Business, g.Project))
	} else if !bounds.TaskAllowed(g.LaunchBounds.Tasks, g.Task, task) {
		if g.LaunchBounds.Tasks == "" {
			missing = append(missing, fmt.Sprintf("task %s (the grant launches for its own task %s only: grant --launch-tasks)", task, g.Task))
		} else {
			missing = append(missing, fmt.Sprintf("task %s (the grant's --launch-tasks is %s)", task, g.LaunchBounds.Tasks))
		}
	}
	set, ok := g.Launch[role]
	if !ok {
		missing = append(missing, "role "+role)
	}
	for _, c := range caps {
		if ok && !slices.Contains(set, c) {
			missing = append(missing, "capability "+c+" for role "+role)
		}
		if c == authz.CapSessionLaunch && g.LaunchDepth+1 >= s.o.MaxDepth {
			missing = append(missing, fmt.Sprintf("capability %s at launch depth %d (sandbox serve --max-launch-depth %d)", c, g.LaunchDepth+1, s.o.MaxDepth))
		}
	}
	return missing
}

func randomID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "s-" + hex.EncodeToString(b)
}

// Launch implements LaunchService.
func (s *Server) Launch(ctx context.Context, r *launchv1.LaunchRequest) (*launchv1.LaunchResponse, error) {
	g, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	if g.Host || !g.Has(authz.CapSessionLaunch) {
		return nil, errdefs.PermissionDenied(errdefs.CapabilityMissing, "launching a session takes a grant with %s (grant %s lacks it)", authz.CapSessionLaunch, g.ID)
	}
	business, project := cmp.Or(r.GetBusiness(), g.Business), cmp.Or(r.GetProject(), g.Project)
	if err := names.CheckScope(names.Scope{Business: business, Project: project, Task: r.GetTask()}); err != nil || r.GetTask() == "" {
		return nil, errdefs.InvalidArgument(errdefs.NameInvalid, "a session is for one task: give a valid --task")
	}
	if err := names.Check("role", r.GetRole()); err != nil {
		return nil, errdefs.InvalidArgument(errdefs.NameInvalid, "%v", err)
	}
	caps := slices.Compact(slices.Sorted(slices.Values(r.GetCapabilities())))
	if len(caps) == 0 {
		return nil, errdefs.InvalidArgument(errdefs.CapabilityInvalid, "a session needs at least one capability (--caps)")
	}
	if len(r.GetCommand()) == 0 {
		return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "no command: give it after --")
	}
	peer, ok := sock.PeerFromContext(ctx)
	if !ok {
		return nil, errdefs.PermissionDenied(errdefs.LaunchNotAllowed, "no peer credentials on this connection")
	}
	from, err := s.callerSession(peer)
	if err != nil {
		return nil, err
	}
	if err := s.fromOwnSession(g, from); err != nil {
		return nil, err
	}
	set, over, err := s.settle(g, r, from)
	if err != nil {
		return nil, err
	}
	if missing := append(s.allowed(g, business, project, r.GetTask(), r.GetRole(), caps), over...); len(missing) > 0 {
		return nil, errdefs.PermissionDenied(errdefs.LaunchNotAllowed, "grant %s may not launch this: %s", g.ID, strings.Join(missing, "; ")).
			With("missing", strings.Join(missing, "\n"))
	}
	limits, runFlags := set.limits.Strings(), set.runFlags()
	var ws *safepath.Handle
	if path := r.GetWorkspace(); path != "" {
		if ws, err = openWorkspace(path, peer, from); err != nil {
			return nil, err
		}
		defer ws.Close()
		testhook.Swap("launch.workspace")
	}

	id := randomID()
	l := &live{rec: record{ID: id, Business: business, Project: project, Task: r.GetTask(), Role: r.GetRole(), Caps: caps,
		Launcher: g.ID, Command: r.GetCommand(), Limits: limits, Net: set.net, State: StateStarting, Exit: -1},
		dir: filepath.Join(s.sessionsDir(), id), done: make(chan struct{}), exited: make(chan struct{})}
	// The slot is taken before anything is made, so that concurrent
	// launches cannot pass the limits together.
	s.mu.Lock()
	var mine, all int
	for _, x := range s.sessions {
		st := x.snapshot()
		if st.State == StateRunning || st.State == StateStarting {
			all++
			if st.Launcher == g.ID {
				mine++
			}
		}
	}
	if mine >= s.o.MaxPerGrant {
		s.mu.Unlock()
		return nil, errdefs.ResourceExhausted(errdefs.SessionLimit, "grant %s already runs %d sessions (sandbox serve --max-sessions-per-grant %d): wait for one to end", g.ID, mine, s.o.MaxPerGrant).
			With("limit", strconv.Itoa(s.o.MaxPerGrant))
	}
	if s.o.MaxSessions > 0 && all >= s.o.MaxSessions {
		s.mu.Unlock()
		return nil, errdefs.ResourceExhausted(errdefs.SessionLimit, "the host already runs %d sessions (sandbox serve --max-sessions %d)", all, s.o.MaxSessions).
			With("limit", strconv.Itoa(s.o.MaxSessions))
	}
	s.sessions[id] = l
	s.mu.Unlock()

	grantID, err := s.start(ctx, l, g, ws, runFlags)
	if err != nil {
		s.mu.Lock()
		delete(s.sessions, id)
		s.mu.Unlock()
		if err := removeSessionDir(l.dir); err != nil {
			s.logf("remove the directory of session %s that did not start: %v", id, err)
		}
		if grantID != "" {
			// The session never ran: its grant goes with it.
			if _, rerr := s.bc.RevokeGrant(withToken(context.Background(), s.admin), &brokerv1.RevokeGrantRequest{GrantId: grantID}); rerr != nil {
				s.logf("revoke grant %s of session %s that did not start: %v", grantID, id, rerr)
			}
		}
		return nil, err
	}
	rec := l.snapshot()
	data := map[string]any{"session_id": id, "launcher_grant_id": g.ID, "grant_id": rec.GrantID, "role": rec.Role, "capabilities": caps,
		"uid": rec.UID, "limits": limits, "net": set.net, "pid": rec.PID}
	if set.net == sandbox.NetProxy {
		data["allow_domains"], data["allow_hosts"] = set.domains, set.hosts
	}
	if from != nil {
		data["launched_from_pid"] = from.PID
	}
	if err := s.record(rec, "session.launched", data); err != nil {
		s.logf("record session.launched of %s: %v", id, err)
	}
	go s.watch(l)
	return &launchv1.LaunchResponse{Session: sessionProto(rec)}, nil
}

// openWorkspace opens the caller's workspace once, from /, following no
// link, every directory on the way root's or the caller's and writable by
// nobody else (internal/safepath), and accepts it if it is the caller's
// own directory: the session's uid is given it for the session. The
// session is given this descriptor, never the path again (sandbox run
// --workspace-fd).
//
// A caller in a session (from) that sees a directory as its own through
// an idmapped mount (its workspace, HOME or /tmp) is, there, the uid that
// owns it on disk: a directory in one of those trees is opened under that
// uid's rule, through the tree's root as the session's sandbox run
// recorded it (the same directory, by device and inode), and must be that
// uid's. Outside them the caller is its own uid, as anyone else.
func openWorkspace(ws string, peer authz.Peer, from *sandbox.SessionBounds) (*safepath.Handle, error) {
	if !filepath.IsAbs(ws) {
		return nil, errdefs.InvalidArgument(errdefs.WorkspaceInvalid, "--workspace %s: give an absolute path", ws)
	}
	ws = filepath.Clean(ws)
	uid, whose := int(peer.UID), fmt.Sprintf("the caller's (%d)", peer.UID)
	var h *safepath.Handle
	var err error
	if m, ok := mappedFor(ws, from); ok {
		uid, whose = int(m.UID), fmt.Sprintf("uid %d's, whom the calling session (uid %d) is in %s", m.UID, peer.UID, m.Path)
		h, err = openMapped(ws, m)
	} else {
		h, err = safepath.OpenDir(ws, uid)
	}
	var refused *safepath.Error
	if err != nil && !errors.As(err, &refused) {
		return nil, errdefs.InvalidArgument(errdefs.WorkspaceInvalid, "--workspace: %v", err)
	}
	if err != nil {
		return nil, err
	}
	if owner := h.Owner(); owner != uid {
		h.Close()
		return nil, errdefs.InvalidArgument(errdefs.WorkspaceInvalid, "--workspace %s is uid %d's, not %s", ws, owner, whose)
	}
	return h, nil
}

// mappedFor is the calling session's idmapped tree ws lies in, if any.
func mappedFor(ws string, from *sandbox.SessionBounds) (sandbox.Mapped, bool) {
	if from == nil {
		return sandbox.Mapped{}, false
	}
	best, found := sandbox.Mapped{}, false
	for _, m := range from.Mapped {
		if (ws == m.Path || strings.HasPrefix(ws, m.Path+"/")) && len(m.Path) >= len(best.Path) {
			best, found = m, true
		}
	}
	return best, found
}

// openMapped opens ws, in the tree m, under the rule of the tree's owner:
// the tree's root from / (and only if it is still the directory the
// session was given), then what is beneath it.
func openMapped(ws string, m sandbox.Mapped) (*safepath.Handle, error) {
	root, err := safepath.OpenDir(m.Path, int(m.UID))
	if err != nil {
		return nil, err
	}
	if st := root.Stat(); st.Dev != m.Dev || st.Ino != m.Ino {
		root.Close()
		return nil, &safepath.Error{Reason: safepath.ReasonChanged, Path: m.Path, Owner: int(m.UID), Mode: 0,
			Msg: fmt.Sprintf("PATH_CHANGED: %s is no longer the directory the calling session was given: refused, never followed", m.Path)}
	}
	if ws == m.Path {
		return root, nil
	}
	defer root.Close()
	return safepath.OpenDirBeneath(root, strings.TrimPrefix(ws, m.Path+"/"))
}

// start mints the session's grant, prepares its directory and starts it;
// it returns the grant's id even on failure, for the caller to revoke.
func (s *Server) start(ctx context.Context, l *live, g authz.Grant, ws *safepath.Handle, runFlags []string) (string, error) {
	rec := l.snapshot()
	cg := &brokerv1.CreateGrantRequest{Business: rec.Business, Project: rec.Project, Task: rec.Task, Role: rec.Role,
		Capabilities: rec.Caps, LaunchedBy: g.ID}
	if slices.Contains(rec.Caps, authz.CapSessionLaunch) {
		// A session allowed to launch may launch what its launcher may
		// (and, being a session, no more than it has itself).
		for role, caps := range g.Launch {
			cg.Launch = append(cg.Launch, &brokerv1.LaunchRole{Role: role, Capabilities: caps})
		}
		if lb := g.LaunchBounds; !lb.IsZero() {
			cg.LaunchBounds = &brokerv1.LaunchBounds{Net: lb.Nets, Max: lb.Max, Tasks: lb.Tasks, AllowDomains: lb.AllowDomains, AllowHosts: lb.AllowHosts}
		}
	}
	ig, err := s.bc.CreateGrant(withToken(ctx, s.admin), cg)
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(l.dir, 0o711); err != nil {
		return ig.GrantId, err
	}
	if disk := rec.Limits["disk"]; disk != "" {
		// One tmpfs of the session's --disk holds its run directory and
		// the workspace made here: what it writes there is bounded
		// together, and outlives the session until ws/ is removed.
		n, err := bounds.ParseValues(map[string]string{"disk": disk})
		if err != nil {
			return ig.GrantId, err
		}
		path := filepath.Join(l.dir, diskName)
		if err := os.Mkdir(path, 0o711); err != nil {
			return ig.GrantId, err
		}
		if err := sandbox.MountDisk(path, n["disk"]); err != nil {
			return ig.GrantId, err
		}
		l.set(func(r *record) { r.Disk = true })
		rec.Disk = true
	}
	tokFile := filepath.Join(l.dir, tokenName)
	if err := os.WriteFile(tokFile, []byte(ig.Token+"\n"), 0o600); err != nil {
		return ig.GrantId, err
	}
	runDir := filepath.Join(rec.under(l.dir), runName)
	err = sandbox.PrepareRunDir(&sandbox.PrepareConfig{RunDir: runDir, TokenFile: tokFile, Session: sandbox.SessionFile{
		Version: sandbox.SessionVersion, Business: rec.Business, Project: rec.Project, Task: rec.Task, Role: rec.Role, Caps: rec.Caps, TokenFile: "token"}})
	os.Remove(tokFile)
	if err != nil {
		return ig.GrantId, err
	}
	if ws == nil {
		path := filepath.Join(rec.under(l.dir), wsName)
		if err := os.Mkdir(path, 0o755); err != nil {
			return ig.GrantId, err
		}
		l.set(func(r *record) { r.OwnWorkspace = true })
		if ws, err = safepath.OpenDir(path, 0); err != nil {
			return ig.GrantId, err
		}
		defer ws.Close()
	}
	// The workspace goes to sandbox keep as the descriptor checked
	// (its fd 3), never as a path to resolve again.
	wsFile, err := ws.File()
	if err != nil {
		return ig.GrantId, err
	}
	defer wsFile.Close()
	bus := home.At(s.o.BusHome)
	args := []string{"keep", filepath.Join(l.dir, exitName), "--run-dir", runDir, "--workspace", ws.Path(), "--workspace-fd", "3", "--role", rec.Role,
		"--caps", strings.Join(rec.Caps, ","), "--broker-socket", bus.BrokerSock()}
	if _, err := os.Stat(bus.GitSock()); err == nil {
		args = append(args, "--git-socket", bus.GitSock())
	}
	if slices.Contains(rec.Caps, authz.CapSessionLaunch) {
		args = append(args, "--launch-socket", home.At(s.o.Home).LaunchSock())
	}
	if s.o.UIDRange != "" {
		args = append(args, "--uid-range", s.o.UIDRange)
	}
	if s.o.StateDir != "" {
		args = append(args, "--state-dir", s.o.StateDir)
	}
	args = append(args, runFlags...)
	args = append(args, "--")
	args = append(args, rec.Command...)
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, name := range []string{stdoutName, stderrName} {
		f, err := os.OpenFile(filepath.Join(l.dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
		if err != nil {
			return ig.GrantId, err
		}
		files = append(files, f)
	}
	cmd := exec.Command(s.o.Sandbox, args...)
	cmd.Stdout, cmd.Stderr = files[0], files[1]
	cmd.ExtraFiles = []*os.File{wsFile}
	cmd.Dir = "/"
	// A session of its own (setsid): the launcher's death, its terminal
	// or its process group reach no session.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return ig.GrantId, fmt.Errorf("start %s: %w", s.o.Sandbox, err)
	}
	pid := cmd.Process.Pid
	st, _ := startTime(pid)
	go func() {
		err := cmd.Wait()
		l.mu.Lock()
		var ee *exec.ExitError
		if err == nil || errors.As(err, &ee) {
			l.status, l.known = cmd.ProcessState.ExitCode(), true
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				l.status = 128 + int(ws.Signal())
			}
		}
		l.mu.Unlock()
		close(l.exited)
	}()
	// Saved at once, so that a launcher killed from here on finds the
	// session again; saved again once its uid is known.
	if err := l.save(func(r *record) {
		r.GrantID, r.PID, r.StartTime, r.State, r.Started = ig.GrantId, pid, st, StateRunning, time.Now().UTC()
	}); err != nil {
		s.logf("save the record of session %s: %v", rec.ID, err)
	}
	learned := make(chan struct{})
	go func() {
		defer close(learned)
		s.learnUID(l)
		if err := l.save(func(*record) {}); err != nil {
			s.logf("save the record of session %s: %v", rec.ID, err)
		}
	}()
	// The call answers once the uid is known, or after a few seconds on a
	// machine too busy to start the session sooner; learning goes on until
	// the session ends, so that its record still names its uid, bwrap and
	// cgroup for a stop and the cleanup.
	select {
	case <-learned:
	case <-time.After(5 * time.Second):
	}
	return ig.GrantId, nil
}

// learnUID finds the session's uid: that of bwrap, the child sandbox run
// starts as it once it has leased one. It gives up when the process ends
// (the uid then shows as 0).
func (s *Server) learnUID(l *live) {
	start := time.Now()
	for {
		if child, uid, ok := childOf(l.rec.PID); ok && uid > 0 {
			st, _ := startTime(child)
			// Its cgroup, as its sandbox run recorded it before starting
			// bwrap: removed by the launcher if that run dies first.
			var cg []string
			if b, err := sandbox.ReadSessionBounds(s.stateDir(), uint32(uid)); err == nil && b != nil && b.PID == l.rec.PID {
				cg = b.Cgroup
			}
			l.set(func(r *record) { r.UID, r.BwrapPID, r.BwrapStart, r.Cgroup = uid, child, st, cg })
			return
		}
		poll := 10 * time.Millisecond
		if time.Since(start) > 5*time.Second {
			poll = time.Second
		}
		select {
		case <-l.exited:
			return
		case <-time.After(poll):
		}
	}
}

// record appends a session.* event to the session's task with the host's
// credential; the session id as key makes a retry (or a restarted
// launcher) record it once.
func (s *Server) record(rec record, typ string, data map[string]any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = s.bc.RecordEvent(withToken(ctx, s.admin), &brokerv1.RecordEventRequest{Type: typ, Data: string(b),
		Business: rec.Business, Project: rec.Project, Task: rec.Task, IdempotencyKey: typ + ":" + rec.ID})
	return err
}

// watch waits for the session's process to end, then finishes it.
func (s *Server) watch(l *live) {
	<-l.exited
	status, peak, ok := readExit(filepath.Join(l.dir, exitName))
	l.mu.Lock()
	l.rec.PeakMemory = peak
	if !ok {
		status, ok = l.status, l.known
	}
	l.mu.Unlock()
	s.finish(l, status, ok)
}

// revoke revokes the session's grant, once: a grant ends with its
// session, so that a token the session let out is refused from then on
// (GRANT_REVOKED). A broker that cannot be reached is tried a few times;
// the record keeps Revoked false for the next start to try again.
func (s *Server) revoke(l *live) {
	rec := l.snapshot()
	if rec.Revoked || rec.GrantID == "" {
		return
	}
	revoked := s.retry(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := s.bc.RevokeGrant(withToken(ctx, s.admin), &brokerv1.RevokeGrantRequest{GrantId: rec.GrantID})
		if errdefs.ReasonOf(err) == errdefs.GrantNotFound {
			return nil
		}
		return err
	}, "revoke grant %s of session %s", rec.GrantID, rec.ID)
	if !revoked {
		return
	}
	if err := l.save(func(r *record) { r.Revoked = true }); err != nil {
		s.logf("save the record of session %s: %v", rec.ID, err)
	}
}

// retry runs f until it succeeds, five times at most, a second longer
// apart each time, and logs each failure (what, then the error); it
// reports whether f succeeded.
func (s *Server) retry(f func() error, what string, args ...any) bool {
	for attempt := 0; ; attempt++ {
		err := f()
		if err == nil {
			return true
		}
		s.logf(what+": %v", append(args, err)...)
		if attempt == 4 {
			return false
		}
		time.Sleep(time.Duration(attempt+1) * time.Second)
	}
}

// finish marks the session ended (exited with status, or lost), revokes
// its grant, records session.ended once, and reclaims its run directory
// (its token copy goes with it); the uid is reclaimed by the next sandbox
// run given it.
func (s *Server) finish(l *live, status int, known bool) {
	var rec record
	_ = l.save(func(r *record) {
		if r.Ended.IsZero() {
			r.Ended = time.Now().UTC()
		}
		r.State, r.Exit = StateExited, status
		if !known {
			r.State, r.Exit = StateLost, -1
		}
		rec = *r
	})
	// First of all: the grant ends with the session.
	s.revoke(l)
	if !alive(rec.BwrapPID, rec.BwrapStart) {
		// A sandbox run killed before it could remove its cgroup leaves
		// it: gone with the session, it is removed here.
		sandbox.RemoveCgroups(rec.Cgroup)
	}
	data := map[string]any{"session_id": rec.ID, "grant_id": rec.GrantID, "state": rec.State, "exit": rec.Exit,
		"duration_seconds": rec.Ended.Sub(rec.Started).Seconds()}
	if known && status > 128 {
		data["signal"] = status - 128
	}
	if rec.PeakMemory > 0 {
		data["peak_memory"] = rec.PeakMemory
	}
	if !s.retry(func() error { return s.record(rec, "session.ended", data) }, "record session.ended of %s", rec.ID) {
		// Left unrecorded: the next start of the launcher tries again.
		close(l.done)
		return
	}
	if err := os.RemoveAll(filepath.Join(rec.under(l.dir), runName)); err != nil {
		s.logf("remove the run directory of %s: %v", rec.ID, err)
	}
	_ = l.save(func(r *record) { r.Recorded = true })
	close(l.done)
	s.prune(rec.Launcher)
}

// prune forgets the oldest ended sessions of launcher grant g beyond
// KeepEnded, and removes their directories, so that a grant launching
// session after session does not fill the launcher's disk and memory. A
// session is forgotten only once finished: session.ended recorded and its
// grant revoked (else the next start still has work to do with it).
func (s *Server) prune(g string) {
	s.mu.Lock()
	var ended []*live
	for _, l := range s.sessions {
		select {
		case <-l.done:
		default:
			continue
		}
		if r := l.snapshot(); r.Launcher == g && r.Recorded && r.Revoked {
			ended = append(ended, l)
		}
	}
	if len(ended) <= s.o.KeepEnded {
		s.mu.Unlock()
		return
	}
	sort.Slice(ended, func(i, j int) bool {
		a, b := ended[i].snapshot(), ended[j].snapshot()
		return a.Ended.Before(b.Ended) || a.Ended.Equal(b.Ended) && a.ID < b.ID
	})
	drop := ended[:len(ended)-s.o.KeepEnded]
	for _, l := range drop {
		delete(s.sessions, l.snapshot().ID)
	}
	s.mu.Unlock()
	for _, l := range drop {
		if err := removeSessionDir(l.dir); err != nil {
			s.logf("remove the directory of ended session %s: %v", l.snapshot().ID, err)
		}
	}
}

// adopt reads the state directory: a session still running (same pid,
// same start time) is followed again; one that ended while no launcher
// ran is finished with the status it left, or as lost.
func (s *Server) adopt() {
	ents, err := os.ReadDir(s.sessionsDir())
	if err != nil {
		s.logf("read %s: %v", s.sessionsDir(), err)
		return
	}
	for _, e := range ents {
		dir := filepath.Join(s.sessionsDir(), e.Name())
		rec, err := loadRecord(dir)
		if err != nil {
			// A launch cut before its process started (no stdout yet):
			// nothing ran. Anything else is left for the host to look at.
			if _, serr := os.Stat(filepath.Join(dir, stdoutName)); errors.Is(err, os.ErrNotExist) && errors.Is(serr, os.ErrNotExist) {
				if err := removeSessionDir(dir); err != nil {
					s.logf("remove %s, a launch cut short: %v", dir, err)
				}
			} else {
				s.logf("session directory %s has no usable record, left alone: %v", dir, err)
			}
			continue
		}
		l := &live{rec: *rec, dir: dir, done: make(chan struct{}), exited: make(chan struct{})}
		// Locked: the sessions adopted before this one may already be
		// finishing, and pruning, on their own goroutines.
		s.mu.Lock()
		s.sessions[rec.ID] = l
		s.mu.Unlock()
		if rec.Recorded {
			// Ended and recorded; its grant may not have been revoked yet.
			go func() {
				s.revoke(l)
				close(l.done)
				s.prune(rec.Launcher)
			}()
			continue
		}
		if rec.State == StateRunning {
			fd, ok := openIfSame(rec.PID, rec.StartTime)
			if !ok {
				// sandbox keep was killed, its bwrap (and so the session)
				// may not have been: follow bwrap; its status is lost.
				if _, _, done := readExit(filepath.Join(dir, exitName)); !done {
					fd, ok = openIfSame(rec.BwrapPID, rec.BwrapStart)
				}
			}
			if ok {
				s.logf("re-adopted session %s (pid %d)", rec.ID, rec.PID)
				go func() {
					waitPidfd(fd)
					close(l.exited)
				}()
				go s.watch(l)
				continue
			}
		}
		close(l.exited)
		go s.watch(l)
	}
}

// openIfSame opens a pidfd of pid if it is still the process started at
// start, and running; the pidfd is opened first, so the check holds for
// what it names. A zombie counts as ended: a launcher's dead child is
// reparented to an init that may be slow to reap it, or never does.
func openIfSame(pid int, start uint64) (int, bool) {
	if pid <= 0 {
		return -1, false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, false
	}
	if state, st, err := procStat(pid); err != nil || st != start || state == 'Z' || state == 'X' {
		unix.Close(fd)
		return -1, false
	}
	return fd, true
}

// alive reports whether pid is still the process started at start.
func alive(pid int, start uint64) bool {
	fd, ok := openIfSame(pid, start)
	if ok {
		unix.Close(fd)
	}
	return ok
}

// waitPidfd returns once the process behind fd has exited.
func waitPidfd(fd int) {
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, -1)
		if n > 0 || (err != nil && err != unix.EINTR) {
			return
		}
	}
}

// find returns session id if the caller may see it: the host sees every
// session, a grant those it launched.
func (s *Server) find(ctx context.Context, id string) (*live, error) {
	g, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	l, ok := s.sessions[id]
	s.mu.Unlock()
	if !ok || (!g.Host && l.snapshot().Launcher != g.ID) {
		return nil, errdefs.NotFound(errdefs.SessionNotFound, "no session %q launched by %s", clip(id), g.ID)
	}
	return l, nil
}

// listCommandBytes bounds the command List shows of each session.
const listCommandBytes = 512

// clipCommand keeps the arguments of cmd that fit in n bytes, the last
// one cut, and "..." after them when anything was left out.
func clipCommand(cmd []string, n int) []string {
	var out []string
	for _, a := range cmd {
		if len(a) > n {
			for n > 0 && !utf8.RuneStart(a[n]) {
				n-- // a string field of protobuf is UTF-8
			}
			return append(out, a[:n], "...")
		}
		n -= len(a)
		out = append(out, a)
	}
	return out
}

func clip(s string) string { return textsafe.Clip(s, 64) }

// List implements LaunchService.
func (s *Server) List(ctx context.Context, _ *launchv1.ListRequest) (*launchv1.ListResponse, error) {
	g, err := s.caller(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	var recs []record
	for _, l := range s.sessions {
		if r := l.snapshot(); g.Host || r.Launcher == g.ID {
			recs = append(recs, r)
		}
	}
	s.mu.Unlock()
	sort.Slice(recs, func(i, j int) bool { return recs[i].Started.Before(recs[j].Started) })
	out := &launchv1.ListResponse{}
	for _, r := range recs {
		p := sessionProto(r)
		// An overview: a command of up to 64 KiB each would make the
		// answer as large as the number of sessions (see maxAnswer).
		p.Command = clipCommand(p.Command, listCommandBytes)
		out.Sessions = append(out.Sessions, p)
	}
	return out, nil
}

// Wait implements LaunchService.
func (s *Server) Wait(ctx context.Context, r *launchv1.WaitRequest) (*launchv1.WaitResponse, error) {
	l, err := s.find(ctx, r.GetId())
	if err != nil {
		return nil, err
	}
	select {
	case <-l.done:
	case <-ctx.Done():
		return nil, errdefs.Unavailable(errdefs.NoAnswer, "session %s still runs: %v", r.GetId(), ctx.Err())
	}
	return &launchv1.WaitResponse{Session: sessionProto(l.snapshot())}, nil
}

// Stop implements LaunchService: SIGTERM to sandbox run, which passes it
// to the command; after the grace, SIGKILL to bwrap, whose death ends the
// whole session.
func (s *Server) Stop(ctx context.Context, r *launchv1.StopRequest) (*launchv1.StopResponse, error) {
	l, err := s.find(ctx, r.GetId())
	if err != nil {
		return nil, err
	}
	rec := l.snapshot()
	if fd, ok := openIfSame(rec.BwrapPID, rec.BwrapStart); ok {
		if !alive(rec.PID, rec.StartTime) {
			// Only bwrap is left (sandbox keep was killed): nothing would
			// pass a SIGTERM on, so the session ends at once.
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
		unix.Close(fd)
	}
	if fd, ok := openIfSame(rec.PID, rec.StartTime); ok {
		_ = unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0)
		select {
		case <-l.exited:
		case <-time.After(s.o.StopGrace):
			if child, _, ok := childOf(rec.PID); ok {
				_ = syscall.Kill(child, syscall.SIGKILL)
			}
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		case <-ctx.Done():
		}
		unix.Close(fd)
	}
	select {
	case <-l.done:
	case <-ctx.Done():
		return nil, errdefs.Unavailable(errdefs.NoAnswer, "session %s did not end yet: %v", r.GetId(), ctx.Err())
	}
	return &launchv1.StopResponse{Session: sessionProto(l.snapshot())}, nil
}

// logChunk bounds what one Logs answer carries of each stream: an answer
// the caller does not read stays in the launcher (launch.sock's Budget),
// so the client reads the tail in chunks, from the offsets each gives.
const logChunk = 32 << 10

// Logs implements LaunchService.
func (s *Server) Logs(ctx context.Context, r *launchv1.LogsRequest) (*launchv1.LogsResponse, error) {
	l, err := s.find(ctx, r.GetId())
	if err != nil {
		return nil, err
	}
	// Whether it had ended is learned before reading, so that an answer
	// saying ended holds everything the session wrote.
	var ended bool
	select {
	case <-l.exited:
		ended = true
	default:
	}
	out, t1, n1, err := tail(filepath.Join(l.dir, stdoutName), s.o.LogBytes, logChunk, r.GetFromOffsets(), r.GetStdoutOffset())
	if err != nil {
		return nil, err
	}
	errb, t2, n2, err := tail(filepath.Join(l.dir, stderrName), s.o.LogBytes, logChunk, r.GetFromOffsets(), r.GetStderrOffset())
	if err != nil {
		return nil, err
	}
	return &launchv1.LogsResponse{Stdout: out, Stderr: errb, Truncated: t1 || t2, StdoutNext: n1, StderrNext: n2, Ended: ended && !t1 && !t2}, nil
}

func sessionProto(r record) *launchv1.Session {
	p := &launchv1.Session{Id: r.ID, Business: r.Business, Project: r.Project, Task: r.Task, Role: r.Role, Capabilities: r.Caps,
		GrantId: r.GrantID, LauncherGrantId: r.Launcher, Uid: int64(r.UID), State: r.State, Exit: int32(r.Exit), Command: r.Command,
		Net: r.Net, Limits: r.Limits}
	if !r.Started.IsZero() {
		p.Started = r.Started.Format(time.RFC3339)
	}
	if !r.Ended.IsZero() {
		p.Ended = r.Ended.Format(time.RFC3339)
	}
	return p
}
