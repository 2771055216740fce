// Command sandbox-init is a session's pid 1, started by bwrap only, as
// sandbox run asks it to:
//
//	sandbox-init init [OPTIONS] EXE ARGV...
//
// It is internal/sandbox/pid1 and nothing else, so that its start, which
// every session's start waits for, faults in few pages and initialises few
// packages (cmd/sandbox links the whole launcher). sandbox run binds it from
// beside its own executable; without it, the sandbox binary is pid 1.
package main

import (
	"os"

	"github.com/bushost/bushost/internal/sandbox/pid1"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != pid1.Verb {
		os.Stderr.WriteString("sandbox-init: a session's pid 1, started by sandbox run through bwrap only (sandbox-init " + pid1.Verb + " [OPTIONS] EXE ARGV...)\n")
		os.Exit(pid1.ExitSandbox)
	}
	os.Exit(pid1.Main(os.Args[2:], os.Stderr))
}
