package sandbox

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// keepTerminal saves the state of each terminal among files (the caller's
// stdin, stdout and stderr, handed to the session: any of them reaches
// the terminal's settings) and returns what puts it back: a session may
// switch echo or canonical mode off (`stty -echo -icanon`, through any
// descriptor of the terminal) or make it exclusive (TIOCEXCL: no one but
// root could open it again), and the terminal is the caller's again once
// the session has ended. Files that are not terminals are left alone.
func keepTerminal(files ...*os.File) func() {
	type saved struct {
		fd   int
		tio  *unix.Termios
		excl int
	}
	var terms []saved
	seen := map[uint64]bool{}
	for _, f := range files {
		if f == nil {
			continue
		}
		fd := int(f.Fd())
		tio, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || seen[st.Rdev] {
			continue
		}
		seen[st.Rdev] = true
		excl, err := unix.IoctlGetInt(fd, unix.TIOCGEXCL)
		if err != nil {
			excl = -1 // a kernel before 3.8: not told, not put back
		}
		terms = append(terms, saved{fd, tio, excl})
	}
	return func() {
		if len(terms) == 0 {
			return
		}
		// From a background process group of that terminal, the kernel
		// would stop run with SIGTTOU instead: ignored for the calls.
		signal.Ignore(syscall.SIGTTOU)
		defer signal.Reset(syscall.SIGTTOU)
		for _, t := range terms {
			_ = unix.IoctlSetTermios(t.fd, unix.TCSETS, t.tio)
			if t.excl == 0 {
				_ = unix.IoctlSetInt(t.fd, unix.TIOCNXCL, 0)
			}
		}
	}
}
