package launch

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	launchv1 "github.com/bushost/bushost/api/bushost/launch/v1"
	"github.com/bushost/bushost/internal/authz"
	"github.com/bushost/bushost/internal/bounds"
	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/sandbox"
)

// settled is what a launch gets: the least of what it asked, what its
// grant's launch set allows and, from inside a session, what that session
// has; the host's defaults fill what it did not ask.
type settled struct {
	net            string
	domains, hosts []string
	limits         bounds.Values
	// from is the calling session (nil on the host): the new one nests in
	// its cgroup and ends with it.
	from *sandbox.SessionBounds
}

// runFlags are the sandbox run flags of s.
func (s settled) runFlags() []string {
	flags := []string{"--net=" + s.net}
	for _, d := range s.domains {
		flags = append(flags, "--allow-domain", d)
	}
	for _, h := range s.hosts {
		flags = append(flags, "--allow-host", h)
	}
	for _, l := range bounds.Limits {
		if v, ok := s.limits[l.Name]; ok {
			flags = append(flags, "--"+l.Name, l.Format(v))
		}
	}
	if s.from != nil {
		for _, d := range s.from.Cgroup {
			flags = append(flags, "--cgroup-parent", d)
		}
		flags = append(flags, "--end-with", fmt.Sprintf("%d:%d", s.from.PID, s.from.Start))
	}
	return flags
}

// asked reads a request's limits: the map, and the older fields memory,
// pids and timeout_seconds, which must agree with it.
func asked(r *launchv1.LaunchRequest) (bounds.Values, error) {
	m := map[string]string{}
	for k, v := range r.GetLimits() {
		m[k] = v
	}
	pids, timeout := "", ""
	if n := r.GetPids(); n != 0 {
		pids = strconv.FormatInt(n, 10)
	}
	if n := r.GetTimeoutSeconds(); n != 0 {
		timeout = (time.Duration(n) * time.Second).String()
	}
	for _, f := range [][2]string{{"memory", r.GetMemory()}, {"pids", pids}, {"timeout", timeout}} {
		if f[1] == "" {
			continue
		}
		if old, ok := m[f[0]]; ok && old != f[1] {
			return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "--%s given twice, as %q and %q", f[0], clip(old), f[1])
		}
		m[f[0]] = f[1]
	}
	v, err := bounds.ParseValues(m)
	if err != nil {
		return nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "%v", err)
	}
	return v, nil
}

// settle decides a launch's network and limits, or lists what is over
// (missing, for LAUNCH_NOT_ALLOWED); an error is a malformed request.
func (s *Server) settle(g authz.Grant, r *launchv1.LaunchRequest, from *sandbox.SessionBounds) (settled, []string, error) {
	out := settled{net: cmp.Or(r.GetNet(), bounds.NetNone), limits: bounds.Values{}, from: from}
	var missing []string
	lb := g.LaunchBounds
	if bounds.NetRank(out.net) < 0 {
		return settled{}, nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "--net=%q: want none, proxy or host", clip(out.net))
	}
	nets := lb.Nets
	if len(nets) == 0 {
		nets = []string{bounds.NetNone}
	}
	if !slices.Contains(nets, out.net) {
		missing = append(missing, fmt.Sprintf("--net=%s (the grant's launch set allows %s: grant --launch-net)", out.net, strings.Join(nets, ",")))
	}
	if from != nil && bounds.NetRank(out.net) > bounds.NetRank(from.Net) {
		missing = append(missing, fmt.Sprintf("--net=%s (the calling session has --net=%s)", out.net, from.Net))
	}

	// The egress allow-list: within the grant's and the calling session's.
	out.domains, out.hosts = r.GetAllowDomains(), r.GetAllowHosts()
	if out.net != bounds.NetProxy && (len(out.domains) > 0 || len(out.hosts) > 0) {
		return settled{}, nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "--allow-domain and --allow-host need --net=proxy")
	}
	if out.net == bounds.NetProxy {
		sessionNarrows := from != nil && from.Net == bounds.NetProxy
		if len(out.domains) == 0 && len(out.hosts) == 0 {
			// None asked for: the grant's, or from a proxy session, those
			// of its own the grant's cover.
			out.domains, out.hosts = lb.AllowDomains, lb.AllowHosts
			if sessionNarrows {
				out.domains, out.hosts = nil, nil
				for _, d := range from.AllowDomains {
					if bounds.DomainCovered(lb.AllowDomains, d) {
						out.domains = append(out.domains, d)
					}
				}
				for _, h := range from.AllowHosts {
					if bounds.HostCovered(lb.AllowHosts, h) {
						out.hosts = append(out.hosts, h)
					}
				}
			}
		}
		if _, err := (bounds.Launch{AllowDomains: out.domains, AllowHosts: out.hosts}).Check(); err != nil {
			return settled{}, nil, errdefs.InvalidArgument(errdefs.ArgumentInvalid, "%v", err)
		}
		for _, d := range out.domains {
			if !bounds.DomainCovered(lb.AllowDomains, d) {
				missing = append(missing, fmt.Sprintf("--allow-domain %s (not in the grant's --launch-allow-domain)", clip(d)))
			}
			if sessionNarrows && !bounds.DomainCovered(from.AllowDomains, d) {
				missing = append(missing, fmt.Sprintf("--allow-domain %s (not in the calling session's allow-list)", clip(d)))
			}
		}
		for _, h := range out.hosts {
			if !bounds.HostCovered(lb.AllowHosts, h) {
				missing = append(missing, fmt.Sprintf("--allow-host %s (not in the grant's --launch-allow-host)", clip(h)))
			}
			if sessionNarrows && !bounds.HostCovered(from.AllowHosts, h) {
				missing = append(missing, fmt.Sprintf("--allow-host %s (not in the calling session's allow-list)", clip(h)))
			}
		}
	}

	// The limits: what was asked must be within the ceiling (the grant's,
	// else the host's default) and the calling session's own; what was
	// not asked gets the least of the default, the ceiling and the
	// session's.
	want, err := asked(r)
	if err != nil {
		return settled{}, nil, err
	}
	ceilings, err := bounds.ParseValues(lb.Max)
	if err != nil {
		return settled{}, nil, fmt.Errorf("grant %s: stored ceilings: %w", g.ID, err)
	}
	var own bounds.Values
	if from != nil {
		if own, err = bounds.ParseValues(from.Limits); err != nil {
			return settled{}, nil, fmt.Errorf("the calling session's limits: %w", err)
		}
	}
	for _, l := range bounds.Limits {
		ceiling, hasCeiling := ceilings[l.Name]
		ceilingFrom := "the grant's --launch-max-" + l.Name
		if !hasCeiling {
			ceiling, hasCeiling = s.o.Defaults[l.Name]
			ceilingFrom = "sandbox serve --default-" + l.Name + ", the ceiling of a grant that names none"
		}
		mine, hasMine := own[l.Name]
		if v, ok := want[l.Name]; ok {
			if hasCeiling && v > ceiling {
				missing = append(missing, fmt.Sprintf("--%s %s (above %s %s)", l.Name, l.Format(v), ceilingFrom, l.Format(ceiling)))
			}
			if hasMine && v > mine {
				missing = append(missing, fmt.Sprintf("--%s %s (above the calling session's own %s)", l.Name, l.Format(v), l.Format(mine)))
			}
			out.limits[l.Name] = v
			continue
		}
		v, has := s.o.Defaults[l.Name]
		for _, b := range []struct {
			v  int64
			ok bool
		}{{ceiling, hasCeiling}, {mine, hasMine}} {
			if b.ok && (!has || b.v < v) {
				v, has = b.v, true
			}
		}
		if has {
			out.limits[l.Name] = v
		}
	}
	return out, missing, nil
}

