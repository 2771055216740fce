package size

import "testing"

func TestParse(t *testing.T) {
	good := map[string]int64{"0": 0, "1000": 1000, "64M": 64 << 20, "1G": 1 << 30, "16k": 16 << 10, "2T": 2 << 40}
	for s, want := range good {
		if got, err := Parse(s); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", s, got, err, want)
		}
		if got, _ := Parse(Format(want)); got != want {
			t.Errorf("Format(%d) = %q does not read back", want, Format(want))
		}
	}
	for _, s := range []string{"", "-1", "1.5G", "M", "10X", "9999999999999T", "1 G", "100Mi"} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
	var n int64
	v := Value{&n}
	if err := v.Set("64M"); err != nil || n != 64<<20 || v.String() != "64M" || v.Type() != "size" {
		t.Fatalf("Value: %d %v %q", n, err, v.String())
	}
}
