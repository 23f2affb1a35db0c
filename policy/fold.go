package policy

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

//go:generate sh -c "perl testdata/gen_unicode_tables.pl > unicode_tables.go && gofmt -w unicode_tables.go"

// On a file system that compares names without regard to case and
// Unicode normalization, as macOS's default one (APFS) does, /Users/u/.SSH
// is /Users/u/.ssh, and so are ".\u017Fsh" (a long s), the names of
// ".ssh" written with a Kelvin sign for a K (".\u212Aube" is ".kube"),
// and "é" written as one code point or as "e" and a combining accent.
// Env.FoldCase makes path rules compare names the way such a file system
// does: both the patterns and the paths are taken to their canonical
// caseless form, NFD(casefold(NFD(s))) of the Unicode standard (full case
// folding, canonical decomposition and ordering of combining marks).
// Windows paths have their own comparison (winpath.go).

// runeString maps a rune to a string (a decomposition, a folding).
type runeString struct {
	r rune
	s string
}

// runeClass is a rune's canonical combining class.
type runeClass struct {
	r rune
	c uint8
}

// FoldName returns the form in which a file system that ignores case and
// Unicode normalization (macOS's APFS) compares name, a path or a part of
// one: two names are the same file there when their FoldName is the
// same. The agent compares its own paths with it on such systems, as the
// path rules do under Env.FoldCase.
func FoldName(name string) string {
	if isASCII(name) || !utf8.ValidString(name) {
		// APFS takes no name that is not UTF-8: one that is not can only
		// match itself, whatever is done to its ASCII letters.
		return asciiFold(name)
	}
	return canonicalOrder(decompose(caseFold(canonicalOrder(decompose(name)))))
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// asciiFold is FoldName for text in ASCII: its letters in upper case (the
// first of each rune's case orbit, as caseFold has it). Other bytes stay
// as they are.
func asciiFold(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// decompose returns s, valid UTF-8, with every rune replaced by its full
// canonical decomposition.
func decompose(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		if d, ok := hangulDecomposition(r); ok {
			b.WriteString(d)
			continue
		}
		if j, ok := slices.BinarySearchFunc(canonicalDecompositions, r, func(e runeString, r rune) int { return int(e.r - r) }); ok {
			b.WriteString(canonicalDecompositions[j].s)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// hangulDecomposition decomposes a precomposed Hangul syllable into its
// leading consonant, vowel and trailing consonant, by the Unicode rule.
func hangulDecomposition(r rune) (string, bool) {
	const (
		sBase, lBase, vBase, tBase = 0xAC00, 0x1100, 0x1161, 0x11A7
		vCount, tCount             = 21, 28
		sCount                     = 19 * vCount * tCount
	)
	s := r - sBase
	if s < 0 || s >= sCount {
		return "", false
	}
	l, v, t := lBase+s/(vCount*tCount), vBase+(s%(vCount*tCount))/tCount, tBase+s%tCount
	if t == tBase {
		return string([]rune{l, v}), true
	}
	return string([]rune{l, v, t}), true
}

// caseFold folds the case of every rune of s: a rune with a full folding
// to several runes (ß to ss) takes it, and every rune then becomes the
// first of its orbit under unicode.SimpleFold (k, K and the Kelvin sign
// are one letter; so are s, S and the long s).
func caseFold(s string) string {
	var b strings.Builder
	for _, r := range s {
		if j, ok := slices.BinarySearchFunc(fullCaseFoldings, r, func(e runeString, r rune) int { return int(e.r - r) }); ok {
			for _, f := range fullCaseFoldings[j].s {
				b.WriteRune(simpleFold(f))
			}
			continue
		}
		b.WriteRune(simpleFold(r))
	}
	return b.String()
}

// simpleFold returns the smallest rune of r's case orbit.
func simpleFold(r rune) rune {
	least := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		least = min(least, f)
	}
	return least
}

// canonicalOrder sorts every run of combining marks of s by their
// canonical combining class, keeping the order of marks of one class.
func canonicalOrder(s string) string {
	rs := []rune(s)
	sorted := false
	for i := 0; i < len(rs); {
		if combiningClass(rs[i]) == 0 {
			i++
			continue
		}
		j := i
		for j < len(rs) && combiningClass(rs[j]) != 0 {
			j++
		}
		if j-i > 1 {
			slices.SortStableFunc(rs[i:j], func(a, b rune) int { return int(combiningClass(a)) - int(combiningClass(b)) })
			sorted = true
		}
		i = j
	}
	if !sorted {
		return s
	}
	return string(rs)
}

// combiningClass returns r's canonical combining class.
func combiningClass(r rune) uint8 {
	if r < 0x300 {
		return 0
	}
	if j, ok := slices.BinarySearchFunc(combiningClasses, r, func(e runeClass, r rune) int { return int(e.r - r) }); ok {
		return combiningClasses[j].c
	}
	return 0
}
