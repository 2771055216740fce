// Command bwrapfloor is the least a sandbox launcher written in Go can be:
// it starts and execs bwrap with the arguments it was given.
// BenchmarkSandboxVsBwrap times it beside the raw bwrap line to show what a
// Go start alone costs on the machine; it is built by the benchmark and by
// nothing else.
package main

import (
	"os"
	"syscall"
)

func main() {
	err := syscall.Exec("/usr/bin/bwrap", append([]string{"bwrap"}, os.Args[1:]...), os.Environ())
	os.Stderr.WriteString("bwrapfloor: exec /usr/bin/bwrap: " + err.Error() + "\n")
	os.Exit(127)
}
