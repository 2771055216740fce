package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Session states.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StateExited   = "exited"
	// StateLost is a session that ended while no launcher ran and left no
	// exit status behind.
	StateLost = "lost"
)

// The files of a session's directory, SESSIONS/<id>/.
const (
	recordName = "record.json" // the record, rewritten whole
	exitName   = "exit"        // the status, written by `sandbox keep` as it ends
	stdoutName = "stdout"
	stderrName = "stderr"
	runName    = "run"  // the run directory (sandbox prepare)
	wsName     = "ws"   // the workspace the launcher made, when none was given
	diskName   = "disk" // with --disk: the session's tmpfs, holding run/ and ws/
	tokenName  = "token.in"
)

// record is one session as the state directory keeps it: enough to find
// its process again after a restart (pid and start time) and to answer
// list and wait for it.
type record struct {
	ID                      string            `json:"id"`
	Business, Project, Task string            `json:"-"`
	Scope                   [3]string         `json:"scope"`
	Role                    string            `json:"role"`
	Caps                    []string          `json:"caps"`
	GrantID                 string            `json:"grant_id"`
	Launcher                string            `json:"launcher_grant_id"`
	Command                 []string          `json:"command"`
	Limits                  map[string]string `json:"limits,omitempty"`
	Net                     string            `json:"net,omitempty"`
	PID                     int               `json:"pid"`
	// StartTime is field 22 of /proc/PID/stat: with the pid, it names the
	// process and never a later one given the same pid.
	StartTime uint64 `json:"start_time"`
	UID       int    `json:"uid"`
	// BwrapPID and BwrapStart name the session's bwrap, which outlives a
	// killed sandbox keep (and the session with it).
	BwrapPID   int    `json:"bwrap_pid,omitempty"`
	BwrapStart uint64 `json:"bwrap_start,omitempty"`
	// Cgroup are the directories of its cgroup, as its sandbox run
	// recorded them.
	Cgroup []string `json:"cgroup,omitempty"`
	// PeakMemory is the most memory its cgroup used (with --memory).
	PeakMemory int64     `json:"peak_memory,omitempty"`
	Started    time.Time `json:"started"`
	Ended      time.Time `json:"ended,omitzero"`
	State      string    `json:"state"`
	Exit       int       `json:"exit"`
	// Recorded is true once session.ended is in the log.
	Recorded bool `json:"recorded"`
	// Revoked is true once the session's grant is revoked: a grant ends
	// with its session.
	Revoked bool `json:"revoked"`
	// Disk is true when run/ and ws/ are on the session's disk (disk/,
	// a tmpfs of its --disk); OwnWorkspace when the launcher made ws/,
	// which it removes (WorkspaceRemoved) --keep-workspaces after the
	// session ended, or on session rm.
	Disk             bool `json:"disk,omitempty"`
	OwnWorkspace     bool `json:"own_workspace,omitempty"`
	WorkspaceRemoved bool `json:"workspace_removed,omitempty"`
}

// under is where run/ and ws/ are in the session's directory dir: on its
// disk, or in dir itself.
func (r *record) under(dir string) string {
	if r.Disk {
		return filepath.Join(dir, diskName)
	}
	return dir
}

// save writes the record to dir atomically (a new file renamed over).
func (r *record) save(dir string) error {
	r.Scope = [3]string{r.Business, r.Project, r.Task}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, recordName+".new")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	f, err := os.Open(tmp)
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, recordName))
}

func loadRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordName))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, recordName), err)
	}
	r.Business, r.Project, r.Task = r.Scope[0], r.Scope[1], r.Scope[2]
	return &r, nil
}

// readExit reads what `sandbox keep` wrote as the session ended, "STATUS
// PEAK", so that a launcher that was not there to reap it still learns the
// status; ok is false if there is nothing.
func readExit(path string) (status int, peak int64, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, 0, false
	}
	status, err = strconv.Atoi(f[0])
	if len(f) > 1 {
		peak, _ = strconv.ParseInt(f[1], 10, 64)
	}
	return status, peak, err == nil
}

// startTime reads field 22 of /proc/PID/stat.
func startTime(pid int) (uint64, error) {
	_, st, err := procStat(pid)
	return st, err
}

// procStat reads the state (field 3) and start time (field 22) of
// /proc/PID/stat, after the command name, which may hold spaces and
// parentheses: fields are counted from the last ')'.
func procStat(pid int) (byte, uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): field 22 is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, errors.New("malformed stat")
	}
	st, err := strconv.ParseUint(f[19], 10, 64)
	return f[0][0], st, err
}

// procUIDs reads the parent pid and the real uid of pid from
// /proc/PID/status.
func procUIDs(pid int) (ppid, uid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, false
	}
	ppid, uid = -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(line, "PPid:"); found {
			ppid, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		if v, found := strings.CutPrefix(line, "Uid:"); found {
			if f := strings.Fields(v); len(f) > 0 {
				uid, _ = strconv.Atoi(f[0])
			}
		}
	}
	return ppid, uid, ppid >= 0 && uid >= 0
}

// childOf returns the child of pid that is not root's (bwrap, under
// `sandbox keep`) and its real uid: the session's uid, since sandbox run
// starts bwrap as it. sandbox run's other children (the helpers that made
// its idmapped mounts, reaped at its end) are root's and passed over.
func childOf(pid int) (child, uid int, ok bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, false
	}
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, u, ok := procUIDs(c); ok && ppid == pid && u != 0 {
			return c, u, true
		}
	}
	return 0, 0, false
}

// tail reads at most chunk bytes of the last n of path, or with from,
// from offset; truncated says there was more (before what it read, or
// after it), next is where the read stopped.
func tail(path string, n, chunk int64, from bool, offset int64) (b []byte, truncated bool, next int64, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, offset, nil
	}
	if err != nil {
		return nil, false, offset, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, offset, err
	}
	size := st.Size()
	off := max(size-n, 0)
	if from {
		off = min(max(offset, 0), size)
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, false, offset, err
	}
	b, err = io.ReadAll(io.LimitReader(f, min(n, chunk)))
	next = off + int64(len(b))
	return b, next < size || (!from && off > 0), next, err
}
