package agent

import (
	"context"
	"errors"
)

// multiMatcher finds, in one pass over a text, every place where any of a
// set of patterns occurs (overlapping places included): an Aho-Corasick
// automaton over the first keyMax bytes of each pattern, held as a dense
// table over the byte values the patterns use, so the scan costs one
// table lookup per byte of text. A place where a pattern's first bytes
// occur is checked against the whole pattern.
type multiMatcher struct {
	pats   []string
	keyLen []int32 // bytes of each pattern in the automaton
	class  [256]uint16
	nc     int      // byte classes; class 0 is every byte no pattern uses
	delta  []uint32 // delta[s*nc+c]: the state after class c in state s
	fail   []uint32
	depth  []int32
	outs   [][]int32 // patterns whose first bytes end at each state
	// emits[s] is the nearest state on s's chain of suffix states, s
	// included, that has outs; -1 for none.
	emits []int32
}

// keyMax bounds the bytes of a pattern the automaton holds.
const keyMax = 64

// matcherLimits bound one matcher.
type matcherLimits struct {
	cells    int // of its table (4 bytes each)
	patterns int
}

// errTooManyMatches stops a scan that would cost far more than the
// text's length: the caller falls back to searching pattern by pattern.
var errTooManyMatches = errors.New("too many matches to index")

// newMultiMatcher builds a matcher for the first n of pats (non-empty,
// distinct), as many as fit lim (at least one).
func newMultiMatcher(pats []string, lim matcherLimits) (m *multiMatcher, n int) {
	var used [256]bool
	classes, states := 1, 1
	var added []byte
	for ; n < len(pats) && n < lim.patterns; n++ {
		key := pats[n][:min(len(pats[n]), keyMax)]
		added = added[:0]
		for i := 0; i < len(key); i++ {
			if !used[key[i]] {
				used[key[i]] = true
				added = append(added, key[i])
			}
		}
		if n > 0 && (states+len(key))*(classes+len(added)) > lim.cells {
			for _, c := range added {
				used[c] = false
			}
			break
		}
		classes += len(added)
		states += len(key)
	}
	m = &multiMatcher{pats: pats[:n], keyLen: make([]int32, n)}
	for b, u := range used {
		if u {
			m.nc++
			m.class[b] = uint16(m.nc)
		}
	}
	m.nc++
	m.build(states)
	return m, n
}

// build makes the automaton: the trie of the keys, then the suffix links
// and the full transition table, breadth first. A state's row holds
// only its trie edges (0 elsewhere: the root is nobody's child) until
// the state is dequeued, and every state a row is filled from is
// shallower, so dequeued before it.
func (m *multiMatcher) build(maxStates int) {
	nc := m.nc
	m.delta = make([]uint32, maxStates*nc)
	m.depth = make([]int32, 1, maxStates)
	m.outs = make([][]int32, 1, maxStates)
	for p, pat := range m.pats {
		key := pat[:min(len(pat), keyMax)]
		m.keyLen[p] = int32(len(key))
		s := uint32(0)
		for i := 0; i < len(key); i++ {
			cell := int(s)*nc + int(m.class[key[i]])
			if m.delta[cell] == 0 {
				m.delta[cell] = uint32(len(m.depth))
				m.depth = append(m.depth, m.depth[s]+1)
				m.outs = append(m.outs, nil)
			}
			s = m.delta[cell]
		}
		m.outs[s] = append(m.outs[s], int32(p))
	}
	states := len(m.depth)
	m.delta = m.delta[:states*nc]
	m.fail = make([]uint32, states)
	m.emits = make([]int32, states)
	m.emits[0] = -1
	queue := make([]uint32, 0, states)
	for c := range nc {
		if t := m.delta[c]; t != 0 {
			queue = append(queue, t) // fail: the root
		}
	}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		f := m.fail[s]
		m.emits[s] = m.emits[f]
		if len(m.outs[s]) > 0 {
			m.emits[s] = int32(s)
		}
		row, frow := m.delta[int(s)*nc:int(s+1)*nc], m.delta[int(f)*nc:int(f+1)*nc]
		for c, t := range row {
			if t != 0 {
				m.fail[t] = frow[c]
				queue = append(queue, t)
			} else {
				row[c] = frow[c]
			}
		}
	}
}

// scan reports every place in text where a pattern occurs:
// found(pattern, start), each pattern's places in increasing order,
// until found returns false. It checks ctx every MiB, and gives up with
// errTooManyMatches once checking candidate places has cost more than
// budget bytes.
func (m *multiMatcher) scan(ctx context.Context, text string, budget int, found func(p int, start int) bool) error {
	return scanFor(ctx, m, text, budget, found)
}

// scanFor is scan for text of either kind.
func scanFor[T string | []byte](ctx context.Context, m *multiMatcher, text T, budget int, found func(p int, start int) bool) error {
	nc, s := m.nc, uint32(0)
	for i := 0; i < len(text); i++ {
		if i&(1<<20-1) == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		s = m.delta[int(s)*nc+int(m.class[text[i]])]
		for e := m.emits[s]; e >= 0; e = m.emits[m.fail[e]] {
			for _, p := range m.outs[e] {
				pat, k := m.pats[p], int(m.keyLen[p])
				start := i + 1 - k
				budget -= 1 + len(pat) - k
				if start+len(pat) <= len(text) && string(text[start+k:start+len(pat)]) == pat[k:] && !found(int(p), start) {
					return nil
				}
			}
			if budget < 0 {
				return errTooManyMatches
			}
		}
	}
	return nil
}
