package sandbox

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Limits are the session's resource bounds. Zero means none.
type Limits struct {
	Memory  int64         // bytes: the cgroup's memory limit
	Pids    int           // tasks (processes and threads) in the cgroup; also RLIMIT_NPROC of the session's uid
	CPU     float64       // CPUs' worth of time per period (0.5 = half of one)
	NoFile  uint64        // RLIMIT_NOFILE
	FSize   int64         // RLIMIT_FSIZE, bytes
	Timeout time.Duration // SIGTERM, then SIGKILL after timeoutGrace; run exits 124
	// Disk is the size of the one file system (a tmpfs) holding the run
	// directory, so HOME and /tmp, and a workspace the launcher made.
	Disk int64
}

// ExitTimeout is run's status when --timeout ended the session, as
// timeout(1)'s.
const ExitTimeout = 124

// timeoutGrace is how long the command has between SIGTERM and SIGKILL.
const timeoutGrace = 5 * time.Second

// String lists the limits set, as their flags.
func (l Limits) String() string {
	var s []string
	add := func(set bool, flag, v string) {
		if set {
			s = append(s, flag+" "+v)
		}
	}
	add(l.Memory > 0, "--memory", strconv.FormatInt(l.Memory, 10))
	add(l.Pids > 0, "--pids", strconv.Itoa(l.Pids))
	add(l.CPU > 0, "--cpu", strconv.FormatFloat(l.CPU, 'g', -1, 64))
	add(l.NoFile > 0, "--nofile", strconv.FormatUint(l.NoFile, 10))
	add(l.FSize > 0, "--fsize", strconv.FormatInt(l.FSize, 10))
	add(l.Timeout > 0, "--timeout", l.Timeout.String())
	add(l.Disk > 0, "--disk", strconv.FormatInt(l.Disk, 10))
	return strings.Join(s, " ")
}

// rlimitMu serialises the launcher's borrowing of its own limits: the
// session's are set on the launcher just around the fork, which the child
// inherits, and the launcher's own are put back at once.
var rlimitMu sync.Mutex

// withRlimits runs start with the session's rlimits set on this process:
// core dumps off always (a dump of a session process would land in its
// workspace, or in a host's crash handler), and --nofile, --fsize and, for
// --pids, RLIMIT_NPROC (counted per uid: exact when the session has a uid
// of its own; root, the launcher, is exempt).
func (l Limits) withRlimits(start func() error) error {
	type rl struct {
		res int
		val uint64
	}
	want := []rl{{unix.RLIMIT_CORE, 0}}
	if l.NoFile > 0 {
		want = append(want, rl{unix.RLIMIT_NOFILE, l.NoFile})
	}
	if l.FSize > 0 {
		want = append(want, rl{unix.RLIMIT_FSIZE, uint64(l.FSize)})
	}
	if l.Pids > 0 {
		want = append(want, rl{unix.RLIMIT_NPROC, uint64(l.Pids)})
	}
	rlimitMu.Lock()
	defer rlimitMu.Unlock()
	saved := make([]syscall.Rlimit, len(want))
	for i, w := range want {
		if err := syscall.Getrlimit(w.res, &saved[i]); err != nil {
			return err
		}
	}
	restore := func(n int) {
		for i := n - 1; i >= 0; i-- {
			_ = syscall.Setrlimit(want[i].res, &saved[i])
		}
	}
	for i, w := range want {
		// syscall.Setrlimit, not unix's: for NOFILE it also stops the
		// runtime from putting its saved soft limit back in the child.
		if err := syscall.Setrlimit(w.res, &syscall.Rlimit{Cur: w.val, Max: w.val}); err != nil {
			restore(i)
			return fmt.Errorf("set the session's rlimit %d to %d: %w", w.res, w.val, err)
		}
	}
	err := start()
	restore(len(want))
	return err
}

// cgroup is the session's own control group: one directory per cgroup v1
// controller, or one in cgroup v2. run moves bwrap and the session's pid 1
// into it before pid 1 starts the command, and removes it at the end.
type cgroup struct {
	dirs []string
	v2   bool
}

// cgroupRoot is where control groups are mounted; a variable so that a
// test can stand for a host without them.
var cgroupRoot = "/sys/fs/cgroup"

