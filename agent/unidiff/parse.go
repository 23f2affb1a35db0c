package unidiff

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file reads unified diffs for the patch tool: git's format (a
// "diff --git" line, extended headers, ---/+++ names with a/ and b/
// prefixes) and plain diff -u output (names with timestamps after a
// tab). Format writes a parsed patch back out; parsing its output
// gives the same patch again.

const (
	// maxPatchBytes bounds the patch text a call may carry.
	maxPatchBytes = protocol.PatchMaxBytes
	// maxPatchLines bounds the lines of the patch text: once parsed, a
	// line takes several times its bytes.
	maxPatchLines = 1 << 20
	// maxPatchFiles bounds the file sections of one patch.
	maxPatchFiles = protocol.PatchMaxFiles
	// maxHunkCount bounds a hunk header's line numbers and counts.
	maxHunkCount = 1 << 30
)

// Op is what a file section does to its file.
type Op int

const (
	Modify Op = iota
	Create
	Delete
)

func (o Op) String() string {
	switch o {
	case Create:
		return "create"
	case Delete:
		return "delete"
	}
	return "modify"
}

// File is one file's section of a patch.
type File struct {
	// Path names the file, as the patch gives it with the a/ or b/
	// prefix removed.
	Path string
	Op   Op
	// Mode is the permission bits git's "new file mode" gives a created
	// file; 0 means the default, 0644.
	Mode  fs.FileMode
	Hunks []Hunk
	// Line is the patch line (from 1) where the section starts.
	Line int
}

// hunk is one @@ block.
type Hunk struct {
	OldStart, OldLines int
	NewStart, NewLines int
	// Section is the text after the closing @@ (often a function name).
	Section string
	Lines   []HunkLine
	// Line is the patch line of the @@ header.
	Line int
}

// HunkLine is one line of a hunk.
type HunkLine struct {
	Kind byte   // ' ' context, '-' removed, '+' added
	Text string // without the line ending
	// NoEOL: the line has no newline ("\ No newline at end of file").
	NoEOL bool
}

// header returns the hunk's @@ line without its section text.
func (h *Hunk) Header() string {
	return fmt.Sprintf("@@ -%d,%d +%d,%d @@", h.OldStart, h.OldLines, h.NewStart, h.NewLines)
}

// oldIndex is where the hunk's old lines start, counted from 0: a hunk
// that removes nothing names the line it follows.
func (h *Hunk) oldIndex() int {
	if h.OldLines == 0 {
		return h.OldStart
	}
	return h.OldStart - 1
}

// patchError is a patch that cannot be parsed.
type patchError struct {
	line int // patch line, from 1; 0: the patch as a whole
	msg  string
}

func (e *patchError) Error() string {
	if e.line == 0 {
		return "patch: " + e.msg
	}
	return fmt.Sprintf("patch line %d: %s", e.line, e.msg)
}

// patchParser reads a patch line by line.
type patchParser struct {
	lines []string
	i     int // the next line
	files []*File
}

// Parse parses a unified diff of one or more files. Text before,
// between and after the file sections (a commit message, "Index:"
// lines) is ignored. The error names the patch line that is wrong.
func Parse(text string) ([]*File, error) {
	if len(text) > maxPatchBytes {
		return nil, &patchError{msg: fmt.Sprintf("%d bytes exceeds the limit of %d bytes (16 MiB); split it into several patches", len(text), maxPatchBytes)}
	}
	if n := strings.Count(text, "\n"); n > maxPatchLines || n == maxPatchLines && !strings.HasSuffix(text, "\n") {
		return nil, &patchError{msg: fmt.Sprintf("more than %d lines; split it into several patches", maxPatchLines)}
	}
	p := &patchParser{lines: splitPatchLines(text)}
	for p.i < len(p.lines) {
		if err := p.next(); err != nil {
			return nil, err
		}
		if len(p.files) > maxPatchFiles {
			return nil, &patchError{msg: fmt.Sprintf("more than %d files; split it into several patches", maxPatchFiles)}
		}
	}
	if len(p.files) == 0 {
		return nil, &patchError{msg: "no file changes found; give a unified diff with ---/+++ file headers and @@ hunks (the output of git diff or diff -u)"}
	}
	return p.files, nil
}

