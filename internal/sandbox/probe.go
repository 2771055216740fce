package sandbox

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// Probe runs bwrap as run would (same user, namespaces, hardening and
// seccomp filter, the system binds) with /usr/bin/true as the command. A nil
// error means sessions can start; otherwise an *UnavailableError says why.
func Probe(userName, bwrapPath string) (string, error) {
	if userName == "" && os.Geteuid() == 0 {
		// A session's own uid is only picked at launch; nobody stands
		// for it, an unprivileged user as good as any.
		userName = DefaultUser
	}
	u, err := sessionUser(userName)
	if err != nil {
		return "", err
	}
	bw, err := findBwrap(bwrapPath)
	if err != nil {
		return "", err
	}
	filter, err := Filter()
	if err != nil {
		return "", &UnavailableError{Reason: err.Error()}
	}
	seccompR, err := filterPipe(filter)
	if err != nil {
		return "", err
	}
	defer seccompR.Close()
	binds, err := systemBinds()
	if err != nil {
		return "", &UnavailableError{Reason: err.Error()}
	}
	args := append(confineArgs(NetNone), bindArgs(binds, "", nil)...)
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/", "--", "/usr/bin/true")
	cmd := exec.Command(bw, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Dir = "/"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.ExtraFiles = []*os.File{seccompR}
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if u.Drop {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
	}
	if err := cmd.Run(); err != nil {
		msg := cmp.Or(strings.TrimSpace(stderr.String()), err.Error())
		return "", &UnavailableError{Reason: fmt.Sprintf("%s as %s: %s", bw, u.Name, msg)}
	}
	return fmt.Sprintf("ok: %s confines sessions as %s (uid %d)", bw, u.Name, u.UID), nil
}

// filterPipe returns the read end of a pipe that holds the whole filter and
// is closed for writing, as bwrap's --seccomp reads to end of file.
func filterPipe(filter []byte) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, werr := w.Write(filter)
	cerr := w.Close()
	if werr != nil || cerr != nil {
		r.Close()
		return nil, fmt.Errorf("write the seccomp filter: %v %v", werr, cerr)
	}
	return r, nil
}
