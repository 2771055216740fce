// Command hello is the example website of the seed's container: it answers
// "hello" on the address given as its argument. It is the service an agent
// edits in deploy/container/seed/src/website.
package main

import (
	"fmt"
	"net/http"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: hello ADDR")
		os.Exit(2)
	}
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	fmt.Fprintln(os.Stderr, http.ListenAndServe(os.Args[1], nil))
	os.Exit(1)
}