// callerSession finds the session the caller runs in, from its uid: a
// session's uid is its own, and its sandbox run recorded what it was
// given in that uid's lock file (sandbox.ReadSessionBounds). A caller on
// the host gets nil. A caller that is in some sandbox or container whose
// bounds cannot be read (a session's uid with no record, a session run
// with a fixed --user, another pid namespace) is refused: what it may
// launch cannot be told.
func (s *Server) callerSession(peer authz.Peer) (*sandbox.SessionBounds, error) {
	notAllowed := func(format string, a ...any) error {
		return errdefs.PermissionDenied(errdefs.LaunchNotAllowed, format, a...)
	}
	state := s.stateDir()
	if peer.UID > 0 {
		b, err := sandbox.ReadSessionBounds(state, uint32(peer.UID))
		if err != nil {
			return nil, notAllowed("the calling session's bounds cannot be read: %v", err)
		}
		if b != nil {
			if !alive(b.PID, b.Start) {
				return nil, notAllowed("the calling session (uid %d) has ended", peer.UID)
			}
			return b, nil
		}
		if lo, hi := s.uidRange(); uint32(peer.UID) >= lo && uint32(peer.UID) <= hi {
			return nil, notAllowed("uid %d is a session uid (sandbox serve --uid-range) with no record of its bounds in %s", peer.UID, state)
		}
	}
	// The pid is what the peer had when it connected: it must still be a
	// process of the peer's uid (a pid given to someone else since is not
	// the caller), in the launcher's own pid namespace.
	if _, uid, ok := procUIDs(int(peer.PID)); !ok || uid != int(peer.UID) {
		return nil, notAllowed("the calling process (pid %d, uid %d) has gone", peer.PID, peer.UID)
	}
	mine, err1 := os.Readlink("/proc/self/ns/pid")
	theirs, err2 := os.Readlink("/proc/" + strconv.Itoa(int(peer.PID)) + "/ns/pid")
	if err1 != nil || err2 != nil || mine != theirs {
		return nil, notAllowed("the caller (pid %d, uid %d) runs in another pid namespace, a sandbox or container whose bounds the launcher cannot read (a sandbox run --user session): launch from the host or from a session with a uid of its own", peer.PID, peer.UID)
	}
	return nil, nil
}

// stateDir is where sandbox run keeps its sessions' uid leases.
func (s *Server) stateDir() string {
	if s.o.StateDir != "" {
		return s.o.StateDir
	}
	return sandbox.DefaultStateDir
}

// uidRange is the range sessions' uids come from (ServeFlags checked it).
func (s *Server) uidRange() (uint32, uint32) {
	if lo, hi, err := sandbox.ParseUIDRange(s.o.UIDRange); err == nil {
		return lo, hi
	}
	return sandbox.DefaultUIDLow, sandbox.DefaultUIDHigh
}
