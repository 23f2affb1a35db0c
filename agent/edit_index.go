package agent

import "github.com/fleetmcp/fleetmcp/protocol"

// This file finds, for the edit engine (edit_engine.go), where the
// old_strings of the edits to come occur in the base text, and which of
// them may occur where earlier edits changed the text.

// editIndex is what the engine knows of the old_strings of the edits to
// come.
type editIndex struct {
	m *multiMatcher // the matcher of the patterns indexed; nil: none
	// pos holds where each pattern indexed occurs in the base's lfText
	// form: every place, in order.
	pos map[string][]int32
	// to: the edits before it have their patterns indexed.
	to int
	// context is the most text around each replacement searched for the
	// patterns indexed: the longest of them less one, at most
	// editLimits.context.
	context int
	// tainted holds the patterns that may occur across or within what
	// earlier edits put in: their edits are applied the plain way.
	tainted map[string]bool
	// plainTo: the edits before it are applied the plain way, their
	// patterns occurring too often to index.
	plainTo int
	// dense holds the patterns found to occur too often to index; their
	// edits are applied the plain way, without indexing again.
	dense map[string]bool
}

// drop forgets what belongs to the base: it changed.
func (x *editIndex) drop() {
	x.m, x.pos, x.tainted = nil, nil, nil
}

// matches returns where old occurs in base.norm (every place, in order),
// indexing the patterns of edits[k:] first if need be; false when the
// edit is to be applied the plain way.
func (e *editEngine) matches(edits []protocol.EditOp, k int, old string, bom bool) ([]int32, bool) {
	x := &e.idx
	if k < x.plainTo || x.dense[old] {
		return nil, false
	}
	if x.pos == nil || k >= x.to {
		if err := e.buildIndex(edits, k, bom); err != nil {
			x.drop()
			x.plainTo = x.to
			return nil, false
		}
	}
	pos, ok := x.pos[old]
	return pos, ok
}

// maxIndexed bounds the places an index keeps, over all patterns.
func (e *editEngine) maxIndexed() int { return max(e.lim.indexed, len(e.base.norm)/8) }

// buildIndex finds where the patterns of edits[k:] occur in base.norm, as
// many patterns as one matcher takes. A pattern that occurs too often is
// left out (its edit is applied the plain way). Replacements already
// made are searched for the new patterns.
func (e *editEngine) buildIndex(edits []protocol.EditOp, k int, bom bool) error {
	x := &e.idx
	var pats []string
	seen := map[string]bool{}
	ends := []int{} // ends[i]: the edits pats[:i+1] cover
	for j := k; j < len(edits); j++ {
		old, _ := editTexts(edits[j], bom)
		if old != "" && !seen[old] && !x.dense[old] {
			seen[old] = true
			pats = append(pats, old)
			ends = append(ends, j+1)
		} else if len(ends) > 0 {
			ends[len(ends)-1] = j + 1
		}
	}
	x.m, x.pos, x.to = nil, map[string][]int32{}, len(edits)
	if x.tainted == nil {
		x.tainted = map[string]bool{}
	}
	if len(pats) == 0 {
		return nil
	}
	m, n := newMultiMatcher(pats, e.lim.matcher)
	x.to = ends[n-1]
	pos := make([][]int32, n)
	dense, kept := 0, 0
	err := m.scan(e.ctx, e.base.norm, e.lim.scanPerByte*len(e.base.norm)+e.lim.scan, func(p, start int) bool {
		switch {
		case x.dense[pats[p]]:
		case kept >= e.maxIndexed():
			x.dense[pats[p]], pos[p] = true, nil
			dense++
		default:
			pos[p] = append(pos[p], int32(start))
			kept++
		}
		return dense < n // no use going on once every pattern is too frequent
	})
	if err != nil {
		return err
	}
	longest := 0
	for p := range n {
		if !x.dense[pats[p]] {
			x.pos[pats[p]] = pos[p]
		}
		longest = max(longest, len(pats[p]))
	}
	x.m, x.context = m, min(longest-1, e.lim.context)
	return e.taint(e.sites())
}

// taint searches the text around sites, replacements just made, for
// the patterns indexed, and marks those found across or within them.
func (e *editEngine) taint(sites []site) error {
	x := &e.idx
	if x.m == nil {
		return nil
	}
	for i, s := range sites {
		if i&1023 == 1023 && e.ctx.Err() != nil {
			return e.ctx.Err()
		}
		win, a, b := e.around(s, x.context)
		err := scanFor(e.ctx, x.m, win, 1<<62, func(p, start int) bool {
			if pat := x.m.pats[p]; newPlace(start, len(pat), a, b) {
				x.tainted[pat] = true
			}
			return true
		})
		if err != nil {
			return err
		}
	}
	return nil
}
