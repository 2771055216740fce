package cli

import (
	"bufio"
	"bytes"
	"context"
	"maps"
	"strconv"
	"strings"

	"github.com/bushost/bushost/internal/errdefs"
	"github.com/bushost/bushost/internal/gitcmd"
)

// The bus host refuses an object over its limit (OBJECT_TOO_LARGE) as the
// pack streams in, before git has hashed it: it can name only the pack
// entry, its type and its size. The worker's repository knows the rest:
// among the objects the push carried (head's history without base's),
// the one of that type and exactly that size is the object, and
// rev-list's walk gives its path.

// nameTooLarge adds to an OBJECT_TOO_LARGE refusal of a push of head
// against base from repo the object's id and path (metadata "object" and
// "path"); any other error, or one it cannot name, is returned as it was.
func nameTooLarge(ctx context.Context, err error, repo, base, head string) error {
	x, ok := errdefs.As(err)
	if !ok || x.Reason != errdefs.ObjectTooLarge || x.Metadata["type"] == "" {
		return err
	}
	size, perr := strconv.ParseInt(x.Metadata["size"], 10, 64)
	if perr != nil {
		return err
	}
	g, done, gerr := gitRunner()
	if gerr != nil {
		return err
	}
	defer done()
	oid, path, ok := findObject(ctx, g, repo, base, head, x.Metadata["type"], size)
	if !ok {
		return err
	}
	named := *x
	named.Metadata = maps.Clone(x.Metadata)
	where := ""
	if path != "" {
		where = " at " + path
		named.Metadata["path"] = path
	}
	named.Metadata["object"] = oid
	named.Message = x.Message + "; in " + repo + " it is the " + x.Metadata["type"] + " " + oid + where
	return &named
}

// maxObjectListing bounds what findObject reads of git: the name is a
// courtesy, and a push whose listing is larger goes without it.
const maxObjectListing = 64 << 20

// findObject returns the object of type typ and size bytes among those in
// head's history and not in base's, with the path rev-list gives it ("" for
// a commit or tag).
func findObject(ctx context.Context, g *gitcmd.Runner, repo, base, head, typ string, size int64) (oid, path string, ok bool) {
	list, err := g.Output(ctx, gitcmd.Cmd{Dir: repo, Sub: "rev-list", Flags: []string{"--objects"}, Args: []string{head, "^" + base}}, maxObjectListing)
	if err != nil {
		return "", "", false
	}
	paths := map[string]string{}
	var ids bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		id, p, _ := strings.Cut(sc.Text(), " ")
		paths[id] = p
		ids.WriteString(id + "\n")
	}
	sizes, err := g.Output(ctx, gitcmd.Cmd{Dir: repo, Sub: "cat-file", Flags: []string{"--batch-check=%(objectname) %(objecttype) %(objectsize)"}, Stdin: &ids}, maxObjectListing)
	if err != nil {
		return "", "", false
	}
	want := typ + " " + strconv.FormatInt(size, 10)
	sc = bufio.NewScanner(bytes.NewReader(sizes))
	for sc.Scan() {
		if id, rest, _ := strings.Cut(sc.Text(), " "); rest == want {
			return id, paths[id], true
		}
	}
	return "", "", false
}
