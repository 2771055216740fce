package supervisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/safepath"
	"github.com/bushost/bushost/internal/testhook"
)

// seedSkip are names never copied from the seed, at any depth.
var seedSkip = map[string]bool{".git": true, ".github": true, "node_modules": true, "dist": true}

// Account is a resolved user.
type Account struct {
	Name   string
	UID    int
	GID    int
	Groups []int
	Home   string
	// services is set by Prepare on the app account: the user the
	// services run as.
	services *Account
}

// Prepare is init's work as root: the users, the seeded workspace, the
// supervisor's git dir, AGENTS.md and ownership. It returns the account to
// drop to (DropAndExec). configPath is made root-owned and not writable by
// others. It refuses to start while a process of the agent's user runs, and
// changes nothing in the workspace through a path (see safefs.go).
func Prepare(ctx context.Context, cfg *Config, configPath, seed string, log *slog.Logger) (Account, error) {
	if os.Geteuid() != 0 {
		return Account{}, errors.New("init must run as root: it creates users and sets ownership (use `supervisor run` otherwise)")
	}
	agent, err := ensureUser(cfg.AgentUser, []string{"--create-home", "--shell", "/bin/bash"})
	if err != nil {
		return Account{}, err
	}
	app, err := ensureUser(cfg.AppUser, []string{"--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"})
	if err != nil {
		return Account{}, err
	}
	if app, err = ensureInGroup(app, cfg.AgentUser, agent.GID); err != nil {
		return Account{}, err
	}
	svc, err := ensureUser(cfg.ServicesUser, []string{"--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"})
	if err != nil {
		return Account{}, err
	}
	for _, g := range svc.Groups {
		if slices.Contains(app.Groups, g) {
			return Account{}, errdefs.FailedPrecondition(errdefs.WorkspaceUnsafe,
				"services user %s shares group %d with %s: a service could then reach the supervisor's files", svc.Name, g, app.Name)
		}
	}
	if err := refuseAgentProcesses(agent); err != nil {
		return Account{}, err
	}

	ws := cfg.Workspace
	wsfd, fresh, err := openWorkspace(ws)
	if err != nil {
		return Account{}, err
	}
	defer unix.Close(wsfd)
	testhook.Swap("init.workspace")
	if fresh && seed != "" {
		log.Info("first boot: seeding the workspace", "seed", seed, "workspace", ws)
		if err := seedWorkspace(seed, wsfd, agent.UID); err != nil {
			return Account{}, fmt.Errorf("seed %s: %w", seed, err)
		}
	}
	for _, w := range cfg.Watch {
		fd, err := mkdirAllBeneath(wsfd, ws, w, 0o775)
		if err != nil {
			return Account{}, fmt.Errorf("watch %s: %w", w, err)
		}
		unix.Close(fd)
	}
	// A place for the agent's own git, if it wants one: the workspace root
	// is root's, so the agent could not make it.
	if err := unix.Mkdirat(wsfd, ".git", 0o770); err != nil && !errors.Is(err, unix.EEXIST) {
		return Account{}, fmt.Errorf("workspace .git: %w", err)
	}
	if err := prepareGitDir(cfg.GitDir, app, agent.GID); err != nil {
		return Account{}, err
	}
	if _, err := os.Lstat(filepath.Join(cfg.GitDir, "HEAD")); fresh && seed != "" && errors.Is(err, os.ErrNotExist) {
		// The first commit will hold the seed just copied: it needs no
		// acknowledgement, unlike files found in a workspace whose
		// history is missing.
		if err := markSeeded(cfg.GitDir, app.UID, app.GID); err != nil {
			return Account{}, fmt.Errorf("git_dir: %w", err)
		}
	}
	if cfg.HealthSocket != "" {
		if err := prepareSocketDir(filepath.Dir(cfg.HealthSocket), app); err != nil {
			return Account{}, fmt.Errorf("health_socket: %w", err)
		}
	}
	if err := writeAgentsFile(wsfd, cfg.GitDir, log); err != nil {
		return Account{}, err
	}
	if err := setOwnership(wsfd, ws, cfg.Watch, agent, log); err != nil {
		return Account{}, err
	}
	// The supervisor runs on the path: it must still name what init
	// prepared, or it was swapped, and is refused, never followed.
	if err := stillNames(ws, wsfd); err != nil {
		return Account{}, err
	}
	if err := trustWorkspaceForAgent(agent, ws); err != nil {
		log.Warn("the agent's own git will refuse the workspace (dubious ownership)", "err", err)
	}
	if err := protectFile(configPath); err != nil {
		return Account{}, fmt.Errorf("config %s: %w", configPath, err)
	}
	app.services = &svc
	return app, nil
}