// newCgroup makes the session's cgroup and writes its limits: in cgroup v2
// where the launcher's own cgroup has delegated the controllers needed
// (its cgroup.subtree_control lists them), else in the cgroup v1
// hierarchies of those controllers, each under the launcher's own cgroup
// there, when they are mounted writable. A limit that cannot be applied is
// a refusal that says why, never a session without it.
//
// parents (--cgroup-parent) are the cgroup v1 directories of the session
// that launched this one: the cgroup of each of their controllers is made
// in them instead, so that the launching session's limits hold both
// sessions together; every controller a parent has is needed, limit or
// not. Nesting in a cgroup v2 session is refused (its cgroup holds
// processes, so it can hand no controller down).
func newCgroup(l Limits, parents []string) (*cgroup, error) {
	var need []string
	if l.Memory > 0 {
		need = append(need, "memory")
	}
	if l.Pids > 0 {
		need = append(need, "pids")
	}
	if l.CPU > 0 {
		need = append(need, "cpu")
	}
	under := map[string]string{}
	for _, p := range parents {
		ctrl, err := parentController(p)
		if err != nil {
			return nil, refuse(ReasonLimitUnavailable, exitRefused, "--cgroup-parent %s: %v", p, err)
		}
		under[ctrl] = p
		if !slices.Contains(need, ctrl) {
			need = append(need, ctrl)
		}
	}
	if len(need) == 0 {
		return nil, nil
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, refuse(ReasonLimitUnavailable, exitRefused, "read /proc/self/cgroup for --memory/--pids/--cpu: %v", err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	name := "bushost-sandbox-" + hex.EncodeToString(b[:])
	var why []string
	if len(under) > 0 {
		why = append(why, "cgroup v2: not used, the launching session's cgroup is v1")
	} else {
		dir, err := v2Parent(own[""], need)
		if err == nil {
			c := &cgroup{v2: true, dirs: []string{filepath.Join(dir, name)}}
			if err = c.make(l); err == nil {
				return c, nil
			}
		}
		why = append(why, "cgroup v2: "+err.Error())
	}
	c := &cgroup{}
	for _, ctrl := range need {
		path, ok := own[ctrl]
		mount := filepath.Join(cgroupRoot, ctrl)
		if !ok || !isCgroupV1(mount) {
			why = append(why, fmt.Sprintf("cgroup v1: no %s hierarchy mounted at %s", ctrl, mount))
			return nil, refuse(ReasonLimitUnavailable, exitRefused, "cannot apply --%s here: %s", ctrl, strings.Join(why, "; "))
		}
		c.dirs = append(c.dirs, filepath.Join(cmp.Or(under[ctrl], filepath.Join(mount, path)), name))
	}
	if err := c.make(l); err != nil {
		why = append(why, "cgroup v1: "+err.Error())
		return nil, refuse(ReasonLimitUnavailable, exitRefused, "cannot apply --memory/--pids/--cpu here: %s", strings.Join(why, "; "))
	}
	return c, nil
}

// make creates the directories and writes the limits; on failure it
// removes what it made.
func (c *cgroup) make(l Limits) error {
	for i, d := range c.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			c.dirs = c.dirs[:i]
			c.remove()
			return err
		}
	}
	var writes [][2]string
	period := 100000
	quota := strconv.Itoa(max(1000, int(l.CPU*float64(period))))
	if c.v2 {
		d := c.dirs[0]
		if l.Memory > 0 {
			writes = append(writes, [2]string{filepath.Join(d, "memory.max"), strconv.FormatInt(l.Memory, 10)},
				[2]string{filepath.Join(d, "memory.swap.max"), "0"})
		}
		if l.Pids > 0 {
			writes = append(writes, [2]string{filepath.Join(d, "pids.max"), strconv.Itoa(l.Pids)})
		}
		if l.CPU > 0 {
			writes = append(writes, [2]string{filepath.Join(d, "cpu.max"), quota + " " + strconv.Itoa(period)})
		}
	} else {
		for _, d := range c.dirs {
			switch {
			// A controller the session is only nested in (--cgroup-parent)
			// gets no limit of its own: its parent's holds.
			case strings.HasPrefix(d, filepath.Join(cgroupRoot, "memory")+"/") && l.Memory > 0:
				v := strconv.FormatInt(l.Memory, 10)
				writes = append(writes, [2]string{filepath.Join(d, "memory.limit_in_bytes"), v})
				if _, err := os.Stat(filepath.Join(d, "memory.memsw.limit_in_bytes")); err == nil {
					// Memory and swap together: the session cannot swap its way past the limit.
					writes = append(writes, [2]string{filepath.Join(d, "memory.memsw.limit_in_bytes"), v})
				}
			case strings.HasPrefix(d, filepath.Join(cgroupRoot, "pids")+"/") && l.Pids > 0:
				writes = append(writes, [2]string{filepath.Join(d, "pids.max"), strconv.Itoa(l.Pids)})
			case strings.HasPrefix(d, filepath.Join(cgroupRoot, "cpu")+"/") && l.CPU > 0:
				writes = append(writes, [2]string{filepath.Join(d, "cpu.cfs_period_us"), strconv.Itoa(period)},
					[2]string{filepath.Join(d, "cpu.cfs_quota_us"), quota})
			}
		}
	}
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0o644); err != nil {
			if c.v2 && strings.HasSuffix(w[0], "memory.swap.max") && errors.Is(err, os.ErrNotExist) {
				continue // no swap accounting: there is no swap to limit
			}
			c.remove()
			return fmt.Errorf("write %s: %w", w[0], err)
		}
	}
	return nil
}

