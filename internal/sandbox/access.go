package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Access bits as in access(2).
const (
	accR = 4
	accW = 2
	accX = 1
)

// checkAccess tells, from mode bits, whether u may reach path (search
// permission on every parent, as bwrap resolves each bind source by path
// after dropping to u) and then use it with want (accR|accW|accX). bwrap
// would fail or the session would find its workspace read-only; saying so
// before the launch names the directory to fix. ACLs are not read: a
// deployment that needs them should grant plain mode bits instead.
func checkAccess(u User, path string, want uint32) error {
	if !u.Drop && os.Geteuid() != 0 && u.UID == uint32(os.Geteuid()) {
		// The caller is the session user: the kernel will answer for it
		// with access(2), which honours ACLs too.
		if err := syscall.Access(path, want); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	}
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if err := permits(u, dir, accX); err != nil {
			return err
		}
		if dir == "/" {
			break
		}
	}
	if want == 0 {
		return nil
	}
	return permits(u, path, want)
}

func permits(u User, path string, want uint32) error {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var bits uint32
	switch {
	case st.Uid == u.UID:
		bits = st.Mode >> 6 & 7
	case u.inGroup(st.Gid):
		bits = st.Mode >> 3 & 7
	default:
		bits = st.Mode & 7
	}
	if bits&want != want {
		return fmt.Errorf("%s (uid %d gid %d mode %04o) does not give %s %s", path, st.Uid, st.Gid, st.Mode&0o7777, u.Name, accName(want))
	}
	return nil
}

func accName(want uint32) string {
	s := ""
	for i, c := range "rwx" {
		if want&(accR>>i) != 0 {
			s += string(c)
		}
	}
	return s
}
