package broker

import (
	"testing"
	"time"
)

// Every connection starts with the bounds of PostgresOptions (keepalives
// only over TCP); a parameter the DSN sets itself wins.
func TestPostgresConnectionBounds(t *testing.T) {
	o := PostgresOptions{LockTimeout: 7 * time.Second}
	o.fill()
	for _, c := range []struct {
		name, dsn string
		want      map[string]string
		absent    []string
	}{
		{"unix socket", "postgres://u@/db?host=/run/pg", map[string]string{
			"idle_in_transaction_session_timeout": "5000", "lock_timeout": "7000", "statement_timeout": "30000"},
			[]string{"tcp_keepalives_idle", "tcp_user_timeout"}},
		{"tcp", "postgres://u@db.example:5432/db", map[string]string{
			"idle_in_transaction_session_timeout": "5000", "tcp_keepalives_idle": "15", "tcp_keepalives_interval": "5",
			"tcp_keepalives_count": "3", "tcp_user_timeout": "30000"}, nil},
		{"the DSN wins", "postgres://u@db.example/db?lock_timeout=250", map[string]string{"lock_timeout": "250", "statement_timeout": "30000"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := postgresConfig(c.dsn, o)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.want {
				if got := cfg.RuntimeParams[k]; got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			for _, k := range c.absent {
				if v, ok := cfg.RuntimeParams[k]; ok {
					t.Errorf("%s = %q over a Unix socket", k, v)
				}
			}
			if cfg.ConnectTimeout != DefaultConnectTimeout || cfg.DialFunc == nil {
				t.Errorf("connect timeout %v, dialer %v", cfg.ConnectTimeout, cfg.DialFunc != nil)
			}
		})
	}
}
