package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/bounds"
)

// SessionBounds is what a running session was given, as run records it in
// its uid's lock file (root's, in --state-dir) before the session starts:
// sandbox serve reads it when that session launches another, which may
// have no more (docs/launch.md).
type SessionBounds struct {
	Net          string   `json:"net"`
	AllowDomains []string `json:"allow_domains,omitempty"`
	AllowHosts   []string `json:"allow_hosts,omitempty"`
	// Limits are its limits by bounds name, as their flags write them.
	Limits map[string]string `json:"limits,omitempty"`
	// Cgroup are its cgroup's directories (one per v1 controller, or one
	// v2 directory): a session it launches nests there.
	Cgroup []string `json:"cgroup,omitempty"`
	// PID and Start name the sandbox run that runs it (Start is field 22
	// of /proc/PID/stat): the session has ended once that process is gone.
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
	// Mapped are the directories it sees as its own through idmapped
	// mounts (none when run handed them over instead): a directory in
	// one, owned on disk by its UID, is the session's to launch on.
	Mapped []Mapped `json:"mapped,omitempty"`
}

// Values are the limits set, by bounds name.
func (l Limits) Values() bounds.Values {
	v := bounds.Values{}
	set := func(name string, n int64) {
		if n > 0 {
			v[name] = n
		}
	}
	set("memory", l.Memory)
	set("pids", int64(l.Pids))
	set("cpu", int64(l.CPU*1000+0.5))
	set("nofile", int64(l.NoFile))
	set("fsize", l.FSize)
	set("timeout", int64((l.Timeout+time.Second-1)/time.Second))
	set("disk", l.Disk)
	return v
}

// LimitsOf is the Limits of values by bounds name (Values' inverse).
func LimitsOf(v bounds.Values) Limits {
	return Limits{Memory: v["memory"], Pids: int(v["pids"]), CPU: float64(v["cpu"]) / 1000, NoFile: uint64(v["nofile"]),
		FSize: v["fsize"], Timeout: time.Duration(v["timeout"]) * time.Second, Disk: v["disk"]}
}

// ProbeCgroup makes and removes a cgroup carrying l's cgroup limits, as
// run would for a session: an error (a LIMIT_UNAVAILABLE refusal) says
// why sessions given them would be refused here.
func ProbeCgroup(l Limits) error {
	c, err := newCgroup(l, nil)
	if err != nil {
		return err
	}
	if c != nil {
		c.remove()
	}
	return nil
}

// sessionBounds is what run records of plan p and its cgroup.
func (p *Plan) sessionBounds(cg *cgroup) (*SessionBounds, error) {
	start, err := procStartTime(os.Getpid())
	if err != nil {
		return nil, err
	}
	b := &SessionBounds{Net: p.Config.Net, Limits: p.Config.Limits.Values().Strings(), PID: os.Getpid(), Start: start}
	if p.Config.Net == NetProxy {
		b.AllowDomains, b.AllowHosts = p.Config.AllowDomains, p.Config.AllowHosts
	}
	if cg != nil {
		b.Cgroup = cg.dirs
	}
	return b, nil
}

// ReadSessionBounds returns what the session running as uid was given, from
// uid's lock file in state; nil if no session holds uid. The file must be
// root's and a regular file, never followed through a link.
func ReadSessionBounds(state string, uid uint32) (*SessionBounds, error) {
	path := lockPath(state, uid)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 {
		return nil, fmt.Errorf("%s is not a regular file of root's", path)
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%s records nothing yet", path)
	}
	var rec leaseRecord
	if err := json.Unmarshal(data, &rec); err != nil || rec.UID != uid {
		return nil, fmt.Errorf("%s holds no record of uid %d", path, uid)
	}
	if rec.Session == nil {
		return nil, fmt.Errorf("%s records no session bounds (a sandbox run that records none)", path)
	}
	return rec.Session, nil
}

// RemoveCgroups removes the cgroup directories of a session that has
// ended (SessionBounds.Cgroup) if its sandbox run could not, killed
// before it did: the sessions nested in them end first. A directory that
// is not a session's cgroup v1 directory is left alone.
func RemoveCgroups(dirs []string) {
	for _, d := range dirs {
		if _, err := parentController(d); err == nil {
			killNested(d)
			rmdirWhenEmpty(d)
		}
	}
}

// procStartTime reads field 22 of /proc/PID/stat, counted after the
// command name (which may hold spaces and parentheses).
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// endWith opens a pidfd of the process PID:START (--end-with): the session
// ends when it does. A process that is gone, or is another by now, is an
// error: the session it stood for has ended.
func endWith(spec string) (int, error) {
	pidS, startS, ok := strings.Cut(spec, ":")
	pid, err1 := strconv.Atoi(pidS)
	start, err2 := strconv.ParseUint(startS, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 {
		return -1, fmt.Errorf("%w: --end-with %q: want PID:STARTTIME", ErrUsage, spec)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, refuse(ReasonLaunchingSessionEnded, exitRefused, "--end-with %s: the launching session has ended: %v", spec, err)
	}
	if st, err := procStartTime(pid); err != nil || st != start {
		unix.Close(fd)
		return -1, refuse(ReasonLaunchingSessionEnded, exitRefused, "--end-with %s: the launching session has ended", spec)
	}
	return fd, nil
}

// waitGone returns a channel closed once the process behind pidfd fd has
// exited.
func waitGone(fd int) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		defer close(c)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			n, err := unix.Poll(fds, -1)
			if n > 0 || (err != nil && err != unix.EINTR) {
				return
			}
		}
	}()
	return c
}
