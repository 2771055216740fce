package daemon

import (
	"github.com/spf13/pflag"

	"github.com/bushost/bushost/broker"
	"github.com/bushost/bushost/gitd"
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
	fs.DurationVar(&o.DrainTimeout, "drain-timeout", DefaultDrainTimeout, "on SIGTERM, how long calls in flight may take to finish")
	o.Limits.addFlags(fs)
	o.addBoundFlags(fs)
	fs.StringVar(&o.HostID, "host-id", "", "this bus host's id, on which the projects it adds are placed when hosts share a broker (default: made at first start and kept in HOME/host-id)")
	fs.StringVar(&o.CheckpointFile, "checkpoint-file", "", "append each new head of the broker's log to this file (SEQ HASH lines, fsynced) and check the log against it at start; ship it off the machine (docs/broker.md)")
	fs.StringVar(&o.Committer, "committer", gitd.DefaultCommitter, "NAME <EMAIL> of the merge commits 'bushost task land --merge' makes")
	fs.StringVar(&o.Housekeeping, "housekeeping", "auto", "auto: after each push and landing, repack and tidy the repository in the background when cheap heuristics call for it; off: only 'bushost repo optimize' does (docs/git-service.md, \"Housekeeping\")")
	fs.BoolVar(&o.SkipBeyondGit, "bench-skip-beyond-git", false, "benchmark only: skip the beyond-git walk of pushed trees")
	fs.MarkHidden("bench-skip-beyond-git")
	fs.StringVar(&o.SocketGroup, "socket-group", "", "group (name or gid) given the sockets; the home becomes 0710 so that members (sandboxed sessions) reach the sockets and nothing else")
	o.Observe.addFlags(fs)
}

// addBoundFlags registers the object bounds and the quotas
// (docs/limits.md, "Objects and quotas").
func (o *Options) addBoundFlags(fs *pflag.FlagSet) {
	o.MaxObjectBytes, o.MaxCommitBytes, o.MaxTreeBytes = gitd.DefaultMaxObjectBytes, gitd.DefaultMaxCommitBytes, gitd.DefaultMaxTreeBytes
	o.MaxTaskBytes, o.MaxProjectBytes = gitd.DefaultMaxTaskBytes, gitd.DefaultMaxProjectBytes
	o.MaxPushInflated = gitd.DefaultMaxPushInflated
	o.EventBytesRate = broker.DefaultEventBytesRate
	o.EgressBytesRate = broker.DefaultEgressBytesRate
	fs.Var(size.Value{P: &o.MaxObjectBytes}, "max-object-bytes", "largest blob a push may carry, inflated")
	fs.Var(size.Value{P: &o.MaxCommitBytes}, "max-commit-bytes", "largest commit or tag a push may carry, inflated")
	fs.Var(size.Value{P: &o.MaxTreeBytes}, "max-tree-bytes", "largest tree a push may carry, inflated")
	fs.Int64Var(&o.MaxPackObjects, "max-pack-objects", gitd.DefaultMaxPackObjects, "most objects one pushed pack may hold")
	fs.Var(size.Value{P: &o.MaxPushInflated}, "max-push-inflated", "most bytes a push's objects may inflate to together, each delta counted by its result")
	fs.Int64Var(&o.MaxTreePaths, "max-tree-paths", gitd.DefaultMaxTreePaths, "most paths (files, links, submodules) the tree of a pushed, landed or published commit may expand to")
	fs.Int64Var(&o.MaxTreeDepth, "max-tree-depth", gitd.DefaultMaxTreeDepth, "deepest the tree of a pushed, landed or published commit may nest (a file at the top is depth 1)")
	fs.Var(size.Value{P: &o.MaxTaskBytes}, "max-task-bytes", "total size of a task's accepted packs")
	fs.Var(size.Value{P: &o.MaxProjectBytes}, "max-project-bytes", "size of a project's repository that pushes may reach")
	fs.IntVar(&o.EventRate, "event-rate", broker.DefaultEventRate, "events one grant may record per minute")
	fs.Var(size.Value{P: &o.EventBytesRate}, "event-bytes-rate", "bytes (type and data) one grant may record per minute")
	fs.IntVar(&o.EgressRate, "egress-event-rate", broker.DefaultEgressRate, "network.egress events one launcher grant may record per minute, apart from --event-rate")
	fs.Var(size.Value{P: &o.EgressBytesRate}, "egress-event-bytes-rate", "bytes of network.egress events one launcher grant may record per minute, apart from --event-bytes-rate")
	fs.BoolVar(&o.NoObjectChecks, "bench-no-object-checks", false, "benchmark only: skip the streaming object size checks")
	fs.MarkHidden("bench-no-object-checks")
	fs.BoolVar(&o.NoFDPassing, "test-no-fd-passing", false, "testing only: serve git.sock as a server without descriptor passing")
	fs.MarkHidden("test-no-fd-passing")
}
