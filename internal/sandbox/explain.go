package sandbox

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Explain writes the plan: the bind table in mount order (kind, source,
// target, why), then namespaces, hardening, notes and problems.
func Explain(out io.Writer, p *Plan, asJSON bool) error {
	// tabwriter writes cell by cell: one write(2) per cell without this.
	w := bufio.NewWriter(out)
	if p.User.Dynamic {
		p.Share = p.shareMode()
	}
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			*Plan
			EnvNames []string `json:"env"`
		}{p, envNames(p.Env)}); err != nil {
			return err
		}
		return w.Flush()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tSOURCE\tTARGET\tWHY")
	for _, b := range p.Binds {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", b.Kind, cmp.Or(b.Source, "-"), b.Target, b.Why)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.User.Dynamic {
		fmt.Fprintf(w, "\nuser: a uid of its own from %d-%d, picked at launch (groups %s)\n", p.Config.UIDLow, p.Config.UIDHigh, joinGIDs(p.User.Groups))
	} else {
		fmt.Fprintf(w, "\nuser: %s (uid %d, gid %d, groups %s)\n", p.User.Name, p.User.UID, p.User.GID, joinGIDs(p.User.Groups))
	}
	if p.Share != "" {
		fmt.Fprintf(w, "share: %s\n", p.Share)
	}
	for _, g := range p.SocketGroups {
		fmt.Fprintf(w, "group: %d (%s) for %s: %s\n", g.GID, cmp.Or(g.Name, "-"), strings.Join(g.Sockets, " "), g.Why)
	}
	if l := p.Limits; l != (Limits{}) {
		fmt.Fprintf(w, "limits: %s (core dumps off; the cgroup is made at launch, or the launch refused)\n", l)
	}
	fmt.Fprintf(w, "network: %s: %s\n", p.Network.Mode, p.Network.Why)
	if p.Network.Relay != "" {
		fmt.Fprintf(w, "relay: %s (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY point here; NO_PROXY is empty)\n", p.Network.Relay)
		if len(p.Network.Allowed) == 0 {
			fmt.Fprintln(w, "allowed: nothing (no --allow-domain or --allow-host): every connection is refused")
		}
		for _, a := range p.Network.Allowed {
			fmt.Fprintf(w, "allowed: %s: %s\n", a.Rule, a.Why)
		}
		fmt.Fprintf(w, "egress limits: %s\n", p.Network.Limits)
		fmt.Fprintf(w, "egress decisions: to %s\n", p.Network.Audit)
	}
	fmt.Fprintf(w, "namespaces: %s\n", strings.Join(p.Namespaces, " "))
	fmt.Fprintf(w, "env: %s\n", strings.Join(envNames(p.Env), " "))
	fmt.Fprintln(w, "hardening:")
	for _, h := range p.Hardening {
		fmt.Fprintf(w, "  %s: %s\n", h.Flag, h.Why)
	}
	for _, n := range p.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, pr := range p.Problems {
		fmt.Fprintf(w, "problem: %s\n", pr)
	}
	return w.Flush()
}

// envNames lists variable names only: --env values may be secrets.
func envNames(env []string) []string {
	names := make([]string, len(env))
	for i, e := range env {
		names[i], _, _ = strings.Cut(e, "=")
	}
	return names
}

func joinGIDs(gids []uint32) string {
	if len(gids) == 0 {
		return "none"
	}
	return strings.Trim(fmt.Sprint(gids), "[]")
}