// splitPatchLines splits text into lines. When the patch itself has
// CRLF line endings (its @@ lines end in a carriage return), every line
// loses its CR; otherwise CRs are content (diff -u of a CRLF file).
func splitPatchLines(text string) []string {
	lines := strings.Split(text, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "@@ ") {
			if strings.HasSuffix(l, "\r") {
				for i := range lines {
					lines[i] = strings.TrimSuffix(lines[i], "\r")
				}
			}
			break
		}
	}
	return lines
}

// line returns line i without a trailing carriage return, for headers.
func (p *patchParser) line(i int) string {
	return strings.TrimSuffix(p.lines[i], "\r")
}

func (p *patchParser) errorf(line int, format string, args ...any) error {
	return &patchError{line: line + 1, msg: fmt.Sprintf(format, args...)}
}

// next consumes the next section or ignored line.
func (p *patchParser) next() error {
	l := p.line(p.i)
	switch {
	case strings.HasPrefix(l, "diff --git "):
		return p.gitSection()
	case strings.HasPrefix(l, "--- ") && p.i+1 < len(p.lines) && strings.HasPrefix(p.lines[p.i+1], "+++ "):
		return p.section(nil)
	case strings.HasPrefix(l, "--- ") && p.i+1 < len(p.lines) && strings.HasPrefix(p.lines[p.i+1], "@@ "):
		return p.errorf(p.i, "a --- line must be followed by a +++ line naming the new file")
	case strings.HasPrefix(l, "@@ "):
		return p.errorf(p.i, "hunk %s comes before any ---/+++ file header; start each file with --- a/PATH and +++ b/PATH lines", l)
	case strings.HasPrefix(l, "Binary files ") && strings.HasSuffix(l, " differ"),
		strings.HasPrefix(l, "GIT binary patch"):
		return p.errorf(p.i, "binary patches are not supported (%s); write the file's new content with the write tool", l)
	}
	p.i++
	return nil
}

// gitHeader is what a "diff --git" line and its extended headers say.
type gitHeader struct {
	line       int
	oldPath    string // a/ removed; "" if the names could not be split
	newPath    string
	newFile    bool
	deleted    bool
	mode       fs.FileMode // of a new file
	modeChange string      // "100644 → 100755" for an old mode/new mode pair
}

// gitSection parses a section that starts with "diff --git".
func (p *patchParser) gitSection() error {
	g := &gitHeader{line: p.i}
	g.oldPath, g.newPath = splitGitNames(strings.TrimPrefix(p.line(p.i), "diff --git "))
	var oldMode string
	for p.i++; p.i < len(p.lines); p.i++ {
		l := p.line(p.i)
		key, val := gitExtended(l)
		switch key {
		case "":
			return p.gitBody(g)
		case "new file mode ":
			g.newFile = true
			m, err := strconv.ParseUint(val, 8, 32)
			if err != nil {
				return p.errorf(p.i, "%q is not a file mode; git writes new file mode 100644 or 100755", val)
			}
			if g.mode = fs.FileMode(m) & fs.ModePerm; g.mode == 0 {
				g.mode = 0o644
			}
		case "deleted file mode ":
			g.deleted = true
		case "old mode ":
			oldMode = val
		case "new mode ":
			g.modeChange = oldMode + " → " + val
		case "rename from ", "rename to ":
			return p.errorf(p.i, "renames are not supported (%s); move the file with the move tool (or bash mv), then patch it under its new name", l)
		case "copy from ", "copy to ":
			return p.errorf(p.i, "copies are not supported (%s); create the copy with the write tool, then patch it", l)
		case "binary":
			return p.errorf(p.i, "binary patches are not supported (%s); write the file's new content with the write tool", l)
		}
	}
	return p.gitBody(g)
}

// gitExtended recognises a git extended header line and returns its key
// and value; "" for a line that is not one.
func gitExtended(l string) (key, val string) {
	for _, k := range []string{"new file mode ", "deleted file mode ", "old mode ", "new mode ", "index ",
		"similarity index ", "dissimilarity index ", "rename from ", "rename to ", "copy from ", "copy to "} {
		if v, ok := strings.CutPrefix(l, k); ok {
			return k, v
		}
	}
	if strings.HasPrefix(l, "GIT binary patch") || strings.HasPrefix(l, "Binary files ") && strings.HasSuffix(l, " differ") {
		return "binary", ""
	}
	return "", ""
}