// enter moves the processes pids (bwrap and the session's pid 1, with all
// their threads) into the cgroup.
func (c *cgroup) enter(pids ...int) error {
	for _, d := range c.dirs {
		for _, pid := range pids {
			if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
				return fmt.Errorf("move pid %d into %s: %w", pid, d, err)
			}
		}
	}
	return nil
}

// peakMemory reads the most memory the cgroup used (memory.peak in cgroup
// v2, memory.max_usage_in_bytes in v1); 0 if it has no memory controller.
func (c *cgroup) peakMemory() int64 {
	for _, d := range c.dirs {
		for _, f := range []string{"memory.peak", "memory.max_usage_in_bytes"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return 0
}

// parentController checks a --cgroup-parent: an existing directory (not
// a link) of a cgroup v1 hierarchy under cgroupRoot, made by a sandbox
// run; it returns the hierarchy's controller.
func parentController(p string) (string, error) {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return "", errors.New("want a clean absolute path")
	}
	rel, err := filepath.Rel(cgroupRoot, p)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("not under %s", cgroupRoot)
	}
	ctrl, _, _ := strings.Cut(rel, "/")
	if !slices.Contains([]string{"memory", "pids", "cpu"}, ctrl) || !isCgroupV1(filepath.Join(cgroupRoot, ctrl)) {
		return "", fmt.Errorf("not in a cgroup v1 memory, pids or cpu hierarchy (cgroup v2 sessions cannot be nested in)")
	}
	if !strings.HasPrefix(filepath.Base(p), "bushost-sandbox-") {
		return "", errors.New("not a session's cgroup (bushost-sandbox-*)")
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", errors.New("no such cgroup directory: the launching session has ended")
	}
	return ctrl, nil
}

// killNested ends every session nested in cgroup directory d (the
// sessions it launched): SIGKILL to each process in d's child cgroups,
// then their directories are removed, deepest first, once empty. A nested
// session ends with the one that launched it.
func killNested(d string) {
	ents, err := os.ReadDir(d)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		child := filepath.Join(d, e.Name())
		killNested(child)
		if b, err := os.ReadFile(filepath.Join(child, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		rmdirWhenEmpty(child)
	}
}

// rmdirWhenEmpty removes cgroup directory d, trying again for a while as
// its last tasks are torn down; gone already is done.
func rmdirWhenEmpty(d string) {
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := unix.Rmdir(d)
		if err == nil || errors.Is(err, unix.ENOENT) || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// remove deletes the cgroup's directories once the session is gone,
// ending first the sessions nested in it; a directory whose last task is
// still being torn down is tried again for a while.
func (c *cgroup) remove() {
	for _, d := range c.dirs {
		killNested(d)
		rmdirWhenEmpty(d)
	}
}

// ownCgroups reads /proc/self/cgroup: each v1 controller's path, and the v2
// path under "".
func ownCgroups() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctrl := range strings.Split(parts[1], ",") {
			own[ctrl] = parts[2]
		}
	}
	return own, nil
}

// v2Parent is the launcher's own cgroup v2 directory when it has delegated
// every controller in need to its children.
func v2Parent(path string, need []string) (string, error) {
	var mount string
	for _, m := range []string{cgroupRoot, filepath.Join(cgroupRoot, "unified")} {
		var st unix.Statfs_t
		if unix.Statfs(m, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			mount = m
			break
		}
	}
	if mount == "" {
		return "", fmt.Errorf("not mounted")
	}
	dir := filepath.Join(mount, path)
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return "", err
	}
	have := strings.Fields(string(data))
	for _, n := range need {
		if !slices.Contains(have, n) {
			return "", fmt.Errorf("%s does not delegate the %s controller (its cgroup.subtree_control: %q)", dir, n, strings.TrimSpace(string(data)))
		}
	}
	return dir, nil
}

func isCgroupV1(mount string) bool {
	var st unix.Statfs_t
	if unix.Statfs(mount, &st) != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
		return false
	}
	_, err := os.Stat(filepath.Join(mount, "cgroup.procs"))
	return err == nil
}
