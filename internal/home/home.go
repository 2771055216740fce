// Package home names every path in a bus host's home: the sockets
// bushostd and sandbox serve listen on, the host's admin token, the
// broker's store, the repositories and the state the daemon and the
// launcher keep there. The layout is part of the contract (backups,
// operators and scripts rely on it; docs/architecture.md): a program
// builds a path in a home here, never by joining a name of its own. It
// links nothing but the standard library, so every binary may use it.
package home

import "path/filepath"

// Default is the home bushostd serve and bushost use when neither --home
// nor $BUSHOST_HOME names one.
const Default = "./bus-host"

// LauncherDefault is the home sandbox serve uses when neither --home nor
// $BUSHOST_HOME names one: it runs as root, as a system service.
const LauncherDefault = "/var/lib/bushost"

// Env is the environment variable that stands for --home.
const Env = "BUSHOST_HOME"

// The sockets' names, for what is told a socket by its name (the
// listeners a service manager passes, the messages naming a server).
const (
	GitSockName    = "git.sock"    // GitService, served by bushostd
	BrokerSockName = "broker.sock" // BrokerService, served by bushostd
	LaunchSockName = "launch.sock" // LaunchService, served by sandbox serve as root
	AdminTokenName = "admin.token" // the host's own credential
)

// Home is a bus host's home directory, as given (relative or absolute).
type Home struct{ dir string }

// At is the home in dir.
func At(dir string) Home { return Home{dir: dir} }

// Dir is the home's directory.
func (h Home) Dir() string { return h.dir }

// Path is the file named name (one of the *Name constants) at the top of
// the home.
func (h Home) Path(name string) string { return filepath.Join(h.dir, name) }

// GitSock is bushostd's GitService socket (0660).
func (h Home) GitSock() string { return h.Path(GitSockName) }

// BrokerSock is bushostd's BrokerService socket (0660).
func (h Home) BrokerSock() string { return h.Path(BrokerSockName) }

// LaunchSock is the launcher's LaunchService socket (0660).
func (h Home) LaunchSock() string { return h.Path(LaunchSockName) }

// AdminToken is the host's own credential (0600, made at first start).
func (h Home) AdminToken() string { return h.Path(AdminTokenName) }

// BrokerDB is the broker's embedded SQLite store, used unless the broker
// is given a PostgreSQL DSN; SQLite keeps its -wal and -shm beside it.
func (h Home) BrokerDB() string { return h.Path("broker.db") }

// Repos holds the repositories: <business>/<project>/pool.git and
// <business>/<project>/tasks/<task>.git.
func (h Home) Repos() string { return h.Path("repos") }

// GitHome is the private HOME of the git processes the daemon runs.
func (h Home) GitHome() string { return h.Path("git-home") }

// Lock is the daemon's lock, held while it serves the home; it holds the
// pid of the daemon holding it.
func (h Home) Lock() string { return h.Path("bushostd.lock") }

// HostID keeps the host's id, made at first start.
func (h Home) HostID() string { return h.Path("host-id") }

// LogKey is the host's key for signing the broker's events (PEM, 0600),
// made at first start unless another file is named.
func (h Home) LogKey() string { return h.Path("log.key") }

// LogPub is the public key of LogKey, written at each start.
func (h Home) LogPub() string { return h.Path("log.pub") }

// Sessions, in the launcher's state directory (the home when it is
// root's), holds one directory per session.
func (h Home) Sessions() string { return h.Path("sessions") }

// LaunchLock, in the launcher's state directory, is its lock: one
// launcher per state directory.
func (h Home) LaunchLock() string { return h.Path("launch.lock") }

// ProbeDisk is where the launcher checks at start that a session's disk
// can be mounted.
func (h Home) ProbeDisk() string { return h.Path("probe-disk") }
