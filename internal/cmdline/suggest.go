package cmdline

import (
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// "Did you mean" for a mistyped flag, for every binary: cobra's commands
// (pflag) through FlagHint, the Passthrough commands (a Go flag set their
// own code parses) by checking their flags before they run.

// FlagHint is pflag's error for cmd's command line, with the flags close
// to an unknown one added ("Did you mean this?", as cobra says it for a
// command): the command's own flags within two edits or starting with
// what was typed, and the inherited ones within two edits.
func FlagHint(cmd *cobra.Command, err error) string {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "unknown flag: --")
	if !ok {
		return msg
	}
	var own, inherited []string
	cmd.Flags().VisitAll(func(f *pflag.Flag) { own = append(own, f.Name) })
	cmd.InheritedFlags().VisitAll(func(f *pflag.Flag) { inherited = append(inherited, f.Name) })
	best := suggest(name, own, true)
	for _, n := range suggest(name, inherited, false) {
		if !slices.Contains(best, n) {
			best = append(best, n)
		}
	}
	return msg + didYouMean(best)
}

// suggest returns the names within two edits of name (or, with prefix,
// that start with it), as --name.
func suggest(name string, names []string, prefix bool) []string {
	var out []string
	for _, n := range names {
		if distance(name, n) <= 2 || (prefix && strings.HasPrefix(n, name)) {
			out = append(out, "--"+n)
		}
	}
	return out
}

func didYouMean(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return "\n\nDid you mean this?\n\t" + strings.Join(names, "\n\t")
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// goFlags reads the flags that flags writes (PrintDefaults): each name, and
// whether it takes a value. A flag's line is "  -name" and, for a flag that
// takes a value, a space and its type ("  -run-dir string"); a boolean
// shows no type. It is read by hand, not with a regexp: every run of a
// command with flags reads it, the sandbox's among them, and compiling a
// regexp cost each start more than the reading.
func goFlags(flags func(w io.Writer)) map[string]bool {
	var b strings.Builder
	flags(&b)
	known := map[string]bool{}
	for line := range strings.Lines(b.String()) {
		rest, ok := strings.CutPrefix(line, "  -")
		if !ok {
			continue
		}
		end := strings.IndexFunc(rest, func(r rune) bool { return flagSpace(r) || r == '=' })
		if end < 0 {
			end = len(rest)
		}
		if end == 0 {
			continue
		}
		after := rest[end:]
		known[rest[:end]] = len(after) > 1 && after[0] == ' ' && !flagSpace(rune(after[1]))
	}
	return known
}

// flagSpace is what ends a flag's name or type in PrintDefaults' lines.
func flagSpace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\f'
}

// CheckFlags refuses the first flag of args that flags (a Go flag set's
// PrintDefaults) does not list, as a UsageError naming the flags close to
// it; nil when every flag is known. For a command whose flags another
// process parses (sandbox serve, which bushostd serves). args are read as
// Go's flag package will parse them (flags up to the first argument that
// is not one, or "--"); syntax the flag package refuses on its own
// ("---x", "-=x") is left to it.
func CheckFlags(args []string, flags func(w io.Writer)) error {
	known := goFlags(flags)
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			return nil
		}
		name := strings.TrimPrefix(a[1:], "-")
		name, _, hasValue := strings.Cut(name, "=")
		if name == "" || strings.HasPrefix(name, "-") {
			return nil
		}
		takesValue, ok := known[name]
		if !ok {
			if name == "h" || name == "help" {
				return nil
			}
			best := suggest(name, slices.Collect(maps.Keys(known)), true)
			slices.Sort(best)
			return UsageError{"unknown flag: --" + name + didYouMean(best)}
		}
		if takesValue && !hasValue {
			i++
		}
	}
	return nil
}
