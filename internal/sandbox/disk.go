package sandbox

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// A session's disk (--disk SIZE) is one tmpfs of SIZE holding its run
// directory (so HOME and /tmp, and whatever it writes beside them) and a
// workspace made with it: what the session writes there, together, is
// bounded, and writes past it fail with ENOSPC inside; nothing on the
// host's own file systems fills (they have no quotas here). Its pages are
// charged to the memory cgroup of the process that wrote them, so a
// session with --memory M writes at most about M of it while it runs (the
// OOM killer ends one of its processes first), and what it left stays in
// the host's memory until the file system is unmounted.

// diskInodes bounds a disk's files: one per 8 KiB of it, at least 4096.
func diskInodes(size int64) int64 { return max(size/8192, 4096) }

// MountDisk mounts a session's disk of size bytes on dir, an empty
// directory of root's, writable by no one else, that its caller just made (the
// launcher's session directory, or the probe's). dir is opened once
// without following a link and the mount goes on that descriptor: if
// whoever owns a directory above swapped a name for a link after the
// mkdir, the disk still lands on the directory made, or nowhere.
func MountDisk(dir string, size int64) error {
	if size <= 0 {
		return errors.New("a disk of no size")
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the session's disk %s: %w", dir, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("the session's disk %s: %w", dir, err)
	}
	if st.Uid != 0 || st.Mode&0o022 != 0 || st.Nlink != 2 {
		return fmt.Errorf("the session's disk %s: not the empty directory of root's, writable by root alone, just made: owner %d, mode %o, %d links: refused", dir, st.Uid, st.Mode&0o7777, st.Nlink)
	}
	data := "size=" + strconv.FormatInt(size, 10) + ",nr_inodes=" + strconv.FormatInt(diskInodes(size), 10) + ",mode=0711,uid=0,gid=0"
	// The descriptor's /proc name reaches the directory it holds without
	// resolving dir again.
	if err := unix.Mount("tmpfs", fmt.Sprintf("/proc/self/fd/%d", fd), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return refuse(ReasonLimitUnavailable, exitRefused, "cannot apply --disk here: mount a tmpfs (%s) on %s: %v", data, dir, err)
	}
	return nil
}

// UnmountDisk unmounts a session's disk from dir (all it holds goes) and
// removes dir; a dir with nothing mounted (after a reboot) is removed
// with what it holds.
func UnmountDisk(dir string) error {
	if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount the session's disk %s: %w", dir, err)
	}
	return os.RemoveAll(dir)
}

// ProbeDisk mounts and unmounts a disk of size on a new directory dir,
// as the launcher will for each session: an error says why sessions
// given --disk would be refused here.
func ProbeDisk(dir string, size int64) error {
	// What a probe that was cut short left.
	if err := UnmountDisk(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := MountDisk(dir, size); err != nil {
		os.Remove(dir)
		return err
	}
	return UnmountDisk(dir)
}

// checkDisk records whether --disk holds: the run directory must be on a
// tmpfs of at most its size (its home/ and tmp/ are made in it), and
// says whether the workspace shares it.
func (p *Plan) checkDisk() {
	want := p.Config.Limits.Disk
	if want <= 0 {
		return
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(p.run.Fd(), &fs); err != nil {
		p.Problems = append(p.Problems, fmt.Sprintf("%s: --disk: statfs %s: %v", ReasonLimitUnavailable, p.RunDir, err))
		return
	}
	// A tmpfs mounted with size=0 has no bound, and says 0 blocks.
	if have := int64(fs.Blocks) * fs.Bsize; fs.Type != unix.TMPFS_MAGIC || fs.Blocks == 0 || have > want {
		p.Problems = append(p.Problems, fmt.Sprintf("%s: --disk %d: the run directory %s is not on a tmpfs of at most that size (the session could write past it): make it on one (mount -t tmpfs -o size=%d,mode=0711 tmpfs DIR; sandbox serve mounts one per session)", ReasonLimitUnavailable, want, p.RunDir, want))
		return
	}
	var run, ws unix.Stat_t
	if unix.Fstat(p.run.Fd(), &run) == nil && unix.Fstat(p.ws.Fd(), &ws) == nil && run.Dev == ws.Dev {
		p.Notes = append(p.Notes, fmt.Sprintf("--disk %d: the run directory (HOME, /tmp) and the workspace share one tmpfs of that size, charged to the session's memory", want))
		return
	}
	p.Notes = append(p.Notes, fmt.Sprintf("--disk %d: the run directory (HOME, /tmp) is on a tmpfs of that size, charged to the session's memory; the workspace %s is the caller's own, outside it (this host's file systems have no quotas)", want, p.Workspace))
}
