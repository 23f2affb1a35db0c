//go:build unix

package agent

import (
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// naiveMatches lists every place pat occurs in text, overlapping ones
// included.
func naiveMatches(text, pat string) []int {
	var at []int
	for i := 0; i+len(pat) <= len(text); i++ {
		if text[i:i+len(pat)] == pat {
			at = append(at, i)
		}
	}
	return at
}

// checkMatcher compares what the matchers for pats find in text (in as
// many matchers as lim needs) with naiveMatches.
func checkMatcher(t *testing.T, text string, pats []string, lim matcherLimits) {
	t.Helper()
	for rest := pats; len(rest) > 0; {
		m, n := newMultiMatcher(rest, lim)
		if n < 1 {
			t.Fatalf("matcher took no pattern of %q", rest)
		}
		got := make([][]int, n)
		err := m.scan(context.Background(), text, 1<<30, func(p, start int) bool {
			got[p] = append(got[p], start)
			return true
		})
		if err != nil {
			t.Fatal(err)
		}
		for p := range n {
			if !slices.IsSorted(got[p]) {
				t.Fatalf("places of %q reported out of order: %v", rest[p], got[p])
			}
			if want := naiveMatches(text, rest[p]); !slices.Equal(got[p], want) {
				t.Fatalf("pattern %q in %q: found at %v, want %v", rest[p], text, got[p], want)
			}
		}
		rest = rest[n:]
	}
}

// TestMultiMatcher compares the matcher with a plain search on random
// texts and patterns: overlapping, nested, sharing prefixes, longer than
// the automaton's keys.
func TestMultiMatcher(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		alphabet := "ab\r\n"[:1+r.IntN(4)]
		var b strings.Builder
		for range r.IntN(300) {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		text := b.String()
		seen := map[string]bool{}
		var pats []string
		for range 1 + r.IntN(12) {
			var p string
			if len(text) > 0 && r.IntN(4) > 0 {
				i := r.IntN(len(text))
				p = text[i:min(len(text), i+1+r.IntN(150))]
			} else {
				p = strings.Repeat("a", 1+r.IntN(70))
			}
			if !seen[p] {
				seen[p] = true
				pats = append(pats, p)
			}
		}
		lim := matcherLimits{cells: 1 << 23, patterns: 4096}
		if r.IntN(2) == 0 {
			lim = matcherLimits{cells: 1 + r.IntN(200), patterns: 1 + r.IntN(4)}
		}
		checkMatcher(t, text, pats, lim)
	}
}

// TestMultiMatcherCancel: a scan stops when its context is cancelled.
func TestMultiMatcherCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m, _ := newMultiMatcher([]string{"x"}, matcherLimits{cells: 1 << 10, patterns: 1})
	if err := m.scan(ctx, strings.Repeat("x", 3<<20), 1<<30, func(int, int) bool { return true }); err != context.Canceled {
		t.Errorf("scan of a cancelled call = %v", err)
	}
}
