// Package sandbox confines an agent session with bubblewrap: it turns the
// command line into a Config, the Config into a bind table in which every
// bind carries the reason the session needs it, and the table into one bwrap
// command line with a seccomp filter built here. The session's pid 1 is
// internal/sandbox/pid1 (cmd/sandbox-init, or the sandbox binary again): it
// dies with the bwrap process outside, reaps orphans, forwards run's
// signals to the command and exits with the command's status.
//
// It must never run a session unconfined (no fallback when bwrap fails),
// never as uid 0 on the host, and never bind anything that has no why: a
// path not in the table does not exist inside the session.
package sandbox
