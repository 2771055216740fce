package integration

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	brokerv1 "github.com/bushost/bushost/api/bushost/broker/v1"
)

// BenchmarkBrokerRecordEvent: RecordEvent over broker.sock from 8
// concurrent clients, each call durable when it returns (SQLite WAL,
// synchronous=FULL), beside raw SQLite inserts with the same durability
// (one fsync'd transaction per insert, 8 goroutines) in the same run.
func BenchmarkBrokerRecordEvent(b *testing.B) {
	const clients, perClient = 8, 250
	const total = clients * perClient

	h := startHost(b)
	h.AddProject(b, "acme", "web")
	tokFile := h.Grant(b, "acme", "web", "bench", "agent", "event.record")
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		b.Fatal(err)
	}
	sockPath, err := filepath.Abs(filepath.Join(h.Home, "broker.sock"))
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]brokerv1.BrokerServiceClient, clients)
	for i := range conns {
		cc, err := grpc.NewClient("unix://"+sockPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		conns[i] = brokerv1.NewBrokerServiceClient(cc)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+strings.TrimSpace(string(tok)))

	// Raw SQLite with the same durability, on the same disk.
	raw, err := sql.Open("sqlite", "file:"+filepath.Join(baseDir(b), "raw.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)")
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`CREATE TABLE events (seq INTEGER PRIMARY KEY, task TEXT NOT NULL, type TEXT NOT NULL, data TEXT NOT NULL, time TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}

	run := func(do func(client, i int) error) time.Duration {
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		start := time.Now()
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perClient; i++ {
					if err := do(c, i); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		d := time.Since(start)
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return d
	}

	var brokerD, rawD time.Duration
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		brokerD += run(func(c, i int) error {
			_, err := conns[c].RecordEvent(ctx, &brokerv1.RecordEventRequest{Type: "bench.tick", Data: fmt.Sprintf(`{"client":%d,"i":%d}`, c, i)})
			return err
		})
		rawD += run(func(c, i int) error {
			_, err := raw.Exec(`INSERT INTO events (task, type, data, time) VALUES ($1, $2, $3, $4)`, "bench", "bench.tick",
				fmt.Sprintf(`{"client":%d,"i":%d}`, c, i), time.Now().UTC().Format(time.RFC3339Nano))
			return err
		})
	}
	b.StopTimer()
	brokerRate := float64(total*b.N) / brokerD.Seconds()
	rawRate := float64(total*b.N) / rawD.Seconds()
	b.ReportMetric(brokerRate, "events/s")
	b.ReportMetric(rawRate, "raw-sqlite-inserts/s")
	fmt.Printf("RecordEvent over broker.sock, durable, %d clients: %.0f events/s; raw SQLite inserts (WAL, synchronous=FULL, one transaction each): %.0f/s; ratio %.2f\n",
		clients, brokerRate, rawRate, brokerRate/rawRate)
	if out := h.Must(b, "log", "verify"); !strings.HasPrefix(out, "ok:") {
		b.Fatalf("log verify after the benchmark: %s", out)
	}
}
