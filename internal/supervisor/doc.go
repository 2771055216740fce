// Package supervisor keeps an agent's live services running in a git work
// tree, records every edit the agent makes there as a commit authored by the
// agent, and undoes an edit that leaves a service crash-looping with a revert
// commit authored by the supervisor.
//
// It owns: the TOML configuration, its own repository (a git dir outside
// the workspace, with the workspace as work tree) and its
// refs/supervisor/good ref, the recursive watcher, the service processes (each
// in its own process group, behind a small shim that takes the group down if
// the supervisor dies), the launcher that runs them as a user of their own,
// crash-loop detection, reverts, the health HTTP server, and `init`, which
// prepares users, ownership and AGENTS.md as root, following no link, and
// then drops to the unprivileged user that runs everything else.
//
// It must never: run git except through internal/gitcmd; read anything the
// agent can write as git configuration, attributes, ignore rules or refs;
// take the revert target from anywhere but its own state; change a path in
// the workspace as root except through a descriptor that followed no link;
// write outside the workspace except its git dir, its health socket and
// its temporary git home; keep any privilege after init; let a service signal or trace it; or
// leave a service process alive after it exits.
package supervisor
