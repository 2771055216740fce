// Command gitrss stands in for git on bushostd's PATH in the bounds tests:
// it runs the real git (the first "git" on PATH that is not itself) with
// the same arguments, standard streams and environment, and when git exits
// appends "<peak RSS in KiB> <subcommand>" to gitrss.log beside itself.
// The peak is wait4's ru_maxrss: every byte git ever had resident, however
// short-lived the process, which no polling of /proc could promise. It is
// built by the tests and by nothing else.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

func main() {
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	dir := filepath.Dir(self)
	real := ""
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if d == "" || filepath.Clean(d) == dir {
			continue
		}
		if fi, err := os.Stat(filepath.Join(d, "git")); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			real = filepath.Join(d, "git")
			break
		}
	}
	if real == "" {
		fail(errors.New("no git on PATH"))
	}
	cmd := exec.Command(real, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
	case err != nil:
		fail(err)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		sub := "?"
		for _, a := range os.Args[1:] {
			if !strings.HasPrefix(a, "-") && !strings.Contains(a, "=") {
				sub = a
				break
			}
		}
		if f, err := os.OpenFile(filepath.Join(dir, "gitrss.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			fmt.Fprintf(f, "%d %s\n", ru.Maxrss, sub)
			f.Close()
		}
	}
	os.Exit(code)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gitrss:", err)
	os.Exit(127)
}
