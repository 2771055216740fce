package broker

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/bushost/bushost/internal/errdefs"
)

// typeOK is the event type rule written out by hand, byte by byte, to check
// the regular expression and the reserved list against.
func typeOK(s string) bool {
	if s == "" || len(s) > maxTypeLen {
		return false
	}
	for _, w := range strings.Split(s, ".") {
		if w == "" || w[0] < 'a' || w[0] > 'z' {
			return false
		}
		for i := 0; i < len(w); i++ {
			c := w[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return false
			}
		}
	}
	first, _, _ := strings.Cut(s, ".")
	switch first {
	case "action", "review", "task", "grant":
		return false
	}
	return true
}

func FuzzCheckRecordType(f *testing.F) {
	for _, s := range []string{"note", "agent.step_done", "review.verdict", "Action.allowed", "a..b", "a.1b", "revіew.x", "task", "tasks.x", "x.", "_x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := CheckRecordType(s)
		if (err == nil) != typeOK(s) {
			t.Fatalf("CheckRecordType(%q) = %v, hand-written rule says %v", s, err, typeOK(s))
		}
		if r := errdefs.ReasonOf(err); err != nil && r != errdefs.EventTypeInvalid && r != errdefs.EventTypeReserved {
			t.Fatalf("CheckRecordType(%q): refusal of unknown kind: %v", s, err)
		}
	})
}

// decodeCanonical is Canonical's inverse, written only to prove that the
// encoding loses nothing: if every encoding decodes back to its event, no
// two events share an encoding.
func decodeCanonical(b []byte) (Event, bool) {
	var fields []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, ':')
		if i < 1 {
			return Event{}, false
		}
		n, err := strconv.Atoi(string(b[:i]))
		if err != nil || n < 0 || i+1+n >= len(b) || b[i+1+n] != ',' {
			return Event{}, false
		}
		fields = append(fields, string(b[i+1:i+1+n]))
		b = b[i+2+n:]
	}
	if len(fields) != 11 || fields[0] != canonicalVersion {
		return Event{}, false
	}
	seq, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return Event{}, false
	}
	return Event{Seq: seq, Business: fields[2], Project: fields[3], Task: fields[4], Type: fields[5], Actor: fields[6],
		Data: fields[7], Time: fields[8], Peer: fields[9], PrevHash: fields[10]}, true
}

func FuzzCanonical(f *testing.F) {
	f.Add(int64(1), "acme", "web", "t1", "task.added", "host", "{}", "2026-01-01T00:00:00Z", "", "")
	f.Add(int64(2), "a", "b:", ",c", "x", "g-1", `{"a":"1:,"}`, "t", "pid=1,uid=0,gid=0", "ab")
	f.Add(int64(-5), "", "", "", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, seq int64, b, p, tk, typ, actor, data, tm, peer, prev string) {
		e := Event{Seq: seq, Business: b, Project: p, Task: tk, Type: typ, Actor: actor, Data: data, Time: tm, Peer: peer, PrevHash: prev}
		enc := Canonical(e)
		got, ok := decodeCanonical(enc)
		if !ok || got != e {
			t.Fatalf("Canonical(%+v) = %q decodes to %+v (ok %v)", e, enc, got, ok)
		}
		// The hash covers every field: changing any one changes it.
		h := HashEvent(e)
		e2 := e
		e2.Seq++
		if HashEvent(e2) == h {
			t.Fatal("hash does not cover seq")
		}
		e2 = e
		e2.Data += " "
		if HashEvent(e2) == h {
			t.Fatal("hash does not cover data")
		}
		e2 = e
		e2.PrevHash += "0"
		if HashEvent(e2) == h {
			t.Fatal("hash does not cover prev_hash")
		}
		e2 = e
		e2.Hash = "anything"
		if HashEvent(e2) != h {
			t.Fatal("hash depends on the hash field itself")
		}
	})
}

func FuzzCanonicalData(f *testing.F) {
	for _, s := range []string{"", "{}", `{"b":1,"a":2}`, `{"a":{"c":[1,2.50,"x"]}}`, "[]", `"x"`, "{} {}", `{"a":"\u00e9<>&"}`, `{"a":1,"a":2}`, " {\n} "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := canonicalData(s)
		if err != nil {
			if r := errdefs.ReasonOf(err); r != errdefs.EventDataInvalid && r != errdefs.EventDataTooLarge {
				t.Fatalf("canonicalData(%q): refusal of unknown kind: %v", s, err)
			}
			return
		}
		var obj map[string]any
		if json.Unmarshal([]byte(c), &obj) != nil || obj == nil {
			t.Fatalf("canonicalData(%q) = %q, not a JSON object", s, c)
		}
		if len(c) > MaxDataBytes {
			t.Fatalf("canonicalData(%q) is %d bytes", s, len(c))
		}
		again, err := canonicalData(c)
		if err != nil || again != c {
			t.Fatalf("canonical form is not stable: %q -> %q (%v)", c, again, err)
		}
	})
}
