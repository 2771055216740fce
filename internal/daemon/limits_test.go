package daemon

import (
	"testing"

	"github.com/spf13/pflag"
)

// The defaults are what AddFlags registers, and the budget they give stays
// under the 512 MiB docs/limits.md promises, a quarter of slack included.
func TestLimitsDefaultsAndBudget(t *testing.T) {
	var o Options
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o.Limits != DefaultLimits() {
		t.Fatalf("flags give %+v, defaults are %+v", o.Limits, DefaultLimits())
	}
	// fill leaves the reserves alone: zero is a valid "none".
	filled := Limits{ReservedConns: DefaultReservedConns, ReservedCalls: DefaultReservedCalls}
	filled.fill()
	if filled != DefaultLimits() {
		t.Fatalf("fill gives %+v", filled)
	}
	if err := filled.check(); err != nil {
		t.Fatal(err)
	}
	b := filled.Budget()
	if b+b/4 > 512<<20 {
		t.Fatalf("default budget %d MiB (+25%%) is over 512 MiB", b>>20)
	}
	t.Logf("budget %d MiB, per uid %d MiB, per connection %d KiB", b>>20, filled.UIDBudget()>>20, filled.ConnBudget()>>10)
	if err := fs.Parse([]string{"--max-streams-per-conn", "0"}); err != nil {
		t.Fatal(err)
	}
	if err := o.Limits.check(); err == nil {
		t.Fatal("a zero limit was accepted")
	}
}
