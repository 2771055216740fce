package daemon

import "github.com/bushost/bushost/internal/limits"

// The transport's bounds are limits.Limits (every one a flag of bushostd
// serve, docs/limits.md); newServer builds the gRPC server options and
// the admission of each socket from it. What they let a peer make the
// daemon hold follows below.

// Fixed transport sizes, part of the budget in docs/limits.md.
const (
	// maxRecvMsg bounds one message: bundles come in chunks of at most
	// 1 MiB; nothing legitimate is bigger than that plus framing.
	maxRecvMsg = 1<<20 + 16<<10
	// streamWindow and connWindow are the HTTP/2 flow-control windows:
	// what a peer may send before the daemon reads it. Setting them turns
	// off grpc's window growth (BDP estimation), which would let a peer
	// grow them to megabytes per connection.
	streamWindow = 64 << 10
	connWindow   = 256 << 10
	// ioBuffer is each connection's read and write buffer.
	ioBuffer = 32 << 10
)

// Memory budget (docs/limits.md). What a peer can make the daemon hold
// live is bounded by the limits: per connection a fixed cost (its buffers,
// one header list, its goroutines; a stream refused at its headers holds
// nothing), per call in flight at most one message buffered and decoded
// (or, for a listing, one page and the event being sent).
const (
	budgetBaseline = 32 << 20
	budgetPerConn  = 2*ioBuffer + 32<<10 // + the header list, below
	budgetPerCall  = 2*maxRecvMsg + streamWindow
)

// connBudget is what one connection may hold.
func connBudget(l limits.Limits) int64 { return budgetPerConn + l.MaxHeaderBytes }

// uidBudget is what one peer uid may make the daemon hold, both sockets.
func uidBudget(l limits.Limits) int64 {
	return 2 * (int64(l.MaxConnsPerUID)*connBudget(l) + int64(l.MaxCallsPerUID)*budgetPerCall)
}

// budget is the bound on the daemon's live memory: the baseline plus, on
// each of the two sockets, every connection and every call in flight at
// their cost. Serve sets Go's soft memory limit a quarter above it.
func budget(l limits.Limits) int64 {
	return budgetBaseline + 2*(int64(l.MaxConns)*connBudget(l)+int64(l.MaxInFlight)*budgetPerCall)
}
