package daemon

import (
	"github.com/bushost/bushost/internal/limits"
	"github.com/bushost/bushost/internal/sock"
)

// The transport's bounds are limits.Limits (every one a flag of bushostd
// serve, docs/limits.md); newServer builds the gRPC server options and
// the admission of each socket from it. What they let a peer make the
// daemon hold follows below.

// maxRecvMsg bounds one message, part of the budget in docs/limits.md
// with sock's windows and buffers: bundles come in chunks of at most 1
// MiB; nothing legitimate is bigger than that plus framing.
const maxRecvMsg = 1<<20 + 16<<10

// Memory budget (docs/limits.md). What a peer can make the daemon hold
// live is bounded by the limits: per connection a fixed cost (its buffers,
// one header list, its goroutines; a stream refused at its headers holds
// nothing), per call in flight at most one message buffered and decoded
// (or, for a listing, one page and the event being sent).
const (
	budgetBaseline = 32 << 20
	budgetPerConn  = 2*sock.IOBuffer + 32<<10 // + the header list, below
	budgetPerCall  = 2*maxRecvMsg + sock.StreamWindow
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
