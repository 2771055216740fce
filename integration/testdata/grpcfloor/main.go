// Command grpcfloor is the least a gRPC client of git.sock can be: it links
// grpc-go and the GitService API as bushost does, starts, and exits.
// BenchmarkGitPush* time it beside the raw pipeline to show what a client's
// start and exit alone cost on the machine; it is built by the benchmark
// (with bushost's build tags) and by nothing else.
package main

import (
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	gitv1 "github.com/bushost/bushost/api/bushost/git/v1"
)

// Referenced, so that the linker keeps what bushost's client keeps.
var (
	_ = grpc.NewClient
	_ = insecure.NewCredentials
	_ = gitv1.NewGitServiceClient
)

func main() { os.Exit(0) }
