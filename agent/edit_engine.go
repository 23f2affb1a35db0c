package agent

import (
	"bytes"
	"context"
	"sort"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file applies many edits to a large text in about the time of a
// few passes over it, with exactly the result of applying them one after
// the other (see applyEdits).
//
// The text is kept as pieces: slices of a base text and inserted
// replacement texts. The places where every edit's old_string occurs in
// the base are found in one pass for all edits (multiMatcher, see
// edit_index.go). An edit then needs no pass over the text: its matches
// are the base matches that lie within a piece of the base still in the
// text, provided the old_string occurs nowhere across or within what
// earlier edits put in. That is known from searching the text around each
// replacement, once, as it is made, for every old_string still to come.
// When an old_string does occur there, or occurs too often to index, or
// the pieces have grown too many, the edit is applied the plain way to
// the text as it is, which becomes the new base. The text is joined once,
// at the end.
//
// Matching is against the text in lfText form, in which every "\r\n" is
// "\n". The lfText form of the text is that of its pieces joined as long
// as no piece ending in '\r' is followed by one starting with '\n'; an
// edit that would join two pieces so is applied the plain way.

// piece is a part of the text.
type piece struct {
	raw  string // as in the text
	norm string // lfText(raw)
	// base: raw is base.text[rlo:rlo+len(raw)] and norm is
	// base.norm[nlo:nlo+len(norm)]. Otherwise the piece was inserted in
	// place of the base from nlo on. Along the text, nlo only grows.
	base     bool
	rlo, nlo int
}

func (p *piece) nhi() int { return p.nlo + len(p.norm) }

// crlf reports whether the piece holds a "\r\n".
func (p *piece) crlf() bool { return len(p.raw) != len(p.norm) }

// editLimits bound what the engine may spend on its shortcuts.
type editLimits struct {
	matcher matcherLimits
	// indexed is the least number of places an index keeps, over all
	// patterns (a long text's index keeps one per 8 bytes).
	indexed int
	// scan and scanPerByte bound the cost of checking candidate places a
	// scan may spend: scan plus scanPerByte bytes per byte of text.
	scan, scanPerByte int
	// context is the most text searched on each side of a replacement
	// for the old_strings to come; longer ones are searched for around
	// every replacement as their edit comes.
	context int
	// pieces: more, and the text is joined into a new base.
	pieces int
	// windows is the least number of bytes an edit with a long
	// old_string may search around the replacements (a long text's may
	// search a quarter of its length).
	windows int
}

func defaultEditLimits() editLimits {
	return editLimits{matcher: matcherLimits{cells: 1 << 23, patterns: 4096}, indexed: 1 << 20, scan: 1 << 20, scanPerByte: 8,
		context: 4 << 10, pieces: 1 << 13, windows: 1 << 20}
}

// editEngine is a text being edited.
type editEngine struct {
	ctx context.Context
	lim editLimits
	// plain is the text while it is one string whose base and pieces are
	// not made yet (ready false).
	plain  string
	ready  bool
	base   eolDoc
	pieces []piece
	size   int // len(text)
	crlfs  int // pieces holding a "\r\n"
	idx    editIndex
	// window is reused to search around replacements.
	window []byte
}

func newEditEngine(ctx context.Context, text string, lim editLimits) *editEngine {
	e := &editEngine{ctx: ctx, lim: lim, idx: editIndex{dense: map[string]bool{}}}
	e.reset(text)
	return e
}

// reset makes text the whole text.
func (e *editEngine) reset(text string) {
	e.plain, e.ready, e.size = text, false, len(text)
	e.idx.drop()
}

// ensure makes the text the base, in one piece, if it is not yet.
func (e *editEngine) ensure() {
	if e.ready {
		return
	}
	e.base = newEOLDoc(e.plain)
	e.pieces, e.crlfs = e.pieces[:0], 0
	if e.plain != "" {
		e.pieces = append(e.pieces, piece{raw: e.plain, norm: e.base.norm, base: true})
		e.crlfs = boolInt(e.pieces[0].crlf())
	}
	e.plain, e.ready = "", true
}

// isBase reports whether the text is the base, unedited.
func (e *editEngine) isBase() bool {
	switch len(e.pieces) {
	case 0:
		return e.base.text == ""
	case 1:
		p := &e.pieces[0]
		return p.base && p.rlo == 0 && len(p.raw) == len(e.base.text)
	}
	return false
}

// text joins the pieces.
func (e *editEngine) text() string {
	switch {
	case !e.ready:
		return e.plain
	case len(e.pieces) == 1:
		return e.pieces[0].raw
	}
	var b strings.Builder
	b.Grow(e.size)
	for _, p := range e.pieces {
		b.WriteString(p.raw)
	}
	return b.String()
}

// rawAt maps a position in base.norm to the same place in base.text.
func (e *editEngine) rawAt(n int) int { return e.base.pos(n) }

// basePiece returns the piece of the base from norm position lo to hi.
func (e *editEngine) basePiece(lo, hi int) piece {
	rlo, rhi := e.rawAt(lo), e.rawAt(hi)
	return piece{raw: e.base.text[rlo:rhi], norm: e.base.norm[lo:hi], base: true, rlo: rlo, nlo: lo}
}

// editTexts returns an edit's old and new strings as they are matched:
// in lfText form, without a byte order mark when the file has one.
func editTexts(ed protocol.EditOp, bom bool) (old, new string) {
	old, new = lfText(ed.OldString), lfText(ed.NewString)
	if bom {
		old, new = strings.TrimPrefix(old, utf8BOM), strings.TrimPrefix(new, utf8BOM)
	}
	return old, new
}

// candidate is a match of old in the base within a base piece.
type candidate struct {
	piece int
	at    int // in base.norm
}

// fastMatches returns the places where old occurs in the text (no two
// overlapping, first first), from the base's matches pos; false when
// that cannot be told without a pass over the text.
func (e *editEngine) fastMatches(pos []int32, old string) ([]candidate, bool) {
	if e.idx.tainted[old] || len(old)-1 > e.idx.context && !e.aroundClear(old) {
		return nil, false
	}
	var sel []candidate
	end := -1
	for _, c32 := range pos {
		c := int(c32)
		if c < end {
			continue
		}
		i := sort.Search(len(e.pieces), func(i int) bool { return e.pieces[i].nlo > c }) - 1
		if i < 0 || !e.pieces[i].base || c+len(old) > e.pieces[i].nhi() {
			continue // not in the text as it is now
		}
		sel = append(sel, candidate{i, c})
		end = c + len(old)
	}
	return sel, true
}

// aroundClear reports whether old occurs nowhere in the text but within
// a base piece, searching around every replacement. It reports false,
// too, when finding out would cost more than a pass over the text.
func (e *editEngine) aroundClear(old string) bool {
	budget := max(e.lim.windows, len(e.base.norm)/4)
	o := []byte(old)
	for i, s := range e.sites() {
		if i&1023 == 1023 && e.ctx.Err() != nil {
			return false
		}
		win, a, b := e.around(s, len(old)-1)
		budget -= len(win)
		if budget < 0 || crosses(win, o, a, b) {
			return false
		}
	}
	return true
}

// crosses reports whether old occurs in win at a place that overlaps
// [a, b) or, when a == b, spans a.
func crosses(win, old []byte, a, b int) bool {
	for from := 0; ; {
		j := bytes.Index(win[from:], old)
		if j < 0 {
			return false
		}
		if s := from + j; newPlace(s, len(old), a, b) {
			return true
		}
		from += j + 1
	}
}

// newPlace reports whether [s, s+n) overlaps [a, b) or, when a == b,
// spans a: whether a match there is new text, not the base's.
func newPlace(s, n, a, b int) bool {
	if a == b {
		return s < a && s+n > a
	}
	return s < b && s+n > a
}

// site is a place where the text departs from the base: the inserted
// pieces [at, at+n) (n is 0 or 1), between the pieces before and after.
type site struct{ at, n int }

// sites lists every replacement in the text: each inserted piece and
// each border of two base pieces that were not next to each other.
func (e *editEngine) sites() []site {
	var ss []site
	for i := range e.pieces {
		switch {
		case !e.pieces[i].base:
			ss = append(ss, site{i, 1})
		case i > 0 && e.pieces[i-1].base:
			ss = append(ss, site{i, 0})
		}
	}
	return ss
}

// around returns the text's lfText form around site s: w bytes before
// it, the site's inserted piece, w bytes after it (fewer at the text's
// ends), and where the inserted piece is in it, [a, b).
func (e *editEngine) around(s site, w int) (win []byte, a, b int) {
	win = e.window[:0]
	left := 0
	j := s.at - 1
	for ; j >= 0 && left < w; j-- {
		left += len(e.pieces[j].norm)
	}
	for j++; j < s.at; j++ {
		n := e.pieces[j].norm
		if skip := left - w; skip > 0 {
			n, left = n[skip:], w
		}
		win = append(win, n...)
	}
	a = len(win)
	if s.n == 1 {
		win = append(win, e.pieces[s.at].norm...)
	}
	b = len(win)
	for j = s.at + s.n; j < len(e.pieces) && w > 0; j++ {
		n := e.pieces[j].norm
		n = n[:min(len(n), w)]
		win = append(win, n...)
		w -= len(n)
	}
	e.window = win
	return win, a, b
}

// crlfEnds says, for each match, whether a line break in the new text
// becomes "\r\n": whether the line of the text where the match starts
// (or, past the last line break, the last line) ends in "\r\n".
func (e *editEngine) crlfEnds(sel []candidate) []bool {
	ends := make([]bool, len(sel))
	if e.crlfs == 0 {
		return ends
	}
	// The line break found for the previous match serves the next ones
	// up to it.
	nlPiece, nlAt, none := -1, -1, false
	for k, c := range sel {
		p := &e.pieces[c.piece]
		start := e.rawAt(c.at) - p.rlo
		if !none && (c.piece > nlPiece || (c.piece == nlPiece && start > nlAt)) {
			nlPiece, nlAt = e.nextLF(c.piece, start)
			if nlPiece < 0 {
				none = true
				nlPiece, nlAt = e.lastLF()
			}
		}
		ends[k] = nlPiece >= 0 && nlAt > 0 && e.pieces[nlPiece].raw[nlAt-1] == '\r'
	}
	return ends
}

// nextLF finds the first '\n' of the text from byte at of piece i on;
// -1 when there is none.
func (e *editEngine) nextLF(i, at int) (int, int) {
	for ; i < len(e.pieces); i, at = i+1, 0 {
		if j := strings.IndexByte(e.pieces[i].raw[at:], '\n'); j >= 0 {
			return i, at + j
		}
	}
	return -1, -1
}

// lastLF finds the last '\n' of the text; -1 when there is none.
func (e *editEngine) lastLF() (int, int) {
	for i := len(e.pieces) - 1; i >= 0; i-- {
		if j := strings.LastIndexByte(e.pieces[i].raw, '\n'); j >= 0 {
			return i, j
		}
	}
	return -1, -1
}

// splice replaces the matches sel of old with new (its line breaks as
// crlf says) and returns the replacements made. It reports false,
// changing nothing, when that would put a piece ending in '\r' before
// one starting with '\n'.
func (e *editEngine) splice(sel []candidate, old, new string, crlf []bool) ([]site, bool) {
	ins := [2]piece{{raw: new, norm: lfText(new)}}
	crlfNew := strings.ReplaceAll(new, "\n", "\r\n")
	ins[1] = piece{raw: crlfNew, norm: lfText(crlfNew)}
	out := make([]piece, 0, len(e.pieces)+2*len(sel))
	sites := make([]site, 0, len(sel))
	size, crlfs := e.size, e.crlfs
	add := func(p piece) {
		out = append(out, p)
		crlfs += boolInt(p.crlf())
	}
	prev := 0
	for s := 0; s < len(sel); {
		i := sel[s].piece
		out = append(out, e.pieces[prev:i]...)
		p := e.pieces[i]
		crlfs -= boolInt(p.crlf())
		lo := p.nlo
		for ; s < len(sel) && sel[s].piece == i; s++ {
			c := sel[s].at
			if c > lo {
				add(e.basePiece(lo, c))
			}
			in := ins[boolInt(crlf[s])]
			in.nlo = c
			at := len(out)
			if in.raw != "" {
				add(in)
			}
			sites = append(sites, site{at, len(out) - at})
			size += len(in.raw) - (e.rawAt(c+len(old)) - e.rawAt(c))
			lo = c + len(old)
		}
		if lo < p.nhi() {
			add(e.basePiece(lo, p.nhi()))
		}
		prev = i + 1
	}
	out = append(out, e.pieces[prev:]...)
	for _, s := range sites {
		if joinsCRLF(out, s.at) || joinsCRLF(out, s.at+s.n) {
			return nil, false
		}
	}
	e.pieces, e.size, e.crlfs = out, size, crlfs
	return sites, true
}

// joinsCRLF reports whether piece i-1 of ps ends in '\r' and piece i
// starts with '\n'.
func joinsCRLF(ps []piece, i int) bool {
	return i > 0 && i < len(ps) && strings.HasSuffix(ps[i-1].raw, "\r") && strings.HasPrefix(ps[i].raw, "\n")
}

// replacement is the outcome of one edit: n places matched; err says
// why the edit cannot be made.
type replacement struct {
	n   int
	err error
}

// apply makes edit k of edits (old and new as editTexts returns them)
// and returns its outcome. check says whether an edit matching n places
// may be made, and why not.
func (e *editEngine) apply(edits []protocol.EditOp, k int, old, new string, bom bool, check func(n int) error) replacement {
	all := edits[k].ReplaceAll
	// The last edit of a text in one piece needs no index.
	if k < len(edits)-1 || (e.ready && !e.isBase()) {
		if len(e.pieces) > e.lim.pieces {
			e.reset(e.text())
		}
		e.ensure()
		if pos, ok := e.matches(edits, k, old, bom); ok {
			if sel, ok := e.fastMatches(pos, old); ok {
				if err := check(len(sel)); err != nil {
					return replacement{len(sel), err}
				}
				n := len(sel)
				if !all {
					sel = sel[:1]
				}
				if sites, ok := e.splice(sel, old, new, e.crlfEnds(sel)); ok {
					return replacement{n, e.taint(sites)}
				}
			}
		}
	}
	return e.applyPlain(old, new, all, check)
}

// applyPlain makes an edit with passes over the whole text, which
// becomes the new base.
func (e *editEngine) applyPlain(old, new string, all bool, check func(n int) error) replacement {
	if !e.ready || !e.isBase() {
		e.reset(e.text())
		e.ensure()
	}
	doc := e.base
	n := strings.Count(doc.norm, old)
	if err := check(n); err != nil {
		return replacement{n, err}
	}
	if err := e.ctx.Err(); err != nil {
		return replacement{n, err}
	}
	e.reset(doc.replace(old, new, all))
	return replacement{n, nil}
}
