package supervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The agent can write .git/config, and the supervisor runs git on it as
// another user. A filter driver (filter.<x>.clean with a .gitattributes
// line), an include.path, a foreign core.worktree or extensions.worktreeConfig
// would make that git run a program or touch files of the agent's choosing
// with the supervisor's rights. So before each commit or revert the
// supervisor rewrites .git/config keeping only keys known to be inert for the
// commands it runs, and says which keys it dropped. gitcmd's -c entries cover
// hooks, fsmonitor, pagers and editors independently.
//
// What remains is the moment between this check and the git process that
// follows it; README.md says so.

// minimalConfig replaces a config git cannot parse at all.
const minimalConfig = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n\tsharedrepository = group\n"

// inertCore lists the core.* keys that only tune how git reads and writes
// the files it was asked to.
var inertCore = map[string]bool{
	"filemode": true, "logallrefupdates": true, "ignorecase": true,
	"precomposeunicode": true, "symlinks": true, "sharedrepository": true,
	"autocrlf": true, "safecrlf": true, "eol": true, "quotepath": true,
	"abbrev": true, "commentchar": true, "whitespace": true,
	"untrackedcache": true, "checkstat": true, "trustctime": true,
	"warnambiguousrefs": true,
}

// inertSections are sections whose two-level keys (section.name) never name
// a program or a path for the commands the supervisor runs.
var inertSections = map[string]bool{
	"user": true, "author": true, "committer": true, "init": true,
	"i18n": true, "column": true, "help": true, "advice": true,
	"log": true, "format": true, "pull": true, "push": true, "fetch": true,
	"status": true, "rebase": true, "merge": true, "diff": true, "tag": true,
	"stash": true, "blame": true, "grep": true, "pretty": true, "alias": true,
	"color": true, "branch": true, "remote": true, "receive": true,
}

// withSubsections are inert sections whose three-level keys are inert too
// (color.diff.meta, remote.origin.url, branch.main.merge). The supervisor
// never fetches or pushes, so remote URLs are never used by it.
var withSubsections = map[string]bool{"color": true, "branch": true, "remote": true}

// configAllowed reports whether key=value may stay in the workspace config.
// git lists keys with section and name lower-cased.
func configAllowed(key, value string) bool {
	sec, sub, name := splitConfigKey(key)
	switch sec {
	case "core":
		if sub != "" {
			return false
		}
		switch name {
		case "repositoryformatversion":
			return value == "0" || value == "1"
		case "bare":
			return value == "false"
		}
		return inertCore[name]
	case "extensions":
		return sub == "" && name == "objectformat"
	}
	if !inertSections[sec] {
		return false
	}
	return sub == "" || withSubsections[sec]
}

func splitConfigKey(key string) (sec, sub, name string) {
	first := strings.IndexByte(key, '.')
	last := strings.LastIndexByte(key, '.')
	if first < 0 {
		return key, "", ""
	}
	sec, name = key[:first], key[last+1:]
	if last > first {
		sub = key[first+1 : last]
	}
	return sec, sub, name
}

type configEntry struct {
	key, value string
	hasValue   bool
}

// sanitizeConfig drops every key of .git/config that configAllowed refuses,
// and a commondir file that would send git to another repository.
func (r *Repo) sanitizeConfig(ctx context.Context) error {
	common := filepath.Join(r.gitDir, "commondir")
	if _, err := os.Lstat(common); err == nil {
		if err := os.Remove(common); err != nil {
			return fmt.Errorf("workspace .git/commondir redirects git elsewhere and cannot be removed: %w", err)
		}
		r.log.Warn("removed .git/commondir: it would send the supervisor's git to another repository")
	}
	path := filepath.Join(r.gitDir, "config")
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return writeFileAtomic(path, []byte(minimalConfig), 0o664)
	}
	if err != nil {
		return fmt.Errorf("workspace .git/config: %w", err)
	}
	if !fi.Mode().IsRegular() {
		r.log.Warn("replaced .git/config: it was not a regular file", "mode", fi.Mode().String())
		return writeFileAtomic(path, []byte(minimalConfig), 0o664)
	}
	out, err := r.git.Output(ctx, r.cmd("config", []string{"--local", "--no-includes", "--null", "--list"}))
	if err != nil {
		r.log.Warn("replaced .git/config: git cannot read it", "err", err)
		return writeFileAtomic(path, []byte(minimalConfig), 0o664)
	}
	var keep []configEntry
	var dropped []string
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		k, v, has := strings.Cut(string(rec), "\n")
		if configAllowed(k, v) {
			keep = append(keep, configEntry{key: k, value: v, hasValue: has})
		} else {
			dropped = append(dropped, k)
		}
	}
	if len(dropped) == 0 {
		return nil
	}
	if err := writeFileAtomic(path, formatConfig(keep), 0o664); err != nil {
		return fmt.Errorf("workspace .git/config holds %s and cannot be rewritten: %w", strings.Join(dropped, ", "), err)
	}
	r.log.Warn("removed keys from .git/config that would make the supervisor run programs or use other paths",
		"keys", strings.Join(dropped, ","))
	return nil
}

// formatConfig writes entries in git's config syntax, every value quoted.
func formatConfig(entries []configEntry) []byte {
	var b bytes.Buffer
	b.WriteString("# Rewritten by the bushost supervisor, which keeps only inert keys (see its README).\n")
	lastHeader := ""
	for _, e := range entries {
		sec, sub, name := splitConfigKey(e.key)
		header := "[" + sec + "]"
		if sub != "" {
			header = "[" + sec + " \"" + escapeConfig(sub, false) + "\"]"
		}
		if header != lastHeader {
			b.WriteString(header + "\n")
			lastHeader = header
		}
		if !e.hasValue {
			fmt.Fprintf(&b, "\t%s\n", name)
			continue
		}
		fmt.Fprintf(&b, "\t%s = \"%s\"\n", name, escapeConfig(e.value, true))
	}
	return b.Bytes()
}

func escapeConfig(s string, value bool) string {
	var b strings.Builder
	for _, c := range s {
		switch {
		case c == '\\' || c == '"':
			b.WriteByte('\\')
			b.WriteRune(c)
		case value && c == '\n':
			b.WriteString(`\n`)
		case value && c == '\t':
			b.WriteString(`\t`)
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}
