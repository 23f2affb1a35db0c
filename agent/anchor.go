package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A read by anchor shows the lines around the one place where a given
// text occurs, found in the same single pass that counts the lines and
// hashes the file, with bounded memory: a file of any size can be
// searched.

// Limits of anchored reads.
const (
	defaultAnchorContext = protocol.ReadAnchorContext
	maxAnchorContext     = protocol.ReadMaxAnchorContext
	maxAnchorBytes       = protocol.ReadMaxAnchorBytes
	maxAnchorLines       = protocol.ReadMaxAnchorLines
	// anchorMatchesListed is how many match lines an ambiguous anchor's
	// failure names.
	anchorMatchesListed = 5
)

// anchorArgs are the read arguments that select lines by their content.
type anchorArgs struct {
	// Anchor is a literal text that must occur exactly once in the file;
	// it may span lines.
	Anchor string
	// Context is how many lines before and after the anchor to show;
	// nil means defaultAnchorContext.
	Context *int
}

// check validates the anchor arguments given together with offset and
// limit.
func (a anchorArgs) check(tc *toolCall, offset, limit int) *protocol.Result {
	if a.Anchor == "" {
		if a.Context != nil {
			return toolFailure(tc, "context applies to reads by anchor only; give anchor too, or use offset and limit")
		}
		return nil
	}
	switch {
	case offset != 0:
		return toolFailure(tc, "anchor and offset cannot be combined: the anchor decides which lines are shown; leave out offset (context sets how many lines around the anchor)")
	case limit != 0:
		return toolFailure(tc, "anchor and limit cannot be combined: the anchor decides which lines are shown; leave out limit (context sets how many lines around the anchor)")
	case len(a.Anchor) > maxAnchorBytes:
		return toolFailure(tc, "anchor is %d bytes, more than %d; give a short piece of text that occurs once in the file", len(a.Anchor), maxAnchorBytes)
	case strings.Count(a.Anchor, "\n") >= maxAnchorLines:
		return toolFailure(tc, "anchor spans %d lines, more than %d; give a short piece of text that occurs once in the file", strings.Count(a.Anchor, "\n")+1, maxAnchorLines)
	case a.Context != nil && *a.Context < 0:
		return toolFailure(tc, "context %d is negative; give the number of lines to show before and after the anchor (default %d)", *a.Context, defaultAnchorContext)
	case a.Context != nil && *a.Context > maxAnchorContext:
		return toolFailure(tc, "context %d is more than %d lines; give at most %d, or read on with offset", *a.Context, maxAnchorContext, maxAnchorContext)
	}
	return nil
}

// around is the number of context lines.
func (a anchorArgs) around() int {
	if a.Context == nil {
		return defaultAnchorContext
	}
	return *a.Context
}

// readAnchored answers a read by anchor of the text in br, the file at
// path. The text shown is exactly what offset and limit would show for
// the same lines.
func readAnchored(ctx context.Context, tc *toolCall, path string, br *bufio.Reader, a anchorArgs) *protocol.Result {
	around := a.around()
	scan, found, err := scanAnchor(ctx, br, a.Anchor, around)
	if r := scanFailure(ctx, tc, path, err); r != nil {
		return r
	}
	if found.count != 1 {
		return anchorFailure(tc, path, scan, found)
	}
	limit := found.end + around - found.first + 1
	return readResult(tc, path, scan, readText(path, scan, found.first, limit),
		readInfo{AnchorLine: found.start, StartLine: found.first})
}

// anchorFailure is the result for an anchor that does not occur exactly
// once.
func anchorFailure(tc *toolCall, path string, scan lineScan, found anchorFound) *protocol.Result {
	var r *protocol.Result
	if found.count == 0 {
		r = toolFailure(tc, "anchor not found in %s (0 matches in %d lines); the anchor must be exact text from the file, including spaces and indentation", path, scan.total)
	} else {
		lines := make([]string, len(found.lines))
		for i, l := range found.lines {
			lines[i] = fmt.Sprint(l)
		}
		more := ""
		if found.moreLines {
			more = ", ..."
		}
		r = toolFailure(tc, "anchor matches %d times in %s (at lines %s%s); give a longer anchor that occurs once", found.count, path, strings.Join(lines, ", "), more)
	}
	r.Structured, _ = json.Marshal(map[string]any{
		"path": path, "sha256": scan.sum, "total_lines": scan.total, "matches": found.count, "match_lines": append([]int{}, found.lines...),
	})
	return r
}