// openWorkspace opens (making it if missing) the workspace directory, no
// component of whose path may be a link, and makes it root's and writable by
// root only before anything else happens in it. fresh reports a workspace
// that was missing or empty.
func openWorkspace(ws string) (fd int, fresh bool, err error) {
	abs, err := filepath.Abs(ws)
	if err != nil {
		return -1, false, err
	}
	// Every directory above it root's and writable by root only: no
	// other user can swap the way to it.
	ph, err := rootParent(filepath.Dir(abs))
	if err != nil {
		return -1, false, err
	}
	defer ph.Close()
	parent := ph.Fd()
	if err := unix.Mkdirat(parent, filepath.Base(ws), 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, false, fmt.Errorf("workspace: %w", err)
	}
	fd, err = safepath.OpenBeneath(parent, filepath.Base(ws), unix.O_DIRECTORY|unix.O_RDONLY)
	if err != nil {
		return -1, false, unsafePath(ws, err)
	}
	var st unix.Stat_t
	d := -1
	err = unix.Fstat(fd, &st)
	if err == nil {
		err = unix.Fchown(fd, 0, 0)
	}
	if err == nil {
		err = unix.Fchmod(fd, st.Mode&0o7777&^0o022)
	}
	if err == nil {
		d, err = unix.Openat(fd, ".", unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		unix.Close(fd)
		return -1, false, err
	}
	f := os.NewFile(uintptr(d), ws)
	names, _ := f.Readdirnames(1)
	f.Close()
	return fd, len(names) == 0, nil
}

// rootParent opens (making what is missing, 0755) the directory dir under
// which init makes something of its own: root's, writable by root only,
// reached through no link and no directory another user controls. "/"
// itself (the workspace /workspace of a container) is held to the same
// rule.
func rootParent(dir string) (*safepath.Handle, error) {
	if filepath.Clean(dir) != "/" {
		return safepath.MkdirAll(dir, 0, 0o755)
	}
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	h, err := safepath.FromFd(fd, "/", 0)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	st := h.Stat()
	if err := safepath.Trusted("/", &st, 0); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// stillNames refuses (PATH_CHANGED) a workspace path that no longer leads,
// through root's directories and no link, to the directory wsfd holds.
func stillNames(ws string, wsfd int) error {
	abs, err := filepath.Abs(ws)
	if err != nil {
		return err
	}
	fd, err := unix.FcntlInt(uintptr(wsfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	h, err := safepath.FromFd(fd, abs, 0)
	if err != nil {
		return err
	}
	defer h.Close()
	return h.Recheck()
}

// prepareGitDir makes the supervisor's git dir (its parents root's, no link
// on the way) and gives it to app, group the agent's, mode 0750: the agent
// may read the history, never write it; the services' user cannot enter.
// An existing one must be app's or root's.
func prepareGitDir(dir string, app Account, agentGID int) error {
	parentPath := filepath.Dir(dir)
	// Root's, writable by root only, reached through no link and through
	// no directory another user controls.
	fd, st, err := ownDir(dir, func(err error) error {
		return errdefs.FailedPrecondition(errdefs.GitDirUnsafe, "the parent of git_dir, %s, must be root's and writable by root only: %v", parentPath, err).With("path", parentPath)
	})
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if st.Uid != 0 && int(st.Uid) != app.UID {
		return errdefs.FailedPrecondition(errdefs.GitDirUnsafe, "git_dir %s belongs to uid %d, neither root nor %s", dir, st.Uid, app.Name).With("path", dir)
	}
	if err := unix.Fchown(fd, app.UID, agentGID); err != nil {
		return err
	}
	return unix.Fchmod(fd, 0o750)
}

// ownDir makes (0700, if missing) and opens the directory dir under its
// parent, root's and reached through no link (rootParent; parentErr says
// what a refused parent means), following no link, and returns it with
// what it is.
func ownDir(dir string, parentErr func(error) error) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	ph, err := rootParent(filepath.Dir(dir))
	if err != nil {
		return -1, st, parentErr(err)
	}
	defer ph.Close()
	if err := unix.Mkdirat(ph.Fd(), filepath.Base(dir), 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, st, fmt.Errorf("%s: %w", dir, err)
	}
	fd, err := safepath.OpenBeneath(ph.Fd(), filepath.Base(dir), unix.O_DIRECTORY|unix.O_RDONLY)
	if err != nil {
		return -1, st, unsafePath(dir, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// prepareSocketDir makes the directory of health_socket (its parents
// root's, no link on the way) root's, group app's, mode 0770: the
// supervisor makes its socket there and root (the container's
// HEALTHCHECK) connects to it; the agent and the services cannot enter.
func prepareSocketDir(dir string, app Account) error {
	fd, st, err := ownDir(dir, func(err error) error { return err })
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if st.Uid != 0 {
		return unsafePath(dir, fmt.Errorf("belongs to uid %d, not root", st.Uid))
	}
	if err := unix.Fchown(fd, 0, app.GID); err != nil {
		return err
	}
	return unix.Fchmod(fd, 0o770)
}

// refuseAgentProcesses fails, naming one, if any process runs with the
// agent's uid (real, effective, saved or filesystem): such a process could
// swap a path for a link while init works.
func refuseAgentProcesses(agent Account) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	want := strconv.Itoa(agent.UID)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		name := ""
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Name:"); ok {
				name = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "Uid:"); ok && slices.Contains(strings.Fields(v), want) {
				return errdefs.FailedPrecondition(errdefs.AgentProcessRunning,
					"process %d (%s) of user %s is running: init must not run while the agent can change the workspace",
					pid, name, agent.Name).With("pid", pid)
			}
		}
	}
	return nil
}

func lookup(name string) (Account, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return Account{}, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	a := Account{Name: name, UID: uid, GID: gid, Home: u.HomeDir}
	ids, err := u.GroupIds()
	if err != nil {
		return Account{}, fmt.Errorf("groups of %s: %w", name, err)
	}
	for _, id := range ids {
		g, _ := strconv.Atoi(id)
		a.Groups = append(a.Groups, g)
	}
	return a, nil
}

// ensureUser returns name's account, creating it (and a group of the same
// name, or joining that group if it already exists) if missing.
func ensureUser(name string, flags []string) (Account, error) {
	if a, err := lookup(name); err == nil {
		return a, nil
	}
	args := append([]string{}, flags...)
	if _, err := user.LookupGroup(name); err == nil {
		args = append(args, "--gid", name)
	} else {
		args = append(args, "--user-group")
	}
	out, err := exec.Command("useradd", append(args, name)...).CombinedOutput()
	if a, lerr := lookup(name); lerr == nil {
		// Made by us, or by a concurrent init.
		return a, nil
	}
	return Account{}, fmt.Errorf("useradd %s: %v: %s", name, err, strings.TrimSpace(string(out)))
}

func ensureInGroup(a Account, group string, gid int) (Account, error) {
	if slices.Contains(a.Groups, gid) {
		return a, nil
	}
	if out, err := exec.Command("usermod", "--append", "--groups", group, a.Name).CombinedOutput(); err != nil {
		return a, fmt.Errorf("usermod: add %s to group %s: %v: %s", a.Name, group, err, strings.TrimSpace(string(out)))
	}
	return lookup(a.Name)
}

// seedWorkspace copies seed into the workspace wsfd, without seedSkip
// names. The seed is opened once from / following no link, every
// directory on the way root's or the agent's (uid) and writable by no one
// else (internal/safepath), and walked through descriptors: a name swapped
// for a link while init copies is skipped, never followed. Modes keep their
// permission bits only; symlinks are copied as links; anything but a
// directory, a regular file or a link is left out.
func seedWorkspace(seed string, wsfd, uid int) error {
	abs, err := filepath.Abs(seed)
	if err != nil {
		return err
	}
	h, err := safepath.OpenDir(abs, uid)
	if err != nil {
		return err
	}
	defer h.Close()
	testhook.Swap("init.seed")
	return copyTree(h.Fd(), wsfd, abs, 0)
}

// copyTree copies the entries of the directory src into dst.
func copyTree(src, dst int, path string, depth int) error {
	if depth > maxSeedDepth {
		return fmt.Errorf("%s: more than %d directories deep", path, maxSeedDepth)
	}
	d, err := unix.Dup(src)
	if err != nil {
		return err
	}
	if _, err := unix.Seek(d, 0, 0); err != nil {
		unix.Close(d)
		return err
	}
	f := os.NewFile(uintptr(d), path)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, name := range names {
		if seedSkip[name] {
			continue
		}
		if err := copyEntry(src, dst, filepath.Join(path, name), name, depth); err != nil {
			return err
		}
	}
	return nil
}

// maxSeedDepth bounds copyTree: each level holds two descriptors.
const maxSeedDepth = 256

func copyEntry(src, dst int, path, name string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	perm := st.Mode & 0o777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		sfd, err := safepath.OpenBeneath(src, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("%s (a directory, never a link): %w", path, err)
		}
		defer unix.Close(sfd)
		if err := unix.Mkdirat(dst, name, perm); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%s: %w", path, err)
		}
		dfd, err := safepath.OpenBeneath(dst, name, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return unsafePath(path, err)
		}
		defer unix.Close(dfd)
		return copyTree(sfd, dfd, path, depth+1)
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(src, name, buf)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		_ = unix.Unlinkat(dst, name, 0)
		return unix.Symlinkat(string(buf[:n]), dst, name)
	case unix.S_IFREG:
		sfd, err := safepath.OpenBeneath(src, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
		if err != nil {
			return fmt.Errorf("%s (a file, never a link): %w", path, err)
		}
		in := os.NewFile(uintptr(sfd), path)
		defer in.Close()
		var got unix.Stat_t
		if err := unix.Fstat(sfd, &got); err != nil || got.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("%s is no longer a regular file", path)
		}
		dfd, err := unix.Openat(dst, name, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		out := os.NewFile(uintptr(dfd), path)
		_, err = io.Copy(out, in)
		if err == nil {
			err = unix.Fchmod(dfd, perm)
		}
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		return err
	}
	return nil
}

// writeAgentsFile regenerates AGENTS.md from infra/AGENTS.md and the agent's
// notes. Both are read through no link and only if they are single-link
// regular files: root must not copy another file's content into one the
// agent can read. The new file replaces the old one by a rename in the
// workspace root, which only root can write.
func writeAgentsFile(wsfd int, gitDir string, log *slog.Logger) error {
	rules, err := hostRules(wsfd, gitDir)
	if err != nil {
		return err
	}
	old, exists, err := readFileBeneath(wsfd, "AGENTS.md", maxAgentsBytes)
	if err != nil {
		log.Warn("AGENTS.md could not be read safely; starting the notes afresh", "err", err)
		old, exists = nil, false
	}
	file, unkept := regenerateAgents(rules, old, exists, time.Now())
	if unkept != nil {
		// Written before AGENTS.md is replaced: a failure here leaves the
		// old file as it was.
		if err := replaceFileAt(wsfd, UnkeptAgents, unkept, 0o664); err != nil {
			return fmt.Errorf("%s: %w", UnkeptAgents, err)
		}
		log.Warn("AGENTS.md had no sentinel line and was not the rules: its content was moved aside, and its notes start afresh", "moved_to", UnkeptAgents)
	}
	return replaceFileAt(wsfd, "AGENTS.md", file, 0o664)
}

// setOwnership gives the agent the watched trees, .git/ and AGENTS.md, and
// root everything else: the workspace root itself (so the agent can neither
// rename infra/ away nor replace its own files with links), infra/.
// Directories the agent owns are setgid and carry a default ACL, so that
// files either user creates stay writable by the other through the agent
// group whatever its umask. Every change goes through a descriptor opened
// beneath the parent it walked from, following no link.
func setOwnership(wsfd int, ws string, watch []string, agent Account, log *slog.Logger) error {
	o := &owner{agent: agent, log: log, agentRoots: append([]string{".git", "AGENTS.md"}, watch...)}
	return walkTree(wsfd, walkFuncs{
		visit: func(dirfd int, rel, name string, lst *unix.Stat_t, _ int) (bool, error) {
			return o.entry(dirfd, filepath.Join(ws, rel), rel, name, lst)
		},
		dirErr: func(rel string, err error) error {
			return fmt.Errorf("%s: %w", filepath.Join(ws, rel), err)
		},
	})
}

type owner struct {
	agent Account
	log   *slog.Logger
	// agentRoots are the agent's, with everything below them.
	agentRoots []string
	aclWarned  bool
}

// entry hands over one entry of the directory dirfd, as the walk found it
// (lst), and reports whether the walk should enter it (a directory it
// handed over).
func (o *owner) entry(dirfd int, path, rel, name string, lst *unix.Stat_t) (bool, error) {
	agent := slices.ContainsFunc(o.agentRoots, func(r string) bool { return within(rel, r) })
	uid, gid := 0, 0
	if agent {
		uid, gid = o.agent.UID, o.agent.GID
	}
	testhook.SwapEntry("init.owner", name)
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY
	switch lst.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		flags |= unix.O_DIRECTORY
	case unix.S_IFREG:
	case unix.S_IFLNK:
		// The link itself, never its target (a link has no mode): a
		// handle on the name, which O_PATH|O_NOFOLLOW leaves unfollowed.
		fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			return false, nil // removed since: nothing to hand over
		}
		if err != nil {
			o.log.Warn("init: skipped a path that changed under it", "path", shortPath(path), "err", err)
			return false, nil
		}
		defer unix.Close(fd)
		return false, o.chownHandle(fd, path, lst, agent, uid, gid)
	default:
		// A fifo, socket or device: ownership through an O_PATH handle,
		// no mode change.
		fd, err := safepath.OpenBeneath(dirfd, name, unix.O_PATH)
		if err != nil {
			o.log.Warn("init: skipped a path that changed under it", "path", shortPath(path), "err", err)
			return false, nil
		}
		defer unix.Close(fd)
		return false, o.chownHandle(fd, path, lst, agent, uid, gid)
	}
	fd, err := safepath.OpenBeneath(dirfd, name, flags)
	if err != nil {
		// Swapped for a link (ELOOP) or removed since the stat: never
		// followed, nothing to hand over.
		o.log.Warn("init: skipped a path that changed under it", "path", shortPath(path), "err", err)
		return false, nil
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	perm := st.Mode & 0o777
	if !agent {
		if err := unix.Fchown(fd, 0, 0); err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
		if perm&0o022 != 0 {
			if err := unix.Fchmod(fd, st.Mode&0o7777&^0o022); err != nil {
				return false, fmt.Errorf("%s: %w", path, err)
			}
		}
	} else {
		// A hard link the agent made to a file it does not own must not
		// become its own by our chown.
		if !isDir && st.Nlink > 1 && int(st.Uid) != o.agent.UID {
			o.log.Warn("not taking ownership of a hard-linked file for the agent", "path", shortPath(path))
			return false, nil
		}
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
		// An access ACL the agent set (u:app:--- hides a directory from
		// the supervisor) goes: the modes below say who may do what.
		if err := unix.Fremovexattr(fd, "system.posix_acl_access"); err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.EOPNOTSUPP) {
			return false, fmt.Errorf("%s: remove its access ACL: %w", path, err)
		}
		if isDir {
			if err := unix.Fchmod(fd, perm|0o770|unix.S_ISGID); err != nil {
				return false, fmt.Errorf("%s: %w", path, err)
			}
			if err := setDefaultACL(fd); err != nil && !o.aclWarned {
				o.aclWarned = true
				o.log.Warn("no default ACLs on this filesystem: files the agent creates follow its umask (use 002)", "err", err)
			}
		} else if err := unix.Fchmod(fd, perm|(perm&0o600)>>3); err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
	}
	return isDir, nil
}

