package unidiff

import (
	"context"
	"fmt"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file applies a parsed patch to file contents in memory. Every
// hunk must match its old lines exactly; it may be found at an offset
// from the line its header states (the nearest position, searched
// outward), never fuzzily. A file whose lines mostly end in CRLF is
// matched ignoring the CRs and keeps CRLF on the lines the patch adds;
// a UTF-8 byte-order mark is kept.

// textLine is one line of a file.
type textLine struct {
	text string // without the line ending (and, in a CRLF file, without its CR)
	end  string // "\n", "\r\n", or "" for a last line without a newline
}

// Text is a file's content as lines.
type Text struct {
	bom   bool // starts with a UTF-8 byte-order mark (not part of lines)
	crlf  bool // most line endings are CRLF
	lines []textLine
}

// SplitText splits data into lines.
func SplitText(data string) Text {
	var f Text
	if rest, ok := strings.CutPrefix(data, utf8BOM); ok {
		f.bom, data = true, rest
	}
	f.crlf = strings.Count(data, "\r\n")*2 > strings.Count(data, "\n")
	f.lines = make([]textLine, 0, strings.Count(data, "\n")+1)
	for data != "" {
		text, rest, ok := strings.Cut(data, "\n")
		l := textLine{text: text}
		if ok {
			l.end = "\n"
		}
		if f.crlf && ok && strings.HasSuffix(text, "\r") {
			l.text, l.end = text[:len(text)-1], "\r\n"
		}
		f.lines = append(f.lines, l)
		data = rest
	}
	return f
}

// String returns the file's content.
func (f *Text) String() string {
	n := len(utf8BOM)
	for _, l := range f.lines {
		n += len(l.text) + len(l.end)
	}
	var b strings.Builder
	b.Grow(n)
	if f.bom {
		b.WriteString(utf8BOM)
	}
	for _, l := range f.lines {
		b.WriteString(l.text)
		b.WriteString(l.end)
	}
	return b.String()
}

// Lines returns the number of lines of the file.
func (f *Text) Lines() int { return len(f.lines) }

// HunkResult says what became of one hunk.
type HunkResult struct {
	Hunk string `json:"hunk"`
	// Line is where the hunk's old lines start in the file before the
	// patch, from 1 (for a hunk that removes nothing: the line it
	// follows, 0 for the start).
	Line   int    `json:"line"`
	Offset int    `json:"offset"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
	// Insert: the hunk removes no lines; Line is the line it follows.
	Insert bool `json:"-"`
}

// Result is the result of applying one section to a file.
type Result struct {
	// File is the file after the section (when it did not fail).
	File Text
	// Hunks says what became of each hunk, in order.
	Hunks []HunkResult
	// Added and Removed count the lines the applied hunks add and remove.
	Added, Removed int
	// Failed: some hunk did not apply, so none was.
	Failed bool
}

// Apply applies the hunks of fp to f (the file before the
// section). It reports every hunk, and applies none when any fails.
func Apply(ctx context.Context, f Text, fp *File) Result {
	out := Result{Hunks: make([]HunkResult, len(fp.Hunks))}
	out.File = Text{bom: f.bom, crlf: f.crlf, lines: make([]textLine, 0, len(f.lines))}
	next, delta := 0, 0 // the first old line not yet copied; the last hunk's offset
	for i := range fp.Hunks {
		h := &fp.Hunks[i]
		r := &out.Hunks[i]
		r.Hunk, r.Insert = h.Header(), h.OldLines == 0
		old := oldSide(h)
		pos, reason := findHunk(ctx, &f, old, h.oldIndex()+delta, next)
		if reason != "" {
			r.Line, r.Reason = h.oldIndex()+min(1, h.OldLines), reason
			out.Failed = true
			continue
		}
		r.OK, r.Offset = true, pos-h.oldIndex()
		r.Line = pos + min(1, h.OldLines)
		delta = r.Offset
		if reason := out.copyLines(f.lines[next:pos]); reason != "" {
			r.OK, r.Reason, out.Failed = false, reason, true
		}
		if reason := out.newSide(&f, h, pos); reason != "" {
			r.OK, r.Reason, out.Failed = false, reason, true
		}
		next = pos + len(old)
	}
	if reason := out.copyLines(f.lines[next:]); reason != "" && len(fp.Hunks) > 0 {
		r := &out.Hunks[len(fp.Hunks)-1]
		if r.OK {
			r.OK, r.Reason, out.Failed = false, reason, true
		}
	}
	return out
}

// oldSide returns the lines a hunk expects in the file.
func oldSide(h *Hunk) []HunkLine {
	old := make([]HunkLine, 0, h.OldLines)
	for _, l := range h.Lines {
		if l.Kind != '+' {
			old = append(old, l)
		}
	}
	return old
}

// copyLines appends lines of the old file to the output. It fails when
// the output so far ends in a line without a newline.
func (p *Result) copyLines(lines []textLine) string {
	if len(lines) == 0 {
		return ""
	}
	if reason := p.canAppend(); reason != "" {
		return reason
	}
	p.File.lines = append(p.File.lines, lines...)
	return ""
}

// canAppend refuses a line after a line that has no newline.
func (p *Result) canAppend() string {
	if n := len(p.File.lines); n > 0 && p.File.lines[n-1].end == "" {
		return fmt.Sprintf("the patch puts more lines after line %d of the result, which has no newline at end of file; mark the last line with \"\\ No newline at end of file\" only at the end, or remove and re-add that line with a newline", n)
	}
	return ""
}

// newSide appends the hunk's new lines, matched at pos: context lines
// as the file has them, added lines with the file's line ending.
func (p *Result) newSide(f *Text, h *Hunk, pos int) string {
	k := pos
	for _, l := range h.Lines {
		var line textLine
		switch l.Kind {
		case '-':
			k++
			p.Removed++
			continue
		case ' ':
			line = f.lines[k]
			k++
		case '+':
			line = textLine{text: l.Text, end: "\n"}
			if f.crlf {
				line.text, line.end = strings.TrimSuffix(l.Text, "\r"), "\r\n"
			}
			if l.NoEOL {
				line.end = ""
			}
			if f.bom && len(p.File.lines) == 0 {
				line.text = strings.TrimPrefix(line.text, utf8BOM)
			}
			p.Added++
		}
		if reason := p.canAppend(); reason != "" {
			return reason
		}
		p.File.lines = append(p.File.lines, line)
	}
	return ""
}

// findHunk finds where old matches f: at want, else at the nearest
// position searching outward, from lo on (the end of the previous
// hunk). It refuses two matches equally near. The reason says why
// nothing matched.
func findHunk(ctx context.Context, f *Text, old []HunkLine, want, lo int) (int, string) {
	hi := len(f.lines) - len(old) // the last position old fits at
	if hi < lo {
		if hi < 0 {
			return 0, fmt.Sprintf("not found: the hunk needs %d lines of the file but the file has %d", len(old), len(f.lines))
		}
		return 0, fmt.Sprintf("not found: the hunk needs %d lines after line %d, where the previous hunk ends, but the file has %d lines", len(old), lo, len(f.lines))
	}
	// Positions out of range do not match: start the search within it.
	want = min(max(want, lo), hi)
	// work counts the lines compared: a long hunk over lines that
	// repeat costs up to its length at every position.
	work := 0
	matches := func(pos int) bool {
		k := matchAt(f, old, pos)
		if k < 0 {
			return true
		}
		work += k + 1
		return false
	}
	for d := 0; want-d >= lo || want+d <= hi; d++ {
		if work >= 1<<16 {
			if ctx.Err() != nil {
				return 0, "cancelled"
			}
			work = 0
		}
		work++
		below, above := want-d, want+d
		mb := below >= lo && below <= hi && matches(below)
		ma := d > 0 && above >= lo && above <= hi && matches(above)
		switch {
		case mb && ma:
			return 0, fmt.Sprintf("ambiguous: the hunk matches at lines %d and %d, equally far from line %d; add context lines to make it unique", below+1, above+1, want+1)
		case mb:
			return below, ""
		case ma:
			return above, ""
		}
	}
	return 0, mismatch(f, old, want)
}

// matchAt returns -1 when old matches f's lines at pos, else the index
// in old of the first line that differs.
func matchAt(f *Text, old []HunkLine, pos int) int {
	for k, l := range old {
		if !lineMatches(f, pos+k, l) {
			return k
		}
	}
	return -1
}

// lineMatches compares line i of f with a hunk line: text, ignoring a CR
// at the end in a CRLF file, and whether it ends in a newline.
func lineMatches(f *Text, i int, l HunkLine) bool {
	fl := f.lines[i]
	return fl.text == patchText(f, i, l) && (fl.end == "") == l.NoEOL
}

// patchText is a hunk line's text as it compares with line i of f.
func patchText(f *Text, i int, l HunkLine) string {
	t := l.Text
	if f.crlf {
		t = strings.TrimSuffix(t, "\r")
	}
	if f.bom && i == 0 {
		t = strings.TrimPrefix(t, utf8BOM)
	}
	return t
}

// mismatch explains why old does not match f at pos, where the hunk
// was expected.
func mismatch(f *Text, old []HunkLine, pos int) string {
	k := matchAt(f, old, pos)
	if k < 0 {
		return "not found" // cannot happen: pos was searched
	}
	l, fl := old[k], f.lines[pos+k]
	what := "context"
	if l.Kind == '-' {
		what = "removed"
	}
	var why string
	switch want := patchText(f, pos+k, l); {
	case fl.text != want:
		why = fmt.Sprintf("differs: file has %q, patch expects %q", protocol.Ellipsis(fl.text, 80), protocol.Ellipsis(want, 80))
	case fl.end == "":
		why = "has no newline at end of file; the patch expects one (mark it with \"\\ No newline at end of file\")"
	default:
		why = "ends in a newline; the patch expects none (it is marked \"\\ No newline at end of file\")"
	}
	return fmt.Sprintf("not found: placed at line %d, its %s line %d (file line %d) %s; the hunk matches nowhere else in the file", pos+1, what, k+1, pos+k+1, why)
}
