package daemon

import (
	"github.com/spf13/pflag"

	"github.com/bushost/bushost/internal/size"
)

// AddFlags registers every flag of `bushostd serve` on fs, writing into o,
// with the documented defaults. Each limit is one flag here and one row in
// the docs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.MaxBundleBytes = DefaultMaxBundle
	fs.StringVar(&o.Home, "home", DefaultHome, "the bus host's home")
	fs.StringVar(&o.BrokerDSN, "broker-dsn", "", "broker store: empty for SQLite in HOME/broker.db, or postgres://...")
	fs.Var(size.Value{P: &o.MaxBundleBytes}, "max-bundle-bytes", "largest bundle a push may send (bytes, or 64M, 1G)")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", DefaultIdleTimeout, "cut a push stream that sends nothing this long")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", DefaultDrainTimeout, "on SIGTERM, how long calls in flight may take to finish")
	fs.IntVar(&o.MaxConns, "max-conns", DefaultMaxConns, "connections per socket")
	fs.IntVar(&o.MaxInFlight, "max-in-flight", DefaultMaxInFlight, "calls in flight per socket")
	fs.StringVar(&o.CheckpointFile, "checkpoint-file", "", "append each new head of the broker's log to this file (SEQ HASH lines, fsynced) and check the log against it at start; ship it off the machine (docs/broker.md)")
	fs.BoolVar(&o.SkipBeyondGit, "bench-skip-beyond-git", false, "benchmark only: skip the beyond-git walk of pushed trees")
	fs.MarkHidden("bench-skip-beyond-git")
	fs.StringVar(&o.SocketGroup, "socket-group", "", "group (name or gid) given the sockets; the home becomes 0710 so that members (sandboxed sessions) reach the sockets and nothing else")
}
