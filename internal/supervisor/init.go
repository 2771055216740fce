package supervisor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bushost/bushost/internal/gitcmd"
)

// The two users of a supervised workspace.
const (
	AppUser   = "app"   // runs the supervisor and the services
	AgentUser = "agent" // runs the agent; app is in its group
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
}

// Prepare is init's work as root: the users, the seeded workspace, its
// repository, AGENTS.md and ownership. It returns the account to drop to.
// configPath is made root-owned and not writable by others.
func Prepare(ctx context.Context, cfg *Config, configPath, seed string, logw io.Writer) (Account, error) {
	log := slog.New(slog.NewTextHandler(logw, nil))
	if os.Geteuid() != 0 {
		return Account{}, errors.New("init must run as root: it creates users and sets ownership (use `supervisor run` otherwise)")
	}
	agent, err := ensureUser(AgentUser, []string{"--create-home", "--shell", "/bin/bash"})
	if err != nil {
		return Account{}, err
	}
	app, err := ensureUser(AppUser, []string{"--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"})
	if err != nil {
		return Account{}, err
	}
	if app, err = ensureInGroup(app, AgentUser, agent.GID); err != nil {
		return Account{}, err
	}

	ws := cfg.Workspace
	if _, err := os.Lstat(filepath.Join(ws, ".git")); errors.Is(err, fs.ErrNotExist) && seed != "" {
		log.Info("first boot: seeding the workspace", "seed", seed, "workspace", ws)
		if err := seedWorkspace(seed, ws); err != nil {
			return Account{}, fmt.Errorf("seed %s: %w", seed, err)
		}
	}
	gitHome, err := os.MkdirTemp("", "bushost-supervisor-init-git-")
	if err != nil {
		return Account{}, err
	}
	defer os.RemoveAll(gitHome)
	git, err := gitcmd.New(gitHome)
	if err != nil {
		return Account{}, err
	}
	if err := NewRepo(git, ws, cfg.Watch, log).Ensure(ctx); err != nil {
		return Account{}, err
	}
	if err := writeAgentsFile(ws, log); err != nil {
		return Account{}, err
	}
	if err := setOwnership(ws, cfg.Watch, agent, log); err != nil {
		return Account{}, err
	}
	if err := trustWorkspaceForAgent(agent, ws); err != nil {
		log.Warn("the agent's own git will refuse the workspace (dubious ownership)", "err", err)
	}
	if err := protectFile(configPath); err != nil {
		return Account{}, fmt.Errorf("config %s: %w", configPath, err)
	}
	return app, nil
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
	for _, g := range a.Groups {
		if g == gid {
			return a, nil
		}
	}
	if out, err := exec.Command("usermod", "--append", "--groups", group, a.Name).CombinedOutput(); err != nil {
		return a, fmt.Errorf("usermod: add %s to group %s: %v: %s", a.Name, group, err, strings.TrimSpace(string(out)))
	}
	return lookup(a.Name)
}

// seedWorkspace copies seed into ws, without seedSkip names. Modes keep their
// permission bits only; symlinks are copied as links.
func seedWorkspace(seed, ws string) error {
	if err := os.MkdirAll(ws, 0o755); err != nil {
		return err
	}
	return filepath.WalkDir(seed, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(seed, p)
		if err != nil || rel == "." {
			return err
		}
		if seedSkip[d.Name()] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		dst := filepath.Join(ws, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(dst, fi.Mode().Perm())
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			os.Remove(dst)
			return os.Symlink(target, dst)
		case fi.Mode().IsRegular():
			return copyFile(p, dst, fi.Mode().Perm())
		}
		return nil
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(dst, mode)
	}
	return err
}

// writeAgentsFile regenerates AGENTS.md from infra/AGENTS.md and the agent's
// notes. The old file is opened without following links and must be a
// single-link regular file: root must not copy another file's content into
// one the agent can read.
func writeAgentsFile(ws string, log *slog.Logger) error {
	rules, err := os.ReadFile(filepath.Join(ws, "infra", "AGENTS.md"))
	if errors.Is(err, fs.ErrNotExist) {
		rules = []byte(defaultRules)
	} else if err != nil {
		return fmt.Errorf("infra/AGENTS.md: %w", err)
	}
	path := filepath.Join(ws, "AGENTS.md")
	old, exists, err := readOwnFile(path, maxAgentsBytes)
	if err != nil {
		log.Warn("AGENTS.md could not be read safely; starting the notes afresh", "err", err)
		old, exists = nil, false
	}
	return writeFileAtomic(path, RegenerateAgents(rules, old, exists, time.Now()), 0o664)
}

