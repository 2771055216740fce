// Package supervisor keeps an agent's live services running in a git work
// tree, records every edit the agent makes there as a commit authored by the
// agent, and undoes an edit that leaves a service crash-looping with a revert
// commit authored by the supervisor.
//
// It owns: the TOML configuration, the workspace repository and its
// refs/supervisor/good ref, the recursive watcher, the service processes (each
// in its own process group, behind a small shim that takes the group down if
// the supervisor dies), crash-loop detection, reverts, the health HTTP server,
// and `init`, which prepares users, ownership and AGENTS.md as root and then
// drops to the unprivileged user that runs everything else.
//
// It must never: run git except through internal/gitcmd; let the
// agent-writable .git/config make it run a program (filter drivers, includes,
// a foreign work tree); write outside the workspace except its own temporary
// git home; keep any privilege after init; or leave a service process alive
// after it exits.
package supervisor
