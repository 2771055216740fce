package daemon

import (
	"github.com/spf13/pflag"

	"github.com/bushost/bushost/broker"
	"github.com/bushost/bushost/gitd"
	"github.com/bushost/bushost/internal/home"
)

// AddFlags registers every flag of `bushostd serve` on fs, writing into o,
// with the documented defaults. Each limit is one flag (limits.AddFlags)
// and one row in the docs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Home, "home", home.Default, "the bus host's home")
	fs.StringVar(&o.BrokerDSN, "broker-dsn", "", "broker store: empty for SQLite in HOME/broker.db, or postgres://...")
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", DefaultDrainTimeout, "on SIGTERM, how long calls in flight may take to finish")
	o.addPostgresFlags(fs)
	o.Limits.AddFlags(fs)
	fs.StringVar(&o.HostID, "host-id", "", "this bus host's id, on which the projects it adds are placed when hosts share a broker (default: made at first start and kept in HOME/host-id)")
	fs.StringVar(&o.CheckpointFile, "checkpoint-file", "", "append each head of the broker's log that this host wrote or proved to this file (SEQ HASH lines, fsynced) and check the log against it at start, refusing events past its last head that no trusted host signed; ship it off the machine (docs/broker.md, \"Anchoring the log\")")
	fs.StringVar(&o.LogKey, "log-key", "", "the Ed25519 key (PEM) this host signs the broker's events with, never stored in the database; made 0600 if missing (default HOME/log.key); its public key is written to HOME/log.pub (docs/broker.md, \"Who wrote an event\")")
	fs.StringVar(&o.LogTrustedKeys, "log-trusted-keys", "", "PEM public keys of the hosts sharing the broker's store (their HOME/log.pub, concatenated; one file for all hosts may list this one's too): an event signed by any of them or by this host is accepted, any other is not (default: this host's own key only)")
	fs.StringVar(&o.Committer, "committer", gitd.DefaultCommitter, "NAME <EMAIL> of the merge commits 'bushost task land --merge' makes")
	fs.DurationVar(&o.MergeTimeout, "merge-timeout", gitd.DefaultMergeTimeout, "longest merge of 'bushost task land --merge'; past it the landing is refused MERGE_TIMEOUT and recorded")
	fs.IntVar(&o.MergeRenameLimit, "merge-rename-limit", gitd.DefaultMergeRenameLimit, "merge.renameLimit of 'task land --merge': past this many files, git detects exact renames only")
	fs.StringVar(&o.Housekeeping, "housekeeping", "auto", "auto: after each push and landing, repack and tidy the repository in the background when cheap heuristics call for it; off: only 'bushost repo optimize' does (docs/git-service.md, \"Housekeeping\")")
	fs.StringVar(&o.SocketGroup, "socket-group", "", "group (name or gid) given the sockets; the home becomes 0710 so that members (sandboxed sessions) reach the sockets and nothing else")
	o.Observe.addFlags(fs)
}

// addPostgresFlags registers the bounds of the connections to a
// PostgreSQL broker (docs/scaling.md, "What a host may hold").
func (o *Options) addPostgresFlags(fs *pflag.FlagSet) {
	p := &o.BrokerPostgres
	fs.DurationVar(&p.IdleInTransaction, "broker-idle-in-transaction-timeout", broker.DefaultIdleInTransaction, "PostgreSQL: the server ends a session of this host idle inside a transaction this long, freeing its locks (a frozen host holds the fleet's write lock at most this long)")
	fs.DurationVar(&p.LockTimeout, "broker-lock-timeout", broker.DefaultLockTimeout, "PostgreSQL: longest wait for a lock, the log's write lock first (keep it above --broker-idle-in-transaction-timeout); past it the call is Unavailable, retryable")
	fs.DurationVar(&p.StatementTimeout, "broker-statement-timeout", broker.DefaultStatementTimeout, "PostgreSQL: longest statement of a write or a read")
	fs.DurationVar(&p.VerifyTimeout, "broker-verify-timeout", broker.DefaultVerifyTimeout, "PostgreSQL: longest statement of 'log verify', which reads the whole log")
	fs.DurationVar(&p.Keepalive, "broker-keepalive", broker.DefaultKeepalive, "PostgreSQL over TCP: keepalive probes after this much silence, both ways, every third of it, three of them; unacknowledged sends end the connection after twice it")
	fs.DurationVar(&p.ConnectTimeout, "broker-connect-timeout", broker.DefaultConnectTimeout, "PostgreSQL: longest wait to connect (the DSN's connect_timeout wins)")
}