// anchorFound is what scanAnchor learns about the anchor's occurrences.
type anchorFound struct {
	count int   // occurrences; overlapping ones count separately
	lines []int // the first anchorMatchesListed lines occurrences start on
	// moreLines reports occurrences that start on other lines.
	moreLines bool
	// For the first occurrence: the lines it starts and ends on, and the
	// first line of the window around it.
	start, end, first int
}

// scanAnchor reads r to the end, counting its lines, hashing it and
// finding anchor. For the first occurrence it keeps the window of lines
// around it (around lines before and after, within the output limits)
// the way scanLines keeps the lines it selects.
//
// The lines before an occurrence are shown only as far as they take at
// most half the byte limit, so that the anchor itself is in view.
func scanAnchor(ctx context.Context, r *bufio.Reader, anchor string, around int) (lineScan, anchorFound, error) {
	s := lineScan{whole: true}
	var found anchorFound
	m := newAnchorMatcher(anchor)
	ring := newLineRing(around + m.spans())
	lastLine := 0 // the last selected line once the window is known
	m.found = func(start, end int) {
		found.count++
		switch {
		case len(found.lines) > 0 && found.lines[len(found.lines)-1] == start:
		case len(found.lines) < anchorMatchesListed:
			found.lines = append(found.lines, start)
		default:
			found.moreLines = true
		}
		if found.count > 1 {
			return
		}
		found.start, found.end = start, end
		found.first = ring.window(&s, max(start-around, 1), start, truncMaxBytes/2)
		lastLine = end + around
	}
	var err error
	s.total, s.sum, err = scanText(ctx, r, func(chunk []byte, line int, start bool) {
		switch {
		case found.count == 0:
			ring.add(chunk, start)
		case line <= lastLine:
			s.collect(chunk)
			if line == found.first && !start {
				s.firstLen += lineLen(chunk)
			}
		}
		m.feed(chunk, line, start)
	})
	m.finish()
	return s, found, err
}

// anchorMatcher finds every occurrence of a text in a stream of line
// pieces (see scanText), overlapping ones included, and reports the lines
// each starts and ends on. It copies bytes only for lines that come in
// several pieces.
//
// Line endings match as edit matches them: the text and the anchor are
// compared with one '\r' before each '\n' removed, so an anchor copied
// from a CRLF file with or without its carriage returns matches.
type anchorMatcher struct {
	// segs is the anchor split at '\n': an occurrence ends a line with
	// segs[0], fills the next lines with segs[1:k], and starts the line
	// after those with segs[k].
	segs  [][]byte
	keep  int // bytes of a line's end that decide segs[:k]: the longest plus a line break
	found func(start, end int)

	line    int    // the current line
	n       int    // bytes of the current line so far
	ended   bool   // the current line's '\n' was seen
	carry   []byte // for a line in several pieces: its last bytes
	heldCR  bool   // one-line anchor: the piece before ended with '\r', not yet in carry
	prefix  []byte // for a line in several pieces: its first bytes
	cands   []int  // start lines of occurrences matched up to the end of the previous line
	waiting int    // start line of an occurrence that needs only segs[k] at the start of this line; 0 if none
}

func newAnchorMatcher(anchor string) *anchorMatcher {
	m := &anchorMatcher{}
	for _, seg := range strings.Split(lfText(anchor), "\n") {
		m.segs = append(m.segs, []byte(seg))
	}
	for _, seg := range m.segs[:len(m.segs)-1] {
		m.keep = max(m.keep, len(seg)+2)
	}
	return m
}

// spans returns how many line breaks the anchor has.
func (m *anchorMatcher) spans() int { return len(m.segs) - 1 }

// feed takes the next piece of line line; start reports whether it is the
// line's first.
func (m *anchorMatcher) feed(chunk []byte, line int, start bool) {
	if start {
		m.line, m.n, m.carry, m.heldCR, m.prefix = line, 0, m.carry[:0], false, m.prefix[:0]
	}
	m.n += len(chunk)
	m.ended = chunk[len(chunk)-1] == '\n'
	if m.spans() == 0 {
		m.within(chunk, start)
		return
	}
	if m.waiting != 0 {
		m.startsWith(chunk, start)
	}
	if !m.ended {
		m.keepEnd(chunk, start)
		return
	}
	end := chunk
	if !start {
		end = m.keepEnd(chunk, start)
	}
	m.endLine(content(end), m.n-len(end)+len(content(end)))
}

