package broker

import "context"

// Ping checks that the store answers a query: bushostd's health check
// turns NOT_SERVING while it does not.
func (b *Broker) Ping(ctx context.Context) error {
	var n int
	return b.st.read().db.QueryRowContext(ctx, "SELECT 1").Scan(&n)
}