// gitBody parses what follows a git section's extended headers.
func (p *patchParser) gitBody(g *gitHeader) error {
	if g.modeChange != "" {
		return p.errorf(g.line, "the patch changes the mode of %s (%s), which patch cannot do; leave out the old mode/new mode lines and use bash chmod", displayName(g.newPath), g.modeChange)
	}
	if p.i+1 < len(p.lines) && strings.HasPrefix(p.lines[p.i], "--- ") && strings.HasPrefix(p.lines[p.i+1], "+++ ") {
		return p.section(g)
	}
	// No ---/+++ lines: git's form for creating or deleting an empty file.
	fp := &File{Line: g.line + 1}
	switch {
	case g.newFile && g.newPath != "":
		fp.Path, fp.Op, fp.Mode = g.newPath, Create, g.mode
	case g.deleted && g.oldPath != "":
		fp.Path, fp.Op = g.oldPath, Delete
	case g.newFile || g.deleted:
		return p.errorf(g.line, "cannot tell the file's name from this diff --git line; add --- and +++ lines")
	default:
		return p.errorf(g.line, "diff --git section for %s has no ---/+++ lines and no hunks; give the changes as @@ hunks", displayName(g.newPath))
	}
	p.files = append(p.files, fp)
	return nil
}

func displayName(s string) string {
	if s == "" {
		return "the file"
	}
	return s
}

// splitGitNames splits the names of a "diff --git" line. Unquoted names
// may hold spaces, so the split is the one where both names agree; for
// names that differ (a rename) the answer is empty.
func splitGitNames(s string) (oldName, newName string) {
	if strings.HasPrefix(s, `"`) {
		a, rest, ok := unquoteName(s)
		if !ok || !strings.HasPrefix(rest, " ") {
			return "", ""
		}
		b, ok := maybeUnquote(rest[1:])
		if !ok {
			return "", ""
		}
		return stripPrefixes(a, b)
	}
	for i := 0; i < len(s); i++ {
		if s[i] != ' ' {
			continue
		}
		b, ok := maybeUnquote(s[i+1:])
		if !ok {
			continue
		}
		if a, b := stripPrefixes(s[:i], b); a == b {
			return a, b
		}
	}
	return "", ""
}

// maybeUnquote unquotes s if it is a quoted name, and returns it as it
// is otherwise.
func maybeUnquote(s string) (string, bool) {
	if !strings.HasPrefix(s, `"`) {
		return s, true
	}
	q, rest, ok := unquoteName(s)
	return q, ok && rest == ""
}

// stripPrefixes removes git's a/ and b/ prefixes when both names have
// them.
func stripPrefixes(a, b string) (string, string) {
	if strings.HasPrefix(a, "a/") && strings.HasPrefix(b, "b/") {
		return stripPrefix(a, "a/"), stripPrefix(b, "b/")
	}
	return a, b
}

func stripPrefix(s, prefix string) string {
	if t, ok := strings.CutPrefix(s, prefix); ok && t != "" {
		return t
	}
	return s
}

// unquoteName reads a C-quoted name (git's quoting of unusual names)
// from the start of s and returns it and the rest of s.
func unquoteName(s string) (name, rest string, ok bool) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			name, err := strconv.Unquote(s[:i+1])
			if err != nil {
				return "", s, false
			}
			return name, s[i+1:], true
		}
	}
	return "", s, false
}

// fileName is a name from a ---/+++ line.
type fileName struct {
	name   string // "" when absent
	absent bool   // /dev/null, or a plain diff's epoch timestamp
}

// parseFileName reads the name on a ---/+++ line (after the marker):
// quoted or up to a tab (after which a timestamp may follow).
func parseFileName(s string) (fileName, error) {
	s = strings.TrimLeft(s, " ")
	var name, stamp string
	if strings.HasPrefix(s, `"`) {
		n, rest, ok := unquoteName(s)
		if !ok {
			return fileName{}, errors.New("the quoted file name is not closed or has a bad escape")
		}
		name, stamp = n, strings.TrimPrefix(rest, "\t")
	} else {
		name, stamp, _ = strings.Cut(s, "\t")
		name = strings.TrimRight(name, " ")
	}
	switch {
	case name == "":
		return fileName{}, errors.New("the file name is missing")
	case name == "/dev/null":
		return fileName{absent: true}, nil
	case isEpoch(stamp):
		// diff -N marks a file that does not exist with the epoch.
		return fileName{name: name, absent: true}, nil
	}
	return fileName{name: name}, nil
}

