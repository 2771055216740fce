package bundle

import (
	"bytes"
	"fmt"
)

// StrictFlag is index-pack's --strict with the severities raised to error
// for what git 2.39 has a message id for but reports only as info (or not
// at all under plain --strict): a symlinked .gitattributes, .gitignore or
// .mailmap (git 2.32's dotfile checks, spellings included; the ids work in
// 2.39 though its documentation does not list them), a file mode other
// than git's five, and a .gitmodules git cannot parse. git then refuses
// these first, naming the id; gitd's beyond-git walk (gitd/beyondgit.go)
// checks them again with the cases git 2.39 has no id for.
const StrictFlag = "--strict=gitattributesSymlink=error,gitignoreSymlink=error,mailmapSymlink=error,badFilemode=error,gitmodulesParse=error"

// trailingBytes refuses bytes after the pack. git 2.39's index-pack says
// "pack has junk at the end" when it reads a file; with --stdin it passes
// them to its stdout after the "pack\tNAME" line instead.
func trailingBytes(out []byte) error {
	line, rest, _ := bytes.Cut(out, []byte("\n"))
	if len(rest) > 0 && bytes.HasPrefix(line, []byte("pack\t")) {
		return &PackError{Msg: fmt.Sprintf("pack has junk at the end: %d bytes after the pack", len(rest))}
	}
	return nil
}
