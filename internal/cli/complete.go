package cli

import (
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bushost/bushost/internal/authz"
)

// Completion of flag values (bushost completion bash|zsh|fish): the ones
// whose values are a fixed vocabulary, by flag name, whichever command
// declares the flag.
var flagValues = map[string]struct {
	values []string
	// list: the value is a comma-separated list (--cap a,b): each item
	// completes after the last comma.
	list bool
}{
	"state": {values: []string{"open", "closed", "landed"}},
	"cap":   {values: authz.Capabilities, list: true},
	"caps":  {values: authz.Capabilities, list: true},
	// A role is any name; these are the ones the README uses.
	"role": {values: []string{"worker", "reviewer", "lead"}},
	"net":  {values: []string{"none", "proxy", "host"}},
}

// completeFlagValues registers the completion of cc's flags that have a
// vocabulary.
func completeFlagValues(cc *cobra.Command) {
	for name, v := range flagValues {
		if cc.Flags().Lookup(name) == nil {
			continue
		}
		cc.RegisterFlagCompletionFunc(name, func(_ *cobra.Command, _ []string, typed string) ([]string, cobra.ShellCompDirective) {
			if !v.list {
				return v.values, cobra.ShellCompDirectiveNoFileComp
			}
			i := strings.LastIndexByte(typed, ',')
			done := typed[:i+1]
			given := strings.Split(done, ",")
			var out []string
			for _, c := range v.values {
				if !slices.Contains(given, c) {
					out = append(out, done+c)
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
		})
	}
}
