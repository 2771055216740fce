package cli

import (
	"cmp"
	"context"
	"strings"

	"github.com/bushost/bushost/internal/gitcmd"
)

// verdictCommit is the commit a verdict names: --commit (a full id as
// given), else the one fetch-review left in dir's refs/review/<task>,
// which is what the reviewer had to look at. The client does not know its
// grant's task, so dir must hold exactly one such ref; none, or several,
// is a usage error (give --commit).
func verdictCommit(ctx context.Context, commit, dir string) (string, error) {
	if commit != "" {
		return commit, nil
	}
	dir = cmp.Or(dir, ".")
	g, done, err := gitRunner()
	if err != nil {
		return "", err
	}
	defer done()
	out, err := g.Output(ctx, gitcmd.Cmd{Dir: dir, Sub: "for-each-ref", Flags: []string{"--format=%(objectname) %(refname)"}, Args: []string{"refs/review/"}}, 16<<20) // a ref a reviewed task
	if err != nil {
		return "", usagef("no --commit, and %s is not a git repository with refs/review/<task>: %v", dir, err)
	}
	found := strings.FieldsFunc(string(out), func(r rune) bool { return r == '\n' })
	switch len(found) {
	case 0:
		return "", usagef("no --commit, and %s has no refs/review/<task>: run 'bushost fetch-review --repo %s' first", dir, dir)
	case 1:
		commit, _, _ := strings.Cut(found[0], " ")
		return commit, nil
	}
	return "", usagef("no --commit, and %s has %d refs/review/* (%s): give --commit SHA", dir, len(found), strings.Join(found, ", "))
}
