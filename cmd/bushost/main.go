// Command bushost is the client of the bus host; see internal/cli.
package main

import (
	"os"

	"github.com/bushost/bushost/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
