// Package unidiff reads and applies unified diffs: git's format (a
// "diff --git" line, extended headers, ---/+++ names with a/ and b/
// prefixes) and plain diff -u output (names with timestamps after a
// tab). Parse turns a patch into File sections and Format writes them
// back out; SplitText and Apply apply one section to a file's content in
// memory, every hunk matching its old lines exactly (at an offset from
// its stated line when need be, never fuzzily), all of a section's hunks
// or none.
//
// It exists so that the patch tool's parsing and matching, which take
// text from callers and must refuse what they cannot apply exactly, can
// be read, tested and fuzzed apart from the files they end up in. It
// touches no file and imports nothing from this module but protocol (for
// the limits callers are told of).
package unidiff

// utf8BOM is the UTF-8 byte-order mark, kept at the start of a file that
// has one.
const utf8BOM = "\uFEFF"
