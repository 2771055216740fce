package limits

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// What an operator's typo or a hostile unit file can put in a count flag:
// a number that wraps in HTTP/2's 32-bit settings (2^32 became 0, which
// grpc takes for no bound on a connection's streams), the largest int,
// and a negative one. Each is refused naming its flag; the largest count
// allowed is accepted.
func TestCountFlagsAttack(t *testing.T) {
	for _, flag := range []string{"max-conns", "max-in-flight", "max-conns-per-uid", "max-calls-per-uid",
		"reserved-conns", "reserved-calls", "max-streams-per-conn", "max-calls-per-grant", "max-streams-per-grant"} {
		for _, v := range []string{strconv.FormatInt(math.MaxUint32+1, 10), strconv.FormatInt(math.MaxUint32, 10),
			strconv.Itoa(math.MaxInt), strconv.Itoa(MaxCount + 1), "-1"} {
			var l Limits
			fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
			l.AddFlags(fs)
			if err := fs.Parse([]string{"--" + flag, v}); err != nil {
				t.Fatal(err)
			}
			l.Fill()
			if err := l.Check(); err == nil || !strings.Contains(err.Error(), "--"+flag) {
				t.Errorf("--%s %s: %v", flag, v, err)
			}
		}
		var l Limits
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		l.AddFlags(fs)
		if err := fs.Parse([]string{"--" + flag, strconv.Itoa(MaxCount / 2)}); err != nil {
			t.Fatal(err)
		}
		if err := l.Check(); err != nil {
			t.Errorf("--%s %d: %v", flag, MaxCount/2, err)
		}
		if flag == "max-streams-per-conn" && uint32(l.MaxStreamsPerConn) == 0 {
			t.Error("the largest streams bound allowed wraps to 0")
		}
	}
}