// chownHandle hands over, through fd (an O_PATH handle on a link, fifo,
// socket or device the walk saw as lst), what fd holds. The name may have
// been swapped since the walk's stat, for a hard link to a file of
// someone else's: what gets chowned is what the handle holds, so that is
// what is checked, as for a regular file.
func (o *owner) chownHandle(fd int, path string, lst *unix.Stat_t, agent bool, uid, gid int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != lst.Mode&unix.S_IFMT {
		o.log.Warn("init: skipped a path that changed under it", "path", shortPath(path), "err", "no longer the type the walk saw")
		return nil
	}
	// A hard link the agent made to one it does not own must not become
	// its own by our chown.
	if agent && st.Nlink > 1 && int(st.Uid) != o.agent.UID {
		o.log.Warn("not taking ownership of a hard-linked file for the agent", "path", shortPath(path))
		return nil
	}
	if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// setDefaultACL sets the default ACL u::rwx,g::rwx,o::r-x on dir, written as
// the kernel's xattr so that no acl tools are needed.
func setDefaultACL(fd int) error {
	const undefinedID = 0xffffffff
	entries := []struct {
		tag, perm uint16
	}{{0x01, 7}, {0x04, 7}, {0x20, 5}} // USER_OBJ, GROUP_OBJ, OTHER
	buf := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		buf = binary.LittleEndian.AppendUint16(buf, e.tag)
		buf = binary.LittleEndian.AppendUint16(buf, e.perm)
		buf = binary.LittleEndian.AppendUint32(buf, undefinedID)
	}
	return unix.Fsetxattr(fd, "system.posix_acl_default", buf, 0)
}

