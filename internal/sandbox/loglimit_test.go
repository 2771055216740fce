package sandbox

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestEgressLogBounded: a flood of egress lines writes egressLogBurst of
// them, then egressLogRate a second, and says how many it left out.
func TestEgressLogBounded(t *testing.T) {
	var out bytes.Buffer
	clock := time.Unix(0, 0)
	l := newLineLimiter(&out)
	l.now = func() time.Time { return clock }
	l.last = clock
	for i := 0; i < 3*egressLogBurst; i++ {
		l.Write([]byte("sandbox: network.egress denied connection\n"))
	}
	if n := strings.Count(out.String(), "\n"); n != egressLogBurst {
		t.Fatalf("%d lines written at once, want %d", n, egressLogBurst)
	}
	clock = clock.Add(time.Second)
	for i := 0; i < 3*egressLogBurst; i++ {
		l.Write([]byte("sandbox: network.egress denied connection\n"))
	}
	want := egressLogBurst + 1 + egressLogRate // the count line among them
	if n := strings.Count(out.String(), "\n"); n != want {
		t.Fatalf("%d lines after a second, want %d", n, want)
	}
	if !strings.Contains(out.String(), "2000 lines over 100 a second were not written") {
		t.Fatalf("no count of the lines left out:\n%s", out.String()[len(out.String())-300:])
	}
	// A connection's line passes whatever the bound, after the count.
	writeAlways(l, []byte("sandbox: network.egress allowed example.com:443\n"))
	if !strings.HasSuffix(out.String(), "2900 lines over 100 a second were not written\nsandbox: network.egress allowed example.com:443\n") {
		t.Fatalf("a connection's line was held back:\n%s", out.String()[len(out.String())-300:])
	}
	for i := 0; i < 10; i++ {
		l.Write([]byte("sandbox: network.egress denied connection\n"))
	}
	l.close()
	if !strings.HasSuffix(out.String(), "10 lines over 100 a second were not written\n") {
		t.Fatalf("no count at the end:\n%s", out.String()[len(out.String())-300:])
	}
}