// isEpoch reports whether a diff -u timestamp is the Unix epoch.
func isEpoch(stamp string) bool {
	stamp = strings.TrimSpace(stamp)
	if stamp == "" {
		return false
	}
	for _, layout := range []string{"2006-01-02 15:04:05.999999999 -0700", "2006-01-02 15:04:05 -0700"} {
		if t, err := time.Parse(layout, stamp); err == nil {
			return t.Unix() == 0
		}
	}
	return false
}

// section parses a ---/+++ pair and its hunks; g is the git header
// before it, if any.
func (p *patchParser) section(g *gitHeader) error {
	start := p.i
	if g != nil {
		start = g.line
	}
	oldName, err := parseFileName(strings.TrimPrefix(p.line(p.i), "--- "))
	if err != nil {
		return p.errorf(p.i, "--- line: %v", err)
	}
	newName, err := parseFileName(strings.TrimPrefix(p.line(p.i+1), "+++ "))
	if err != nil {
		return p.errorf(p.i+1, "+++ line: %v", err)
	}
	p.i += 2
	fp := &File{Line: start + 1}
	if err := p.name(fp, oldName, newName, g); err != nil {
		return err
	}
	for p.i < len(p.lines) && strings.HasPrefix(p.lines[p.i], "@@ ") {
		h, err := p.hunk()
		if err != nil {
			return err
		}
		fp.Hunks = append(fp.Hunks, *h)
	}
	if p.i < len(p.lines) {
		if err := p.checkAfterHunks(); err != nil {
			return err
		}
	}
	if len(fp.Hunks) == 0 {
		return p.errorf(start, "the section for %s has no @@ hunks", fp.Path)
	}
	if err := checkHunks(fp); err != nil {
		return err
	}
	p.files = append(p.files, fp)
	return nil
}

// name decides a section's file and operation from its ---/+++ names.
// The a/ and b/ prefixes go when both names have them (one name when
// the other is /dev/null).
func (p *patchParser) name(fp *File, oldName, newName fileName, g *gitHeader) error {
	strip := strings.HasPrefix(oldName.name, "a/") && strings.HasPrefix(newName.name, "b/") ||
		oldName.name == "" && strings.HasPrefix(newName.name, "b/") ||
		newName.name == "" && strings.HasPrefix(oldName.name, "a/")
	if strip {
		oldName.name = stripPrefix(oldName.name, "a/")
		newName.name = stripPrefix(newName.name, "b/")
	}
	switch {
	case oldName.absent && newName.absent:
		return p.errorf(p.i-2, "both --- and +++ are /dev/null; one of them must name the file")
	case oldName.absent:
		fp.Path, fp.Op = newName.name, Create
		if g != nil {
			fp.Mode = g.mode
		}
	case newName.absent:
		fp.Path, fp.Op = oldName.name, Delete
	case oldName.name != newName.name:
		return p.errorf(p.i-2, "--- names %s but +++ names %s; a patch changes each file in place. Renames are not supported: move the file first (move tool or bash mv), then patch it under one name", oldName.name, newName.name)
	default:
		fp.Path = newName.name
	}
	return nil
}

// checkAfterHunks refuses lines right after a section's last hunk that
// look like more hunk lines: the hunk header's counts are then wrong,
// and ignoring them would drop changes.
func (p *patchParser) checkAfterHunks() error {
	l := p.lines[p.i]
	switch {
	case l == "" || l == "-- " || l == "-- \r":
		return nil // a blank line, or the signature separator of git format-patch
	case strings.HasPrefix(l, "--- ") && p.i+1 < len(p.lines) && strings.HasPrefix(p.lines[p.i+1], "+++ "):
		return nil
	case l[0] == ' ' || l[0] == '-' || l[0] == '+':
		return p.errorf(p.i, "%q follows a complete hunk: the previous @@ header counts fewer lines than the hunk has; fix its counts", protocol.Ellipsis(l, 60))
	}
	return nil
}