// trustWorkspaceForAgent adds ws to safe.directory in the agent's
// ~/.gitconfig: the workspace root is root's, so without it the agent's own
// git refuses the repository as of dubious ownership. The file is the
// agent's, so root opens it without following links and only if it is a
// single-link regular file owned by the agent (or absent).
func trustWorkspaceForAgent(agent Account, ws string) error {
	if agent.Home == "" {
		return errors.New("agent has no home directory")
	}
	path := filepath.Join(agent.Home, ".gitconfig")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Nlink != 1 || (int(st.Uid) != agent.UID && st.Size > 0) {
		return fmt.Errorf("%s is not the agent's own regular file", path)
	}
	if err := f.Chown(agent.UID, agent.GID); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxAgentsBytes))
	if err != nil {
		return err
	}
	entry := "\tdirectory = \"" + escapeConfig(ws) + "\"\n"
	if strings.Contains(string(b), entry) {
		return nil
	}
	_, err = f.WriteString("# Added by the bushost supervisor: the workspace root belongs to root.\n[safe]\n" + entry)
	return err
}

// protectFile makes path root-owned and writable by root only, through a
// descriptor opened beneath its directory (root's, reached through no
// link: internal/safepath), never following a link.
func protectFile(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	dir, err := safepath.OpenDir(filepath.Dir(abs), 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	fd, err := safepath.OpenBeneath(dir.Fd(), filepath.Base(abs), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%s is not a regular file", path)
	}
	if err := unix.Fchown(fd, 0, 0); err != nil {
		return err
	}
	return unix.Fchmod(fd, st.Mode&0o7777&^0o022)
}

// DropAndExec becomes app for good and executes this program with args:
// supplementary groups, gid and uid of app; no capability left in any set,
// the bounding set included; no_new_privs, so nothing it runs can gain
// privileges back. If Prepare named a services user, the services' launcher
// is started as that user first, from the thread that execs (its
// parent-death signal follows that thread). It returns only on failure.
func DropAndExec(app Account, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// The bounding set and no_new_privs are per thread: set them on the
	// thread that starts the launcher and calls execve.
	runtime.LockOSThread()
	for c := 0; c <= 63; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				break
			}
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if svc := app.services; svc != nil {
		fd, pid, err := startLauncher(exe, *svc, userEnv(*svc))
		if err != nil {
			return err
		}
		os.Setenv(launcherEnv, strconv.Itoa(fd))
		os.Setenv(launcherPidEnv, strconv.Itoa(pid))
	}
	if err := syscall.Setgroups(app.Groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(app.GID); err != nil {
		return fmt.Errorf("setgid: %w", err)
	}
	if err := syscall.Setuid(app.UID); err != nil {
		return fmt.Errorf("setuid: %w", err)
	}
	if os.Getuid() != app.UID || os.Geteuid() != app.UID {
		return errors.New("still privileged after setuid")
	}
	return syscall.Exec(exe, append([]string{exe}, args...), userEnv(app))
}

// userEnv is this process's environment with HOME, USER and LOGNAME of a.
func userEnv(a Account) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return name == "HOME" || name == "USER" || name == "LOGNAME"
	})
	return append(env, "HOME="+a.Home, "USER="+a.Name, "LOGNAME="+a.Name)
}

// escapeConfig quotes s for a git config file, as a value.
func escapeConfig(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch {
		case c == '\\' || c == '"':
			b.WriteByte('\\')
			b.WriteRune(c)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}