func readOwnFile(path string, limit int64) ([]byte, bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, true, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Nlink != 1 {
		return nil, true, fmt.Errorf("%s is not a single-link regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return b, true, err
}

// setOwnership gives the agent the watched trees, .git/ and AGENTS.md, and
// root everything else: the workspace root itself (so the agent can neither
// rename infra/ away nor replace its own files with links), infra/, the
// ignore rules. Directories the agent owns are setgid and carry a default
// ACL, so that files either user creates stay writable by the other through
// the agent group whatever its umask.
func setOwnership(ws string, watch []string, agent Account, log *slog.Logger) error {
	agentRoots := []string{".git", "AGENTS.md"}
	agentRoots = append(agentRoots, watch...)
	ownedByAgent := func(rel string) bool {
		for _, r := range agentRoots {
			if rel == r || strings.HasPrefix(rel, r+"/") {
				return true
			}
		}
		return false
	}
	aclWarned := false
	return filepath.WalkDir(ws, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(ws, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		link := fi.Mode()&fs.ModeSymlink != 0
		if !ownedByAgent(rel) {
			if err := os.Lchown(p, 0, 0); err != nil {
				return err
			}
			if !link && fi.Mode().Perm()&0o022 != 0 {
				return os.Chmod(p, fi.Mode().Perm()&^0o022|fi.Mode()&(fs.ModeSetgid|fs.ModeSticky))
			}
			return nil
		}
		// A hard link the agent made to a file it does not own must not
		// become its own by our chown.
		if fi.Mode().IsRegular() && st.Nlink > 1 && int(st.Uid) != agent.UID {
			log.Warn("not taking ownership of a hard-linked file for the agent", "path", p)
			return nil
		}
		if err := os.Lchown(p, agent.UID, agent.GID); err != nil {
			return err
		}
		switch {
		case link:
			return nil
		case d.IsDir():
			if err := os.Chmod(p, fi.Mode().Perm()|0o770|fs.ModeSetgid); err != nil {
				return err
			}
			if err := setDefaultACL(p); err != nil && !aclWarned {
				aclWarned = true
				log.Warn("no default ACLs on this filesystem: files the agent creates follow its umask (use 002)", "err", err)
			}
			return nil
		default:
			perm := fi.Mode().Perm()
			perm |= (perm & 0o600) >> 3
			return os.Chmod(p, perm)
		}
	})
}

// setDefaultACL sets the default ACL u::rwx,g::rwx,o::r-x on dir, written as
// the kernel's xattr so that no acl tools are needed.
func setDefaultACL(dir string) error {
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
	return unix.Setxattr(dir, "system.posix_acl_default", buf, 0)
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
	entry := "\tdirectory = \"" + escapeConfig(ws, true) + "\"\n"
	if strings.Contains(string(b), entry) {
		return nil
	}
	_, err = f.WriteString("# Added by the bushost supervisor: the workspace root belongs to root.\n[safe]\n" + entry)
	return err
}

// protectFile makes path root-owned and writable by root only.
func protectFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if err := os.Chown(path, 0, 0); err != nil {
		return err
	}
	return os.Chmod(path, fi.Mode().Perm()&^0o022)
}

// DropAndExec becomes app for good and executes this program with args:
// supplementary groups, gid and uid of app; no capability left in any set,
// the bounding set included; no_new_privs, so nothing it runs can gain
// privileges back. It returns only on failure.
func DropAndExec(app Account, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	// The bounding set and no_new_privs are per thread: set them on the
	// thread that calls execve.
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
	if err := syscall.Setgroups(app.Groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(app.GID); err != nil {
		return fmt.Errorf("setgid: %w", err)
	}
	if err := syscall.Setuid(app.UID); err != nil {
		return fmt.Errorf("setuid: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if os.Getuid() != app.UID || os.Geteuid() != app.UID {
		return errors.New("still privileged after setuid")
	}
	env := []string{}
	for _, kv := range os.Environ() {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "HOME", "USER", "LOGNAME":
		default:
			env = append(env, kv)
		}
	}
	env = append(env, "HOME="+app.Home, "USER="+app.Name, "LOGNAME="+app.Name)
	return syscall.Exec(exe, append([]string{exe}, args...), env)
}
