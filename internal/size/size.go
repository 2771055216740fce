// Package size parses and prints byte sizes for every size flag of the
// command-line tools: plain bytes, or a number with a suffix K, M, G or T
// (powers of 1024), as in 64M or 1G. One parser, so every flag reads the
// same.
package size

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Parse reads s as a size in bytes: "1048576", "64M", "1G", "512k".
// Negative sizes, fractions and values past int64 are refused.
func Parse(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("size %q: empty", s)
	}
	// A suffix K, M, G or T, in either case, is 1024 to the power of its place.
	mult := int64(1)
	if i := strings.IndexByte("kmgtKMGT", t[len(t)-1]); i >= 0 {
		mult = 1 << (10 * (i%4 + 1))
		t = t[:len(t)-1]
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want plain bytes or a number with K, M, G or T (e.g. 64M)", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q: too large", s)
	}
	return n * mult, nil
}

// Format prints n the shortest exact way Parse reads back: 64M, 1G, 1000.
func Format(n int64) string {
	for i := 4; i > 0; i-- { // T, G, M, K: 1024 to the power i
		if mult := int64(1) << (10 * i); n != 0 && n%mult == 0 {
			return strconv.FormatInt(n/mult, 10) + "KMGT"[i-1:i]
		}
	}
	return strconv.FormatInt(n, 10)
}

// Value is a size flag (it implements pflag.Value and flag.Value) that
// writes into the int64 it points to.
type Value struct{ P *int64 }

func (v Value) String() string {
	if v.P == nil {
		return "0"
	}
	return Format(*v.P)
}

func (v Value) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*v.P = n
	return nil
}

// Type names the value in cobra's help.
func (v Value) Type() string { return "size" }
