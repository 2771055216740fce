package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bushost/bushost/internal/testenv"
)

// fakeClient writes a client for the auditor that appends each batch to
// a file and answers as ok says (a file that exists: the broker takes
// it; else it refuses), and returns the file the batches go to.
func fakeClient(t *testing.T) (client, batches, ok string) {
	dir := t.TempDir()
	client, batches, ok = filepath.Join(dir, "bushost"), filepath.Join(dir, "batches"), filepath.Join(dir, "ok")
	script := "#!/bin/sh\n[ -e " + ok + " ] || { echo 'UNREACHABLE: no broker' >&2; exit 3; }\ncat >> " + batches + "\n"
	if err := os.WriteFile(client, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return client, batches, ok
}

func readBatches(t *testing.T, path string) []decision {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []decision
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var d decision
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil {
			t.Fatalf("%v: %s", err, sc.Text())
		}
		out = append(out, d)
	}
	return out
}

// TestAuditFlood: a flood of denials from four goroutines, with allowed
// connections among it: every allowed connection and close is an event,
// the denials are recorded one by one up to the bound of an interval and
// counted, by destination, in summaries after that, and nothing is lost.
func TestAuditFlood(t *testing.T) {
	client, batches, ok := fakeClient(t)
	os.WriteFile(ok, nil, 0o644)
	var log lockedWriter
	var sb strings.Builder
	log.w = &sb
	a := startAuditor(client, "/nonexistent/broker.sock", "/nonexistent/token", newLineLimiter(&log))
	const floods, each, allowed = 4, 2000, 5
	var wg sync.WaitGroup
	for g := 0; g < floods; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				a.deny(decision{Conn: int64(g*each + i), Host: fmt.Sprintf("flood%d.test", g), Port: 443, Decision: "denied"})
			}
		}()
	}
	for i := 0; i < allowed; i++ {
		if err := a.allow(context.Background(), decision{Conn: int64(100000 + i), Host: "ok.test", Port: 443, Decision: "allowed"}); err != nil {
			t.Fatalf("allowed connection %d not recorded: %v", i, err)
		}
		a.note(decision{Conn: int64(100000 + i), Host: "ok.test", Port: 443, Decision: "closed"})
	}
	wg.Wait()
	a.stop()
	var nAllowed, nClosed, nDenied, summarised int64
	for _, d := range readBatches(t, batches) {
		switch d.Decision {
		case "allowed":
			nAllowed++
		case "closed":
			nClosed++
		case "denied":
			nDenied++
		case "denied_summary":
			summarised += d.Denied
			if len(d.Top) == 0 || len(d.Top) > auditTop || d.Top[0].Count < d.Top[len(d.Top)-1].Count || !strings.HasPrefix(d.Top[0].Dest, "flood") {
				t.Errorf("summary's top destinations: %+v", d.Top)
			}
		default:
			t.Errorf("unexpected event %+v", d)
		}
	}
	if nAllowed != allowed || nClosed != allowed {
		t.Errorf("%d allowed and %d closed events, want %d each", nAllowed, nClosed, allowed)
	}
	if nDenied+summarised != floods*each || summarised == 0 {
		t.Errorf("%d denials one by one and %d in summaries, want %d in all, most summarised", nDenied, summarised, floods*each)
	}
	t.Logf("%d denials: %d one by one, %d in summaries", floods*each, nDenied, summarised)
}

// TestAuditFailClosed: with the broker unreachable an allowed connection
// is refused (it could not be recorded); a close waits, and is written
// once the broker takes events again, or, at the end, on stderr however
// many lines the denials took.
func TestAuditFailClosed(t *testing.T) {
	client, batches, ok := fakeClient(t)
	var sb strings.Builder
	log := &lockedWriter{w: &sb}
	lim := newLineLimiter(log)
	a := startAuditor(client, "/nonexistent/broker.sock", "/nonexistent/token", lim)
	if err := a.allow(context.Background(), decision{Conn: 1, Host: "ok.test", Port: 443, Decision: "allowed"}); err == nil || !strings.Contains(err.Error(), "UNREACHABLE") {
		t.Fatalf("allowed with the broker unreachable: %v, want a refusal", err)
	}
	// The denials' lines are bounded; the close's is not.
	for i := 0; i < 3*egressLogBurst; i++ {
		lim.Write([]byte("sandbox: network.egress denied connection\n"))
	}
	a.note(decision{Conn: 2, Host: "ok.test", Port: 443, Decision: "closed"})
	a.stop()
	if !strings.Contains(sb.String(), `network.egress unrecorded {"conn":2,"host":"ok.test","port":443,"decision":"closed"`) {
		t.Errorf("the close the broker never took is not on stderr:\n%s", sb.String()[max(0, len(sb.String())-600):])
	}
	if _, err := os.Stat(batches); err == nil {
		t.Errorf("a batch was recorded with the broker unreachable")
	}

	// Back again: the close waiting is recorded with the next batch.
	os.WriteFile(ok, nil, 0o644)
	log.mu.Lock()
	sb.Reset()
	log.mu.Unlock()
	a = startAuditor(client, "/nonexistent/broker.sock", "/nonexistent/token", newLineLimiter(log))
	os.Remove(ok)
	a.note(decision{Conn: 3, Host: "ok.test", Port: 443, Decision: "closed"})
	testenv.WaitFor(t, 10*time.Second, "the interval's batch refused", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return strings.Contains(sb.String(), "record 1 events in the broker")
	})
	os.WriteFile(ok, nil, 0o644)
	if err := a.allow(context.Background(), decision{Conn: 4, Host: "ok.test", Port: 443, Decision: "allowed"}); err != nil {
		t.Fatal(err)
	}
	a.stop()
	var conns []int64
	for _, d := range readBatches(t, batches) {
		conns = append(conns, d.Conn)
	}
	if fmt.Sprint(conns) != "[3 4]" {
		t.Errorf("recorded %v, want the waiting close 3, then the allowed 4", conns)
	}
}
