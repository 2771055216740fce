package cmdline

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestLogger(t *testing.T) {
	var b bytes.Buffer
	l, err := Logger(&b, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", "v")
	var rec map[string]any
	if err := json.Unmarshal(b.Bytes(), &rec); err != nil || rec["msg"] != "shown" || rec["k"] != "v" || rec["level"] != "WARN" {
		t.Fatalf("json at warn wrote %q (%v)", b.String(), err)
	}
	b.Reset()
	l, err = Logger(&b, "", "")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("plain", "k", "v")
	if !strings.Contains(b.String(), "level=INFO msg=plain k=v") {
		t.Fatalf("text default wrote %q", b.String())
	}
	for _, bad := range [][2]string{{"yaml", "info"}, {"text", "loud"}} {
		if _, err := Logger(&b, bad[0], bad[1]); err == nil {
			t.Errorf("format %q level %q accepted", bad[0], bad[1])
		}
	}
}
