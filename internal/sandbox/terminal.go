package sandbox

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// keepTerminal saves the termios of f when it is a terminal (the caller's,
// handed to the session as its stdin) and returns what puts it back: a
// session may switch echo or canonical mode off (`stty -echo -icanon`),
// and the terminal is the caller's again once the session has ended.
// Without a terminal it does nothing.
func keepTerminal(f *os.File) func() {
	if f == nil {
		return func() {}
	}
	fd := int(f.Fd())
	saved, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return func() {}
	}
	return func() {
		// From a background process group of that terminal, the kernel
		// would stop run with SIGTTOU instead: ignored for the call.
		signal.Ignore(syscall.SIGTTOU)
		defer signal.Reset(syscall.SIGTTOU)
		_ = unix.IoctlSetTermios(fd, unix.TCSETS, saved)
	}
}
