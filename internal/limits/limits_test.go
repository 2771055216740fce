package limits

import (
	"testing"

	"github.com/spf13/pflag"
)

// The defaults are what AddFlags registers and what Fill gives a zero
// Limits; a flag set to zero or below is refused, not taken for the
// default.
func TestDefaultsFlagsAndFill(t *testing.T) {
	var l Limits
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	l.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if l != Default() {
		t.Fatalf("flags give %+v,\ndefaults are %+v", l, Default())
	}
	// Fill leaves the reserves alone: zero is a valid "none".
	filled := Limits{Transport: Transport{ReservedConns: Default().ReservedConns, ReservedCalls: Default().ReservedCalls}}
	filled.Fill()
	if filled != Default() {
		t.Fatalf("Fill gives %+v", filled)
	}
	if err := filled.Check(); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse([]string{"--max-streams-per-conn", "0"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(); err == nil {
		t.Fatal("a zero limit was accepted")
	}
	negative := Limits{Transport: Transport{MaxConns: -1}}
	negative.Fill()
	if err := negative.Check(); err == nil || negative.MaxConns != -1 {
		t.Fatalf("a negative limit was filled or accepted: %d, %v", negative.MaxConns, err)
	}
}