// hunk parses one hunk, from its @@ line.
func (p *patchParser) hunk() (*Hunk, error) {
	h, err := parseHunkHeader(p.line(p.i))
	if err != nil {
		return nil, p.errorf(p.i, "%v", err)
	}
	h.Line = p.i + 1
	p.i++
	var oldN, newN int
	for oldN < h.OldLines || newN < h.NewLines {
		if p.i >= len(p.lines) {
			return nil, p.errorf(h.Line-1, "hunk %s ends early at the end of the patch: its header counts %d old and %d new lines, the hunk has %d and %d; fix the counts or the lines",
				h.Header(), h.OldLines, h.NewLines, oldN, newN)
		}
		l := p.lines[p.i]
		kind, text := byte(' '), ""
		if l != "" {
			kind, text = l[0], l[1:]
		}
		switch kind {
		case ' ':
			oldN++
			newN++
		case '-':
			oldN++
		case '+':
			newN++
		case '\\':
			if err := p.noEOL(h); err != nil {
				return nil, err
			}
			continue
		default:
			return nil, p.errorf(p.i, "hunk %s ends early: its header counts %d old and %d new lines, the hunk has %d and %d before this line, which is not a hunk line (' ', '-', '+'); fix the counts or the lines",
				h.Header(), h.OldLines, h.NewLines, oldN, newN)
		}
		if oldN > h.OldLines || newN > h.NewLines {
			return nil, p.errorf(p.i, "hunk %s has more lines than its header counts (%d old, %d new); fix the counts", h.Header(), h.OldLines, h.NewLines)
		}
		h.Lines = append(h.Lines, HunkLine{Kind: kind, Text: text})
		p.i++
	}
	if p.i < len(p.lines) && strings.HasPrefix(p.lines[p.i], "\\") {
		if err := p.noEOL(h); err != nil {
			return nil, err
		}
	}
	return h, checkNoEOL(h)
}

// noEOL applies a "\ No newline at end of file" line to the line before.
func (p *patchParser) noEOL(h *Hunk) error {
	if len(h.Lines) == 0 || h.Lines[len(h.Lines)-1].NoEOL {
		return p.errorf(p.i, "%q must follow a hunk line", protocol.Ellipsis(p.lines[p.i], 60))
	}
	h.Lines[len(h.Lines)-1].NoEOL = true
	p.i++
	return nil
}

// checkNoEOL checks that only the last line of each side of a hunk is
// marked as having no newline.
func checkNoEOL(h *Hunk) error {
	lastOld, lastNew := -1, -1
	for i, l := range h.Lines {
		if l.Kind != '+' {
			lastOld = i
		}
		if l.Kind != '-' {
			lastNew = i
		}
	}
	for i, l := range h.Lines {
		if !l.NoEOL {
			continue
		}
		if l.Kind != '+' && i != lastOld || l.Kind != '-' && i != lastNew {
			return &patchError{line: h.Line, msg: fmt.Sprintf("hunk %s: \"\\ No newline at end of file\" follows %q, which is not the last line of the file before or after the change; only the last line can lack a newline",
				h.Header(), protocol.Ellipsis(string(l.Kind)+l.Text, 60))}
		}
	}
	return nil
}

// parseHunkHeader parses "@@ -l,s +l,s @@ section"; a count left out
// is 1.
func parseHunkHeader(l string) (*Hunk, error) {
	bad := fmt.Errorf("%q is not a hunk header; write @@ -START,COUNT +START,COUNT @@", protocol.Ellipsis(l, 60))
	rest, ok := strings.CutPrefix(l, "@@ -")
	if !ok {
		return nil, bad
	}
	ranges, section, ok := strings.Cut(rest, " @@")
	if !ok {
		return nil, bad
	}
	oldR, newR, ok := strings.Cut(ranges, " +")
	if !ok {
		return nil, bad
	}
	h := &Hunk{Section: strings.TrimRight(strings.TrimPrefix(section, " "), "\r")}
	var err1, err2 error
	h.OldStart, h.OldLines, err1 = parseRange(oldR)
	h.NewStart, h.NewLines, err2 = parseRange(newR)
	if err1 != nil || err2 != nil {
		return nil, bad
	}
	if h.OldLines > 0 && h.OldStart == 0 || h.NewLines > 0 && h.NewStart == 0 {
		return nil, fmt.Errorf("hunk %s: lines are numbered from 1; only a side with no lines (count 0) starts at 0", h.Header())
	}
	return h, nil
}

