package daemon

import (
	"testing"

	"github.com/bushost/bushost/internal/limits"
)

// The budget the default limits give stays under the 512 MiB
// docs/limits.md promises, a quarter of slack included.
func TestLimitsBudget(t *testing.T) {
	l := limits.Default()
	b := budget(l)
	if b+b/4 > 512<<20 {
		t.Fatalf("default budget %d MiB (+25%%) is over 512 MiB", b>>20)
	}
	t.Logf("budget %d MiB, per uid %d MiB, per connection %d KiB", b>>20, uidBudget(l)>>20, connBudget(l)>>10)
}