// content strips the line break from the end of a line: '\n' and one
// '\r' before it.
func content(line []byte) []byte {
	line = bytes.TrimSuffix(line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r"))
}

// within finds a one-line anchor in a piece of the current line.
func (m *anchorMatcher) within(chunk []byte, start bool) {
	anchor := m.segs[0]
	piece := chunk
	if m.ended {
		piece = content(piece)
	}
	// A '\r' at the end of a piece is text unless the line break follows.
	held := !m.ended && piece[len(piece)-1] == '\r'
	if held {
		piece = piece[:len(piece)-1]
	}
	hay, inCarry := piece, false
	if !start && (len(m.carry) > 0 || m.heldCR) {
		if m.heldCR && chunk[0] != '\n' {
			m.carry = append(m.carry, '\r')
		}
		m.carry = append(m.carry, piece...)
		hay, inCarry = m.carry, true
	}
	m.heldCR = held
	m.count(hay)
	if m.ended {
		return
	}
	// Keep what may begin an occurrence that ends in the next piece.
	tail := hay[len(hay)-min(len(anchor)-1, len(hay)):]
	if inCarry {
		m.carry = m.carry[:copy(m.carry, tail)]
	} else {
		m.carry = append(m.carry[:0], tail...)
	}
}

// count reports each occurrence of a one-line anchor in hay, a part of
// the current line that holds less than the anchor before the part not
// searched yet.
func (m *anchorMatcher) count(hay []byte) {
	for i := 0; ; {
		j := bytes.Index(hay[i:], m.segs[0])
		if j < 0 {
			return
		}
		m.found(m.line, m.line)
		i += j + 1
	}
}

// keepEnd adds chunk to the end of the current line kept in carry, at
// most m.keep bytes, and returns that end.
func (m *anchorMatcher) keepEnd(chunk []byte, start bool) []byte {
	if start || len(chunk) >= m.keep {
		m.carry = m.carry[:0]
	}
	m.carry = append(m.carry, chunk[max(len(chunk)-m.keep, 0):]...)
	if len(m.carry) > m.keep {
		m.carry = m.carry[:copy(m.carry, m.carry[len(m.carry)-m.keep:])]
	}
	return m.carry
}

// startsWith decides, as soon as it can, whether the current line starts
// with the anchor's last segment, which completes the waiting occurrence.
func (m *anchorMatcher) startsWith(chunk []byte, start bool) {
	last := m.segs[len(m.segs)-1]
	// Two bytes more than the segment: then the line break, if any, lies
	// beyond it.
	need := len(last) + 2
	head := chunk
	if !start || len(chunk) < need {
		m.prefix = append(m.prefix, chunk[:min(max(need-len(m.prefix), 0), len(chunk))]...)
		head = m.prefix
	}
	switch {
	case len(head) >= need:
	case m.ended:
		head = content(head)
	default:
		return
	}
	if bytes.HasPrefix(head, last) {
		m.found(m.waiting, m.line)
	}
	m.waiting = 0
}

// endLine advances the occurrences in progress at the end of the current
// line, of which end is the end (without the line break) and size the
// length.
func (m *anchorMatcher) endLine(end []byte, size int) {
	k := m.spans()
	kept := m.cands[:0]
	for _, start := range m.cands {
		seg := m.segs[m.line-start]
		if size != len(seg) || !bytes.HasSuffix(end, seg) {
			continue
		}
		if m.line-start == k-1 {
			m.complete(start)
		} else {
			kept = append(kept, start)
		}
	}
	m.cands = kept
	if bytes.HasSuffix(end, m.segs[0]) {
		if k == 1 {
			m.complete(m.line)
		} else {
			m.cands = append(m.cands, m.line)
		}
	}
}

// complete takes an occurrence starting on line start whose lines up to
// the current one are matched: it ends here, or needs the last segment at
// the start of the next line.
func (m *anchorMatcher) complete(start int) {
	if len(m.segs[len(m.segs)-1]) == 0 {
		m.found(start, m.line)
		return
	}
	m.waiting = start
}

// finish ends the stream, which may end in the middle of a line.
func (m *anchorMatcher) finish() {
	if m.n == 0 || m.ended {
		return
	}
	if m.spans() == 0 && m.heldCR {
		m.count(append(m.carry, '\r'))
	}
	if m.waiting != 0 && bytes.HasPrefix(m.prefix, m.segs[len(m.segs)-1]) {
		m.found(m.waiting, m.line)
	}
}

// lineRing keeps the last lines of a stream, so that the lines before an
// occurrence can be shown once it is found: at most maxLines lines before
// the current one, those within budget bytes (dropping the oldest), each
// cut to lineBytes.
type lineRing struct {
	maxLines, budget, lineBytes int

	buf   []byte
	lines []ringLine // lines[head:] are kept, oldest first; the last is the current line
	head  int
	first int // number of lines[head]
	bytes int // bytes kept
}

// newLineRing returns the ring for a window of up to maxLines lines
// before the current one. Its budget holds the lines before an anchor
// that are shown (half the byte limit) as well as an anchor's lines
// before the current one up to the byte limit, so that dropping the
// oldest lines never drops one that would be shown.
func newLineRing(maxLines int) *lineRing {
	return &lineRing{maxLines: maxLines, budget: truncMaxBytes/2 + truncMaxBytes + 1, lineBytes: truncMaxBytes + 1}
}

type ringLine struct {
	off, n int   // where its bytes are in buf
	full   int64 // its length so far, without '\n'
	ended  bool  // its '\n' was seen
}

// add appends chunk, a piece of the current line or, when start, the
// first piece of the next line.
func (g *lineRing) add(chunk []byte, start bool) {
	if start || len(g.lines) == g.head {
		if len(g.lines) == g.head {
			g.first++ // the first line is 1
		}
		g.lines = append(g.lines, ringLine{off: len(g.buf)})
	}
	l := &g.lines[len(g.lines)-1]
	take := min(g.lineBytes-l.n, len(chunk))
	g.buf = append(g.buf, chunk[:take]...)
	l.n += take
	l.full += lineLen(chunk)
	l.ended = chunk[len(chunk)-1] == '\n'
	g.bytes += take
	for live := len(g.lines) - g.head; live > 1 && (live-1 > g.maxLines || g.bytes-l.n > g.budget); live-- {
		g.bytes -= g.lines[g.head].n
		g.head++
		g.first++
	}
	g.compact()
}

// compact drops the space of lines no longer kept once it is most of
// the buffers.
func (g *lineRing) compact() {
	if g.head > 64 && g.head*2 > len(g.lines) {
		g.lines = g.lines[:copy(g.lines, g.lines[g.head:])]
		g.head = 0
	}
	if off := g.lines[g.head].off; off > 64<<10 && off*2 > len(g.buf) {
		g.buf = g.buf[:copy(g.buf, g.buf[off:])]
		for i := g.head; i < len(g.lines); i++ {
			g.lines[i].off -= off
		}
	}
}

// window fills s with the kept lines from line from (or the oldest kept,
// if later) to the current one, as scanLines would have collected them,
// and returns the number of the first line in it. Lines before line
// anchor are left out from the front while they take more than
// maxBefore bytes.
func (g *lineRing) window(s *lineScan, from, anchor, maxBefore int) int {
	i := g.head + max(from-g.first, 0)
	before := 0
	for j := i; j < len(g.lines) && g.first+j-g.head < anchor; j++ {
		before += g.lines[j].n
	}
	for ; before > maxBefore && g.first+i-g.head < anchor; i++ {
		before -= g.lines[i].n
	}
	s.firstLen = g.lines[i].full
	for _, l := range g.lines[i:] {
		s.window = append(s.window, g.buf[l.off:l.off+l.n]...)
		kept := l.full // all of it: the line and its '\n'
		if l.ended {
			kept++
		}
		if int64(l.n) < kept {
			s.whole = false
			break
		}
		if l.ended {
			s.windowLines++
		}
	}
	return g.first + i - g.head
}

// lfText returns s with one '\r' removed before each '\n': the form in
// which edit and read's anchor compare text, so that "\n" in what a
// caller gives matches a "\r\n" line ending.
func lfText(s string) string {
	if !strings.Contains(s, "\r\n") {
		return s
	}
	return strings.ReplaceAll(s, "\r\n", "\n")
}