func parseRange(s string) (start, count int, err error) {
	a, b, hasCount := strings.Cut(s, ",")
	count = 1
	if start, err = parseCount(a); err != nil {
		return 0, 0, err
	}
	if hasCount {
		if count, err = parseCount(b); err != nil {
			return 0, 0, err
		}
	}
	return start, count, nil
}

func parseCount(s string) (int, error) {
	if s == "" || len(s) > 10 || strings.Trim(s, "0123456789") != "" {
		return 0, errors.New("not a number")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > maxHunkCount {
		return 0, errors.New("out of range")
	}
	return n, nil
}

// checkHunks checks a section's hunks against its operation and each
// other: in order, not overlapping, a creation adds to nothing and a
// deletion leaves nothing.
func checkHunks(fp *File) error {
	end := 0
	for i := range fp.Hunks {
		h := &fp.Hunks[i]
		switch {
		case fp.Op == Create && (h.OldLines != 0 || len(fp.Hunks) > 1):
			return &patchError{line: h.Line, msg: fmt.Sprintf("%s is created (--- /dev/null), so it takes one hunk that starts @@ -0,0 +1,N @@, not %s", fp.Path, h.Header())}
		case fp.Op == Delete && h.NewLines != 0:
			return &patchError{line: h.Line, msg: fmt.Sprintf("%s is deleted (+++ /dev/null), so its hunks add nothing (+0,0), not %s", fp.Path, h.Header())}
		case h.oldIndex() < end:
			return &patchError{line: h.Line, msg: fmt.Sprintf("hunk %s of %s starts before the previous hunk ends (old line %d); hunks must be in file order and not overlap", h.Header(), fp.Path, end)}
		case i+1 < len(fp.Hunks) && slices.ContainsFunc(h.Lines, func(l HunkLine) bool { return l.NoEOL }):
			return &patchError{line: h.Line, msg: fmt.Sprintf("hunk %s of %s marks a line as the last of the file (no newline at end), but more hunks follow", h.Header(), fp.Path)}
		}
		end = h.oldIndex() + h.OldLines
	}
	return nil
}

// Format writes files as a git-style unified diff that Parse
// reads back as the same files.
func Format(files []*File) string {
	var b strings.Builder
	for _, fp := range files {
		fmt.Fprintf(&b, "diff --git %s %s\n", quoteName("a/"+fp.Path), quoteName("b/"+fp.Path))
		switch {
		case fp.Op == Create && fp.Mode != 0:
			fmt.Fprintf(&b, "new file mode 100%03o\n", fp.Mode.Perm())
		case fp.Op == Delete:
			b.WriteString("deleted file mode 100644\n")
		}
		if len(fp.Hunks) == 0 {
			continue
		}
		oldName, newName := quoteName("a/"+fp.Path), quoteName("b/"+fp.Path)
		switch fp.Op {
		case Create:
			oldName = "/dev/null"
		case Delete:
			newName = "/dev/null"
		}
		fmt.Fprintf(&b, "--- %s\n+++ %s\n", oldName, newName)
		for _, h := range fp.Hunks {
			b.WriteString(h.Header())
			if h.Section != "" {
				b.WriteString(" " + h.Section)
			}
			b.WriteByte('\n')
			for _, l := range h.Lines {
				b.WriteByte(l.Kind)
				b.WriteString(l.Text)
				b.WriteByte('\n')
				if l.NoEOL {
					b.WriteString("\\ No newline at end of file\n")
				}
			}
		}
	}
	return b.String()
}

// quoteName quotes a file name the way git does when it holds
// characters a diff header cannot carry plainly.
func quoteName(s string) string {
	if s == "" || s != strings.TrimSpace(s) || strings.ContainsAny(s, "\"\\\t\n\r") || strings.HasPrefix(s, `"`) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f {
			return strconv.Quote(s)
		}
	}
	return s
}
