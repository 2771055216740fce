// Package gitobj reads git's storage for the bus host: loose objects,
// packs with their version-2 indexes (both delta kinds, by offset and by
// id), the entries of a pack as it streams in, refs and packed-refs. It is
// the one reader of git's compressed data outside the client: go-git's
// plumbing packages (format/objfile, format/packfile, format/idxfile) do
// the reading where they serve, and the code here is hand-written only
// where a figure measured against them (quoted next to it, with the
// benchmark that reproduces it) needs it: an index mapped in place rather
// than decoded whole (index.go), and a pack's entries read as a stream
// whose every byte is accounted for (stream.go).
package gitobj
