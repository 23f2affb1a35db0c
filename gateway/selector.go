package gateway

import (
	"fmt"
	"strings"
)

// This file is the host selector syntax shared by access rules and the
// hosts tool's filter. It depends on nothing but the standard library, so
// it can move to the policy package unchanged.
//
//	*                    every host
//	web-*                host names matching a glob (* any run, ? one character)
//	env=staging          hosts whose label env is staging (the value may be a glob)
//	role=web,env=prod    several terms: a host must match all of them
//
// Spaces around terms, keys and values are ignored.

// maxSelectorLen bounds a selector's text.
const maxSelectorLen = 256

// Selector picks hosts by name and labels. The zero Selector matches
// nothing; parse one with ParseSelector.
type Selector struct {
	terms []selectorTerm
}

// selectorTerm is one condition: a host-name glob (key empty) or a label
// key with a value glob.
type selectorTerm struct {
	key, pattern string
}

// ParseSelector parses s. The error says which part is wrong and what is
// allowed.
func ParseSelector(s string) (Selector, error) {
	if len(s) > maxSelectorLen {
		return Selector{}, fmt.Errorf("host selector %.20q... is %d characters; at most %d are allowed", s, len(s), maxSelectorLen)
	}
	if strings.TrimSpace(s) == "" {
		return Selector{}, fmt.Errorf("host selector is empty: use * for every host, a name glob (web-*) or a label (env=staging)")
	}
	var sel Selector
	for part := range strings.SplitSeq(s, ",") {
		t, err := parseTerm(strings.TrimSpace(part))
		if err != nil {
			return Selector{}, fmt.Errorf("host selector %q: %w", s, err)
		}
		sel.terms = append(sel.terms, t)
	}
	return sel, nil
}

func parseTerm(part string) (selectorTerm, error) {
	if part == "" {
		return selectorTerm{}, fmt.Errorf("empty term between commas")
	}
	key, value, isLabel := strings.Cut(part, "=")
	if !isLabel {
		if i := strings.IndexFunc(part, func(r rune) bool { return !isHostGlobChar(r) }); i >= 0 {
			return selectorTerm{}, fmt.Errorf("host-name glob %q has %q: use letters, digits, '-', '_', '*' and '?' (or key=value for a label)", part, part[i:i+1])
		}
		return selectorTerm{pattern: part}, nil
	}
	key, value = strings.TrimSpace(key), strings.TrimSpace(value)
	switch {
	case key == "":
		return selectorTerm{}, fmt.Errorf("label term %q has no key: write key=value, e.g. env=staging", part)
	case value == "":
		return selectorTerm{}, fmt.Errorf("label term %q has no value: write key=value, or key=* for any value", part)
	case strings.ContainsAny(value, "="):
		return selectorTerm{}, fmt.Errorf("label term %q has more than one '='", part)
	}
	if i := strings.IndexFunc(key, func(r rune) bool { return !isLabelKeyChar(r) }); i >= 0 {
		return selectorTerm{}, fmt.Errorf("label key %q has %q: use letters, digits, '-', '_', '.' and '/'", key, key[i:i+1])
	}
	return selectorTerm{key: key, pattern: value}, nil
}

func isHostGlobChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '*' || r == '?'
}

func isLabelKeyChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '/'
}

// Match reports whether the host called name with labels is selected.
func (s Selector) Match(name string, labels map[string]string) bool {
	if len(s.terms) == 0 {
		return false
	}
	for _, t := range s.terms {
		if t.key == "" {
			if !Glob(t.pattern, name) {
				return false
			}
			continue
		}
		v, ok := labels[t.key]
		if !ok || !Glob(t.pattern, v) {
			return false
		}
	}
	return true
}

// All reports whether s selects every host whatever its name and labels.
func (s Selector) All() bool {
	for _, t := range s.terms {
		if t.key != "" || strings.Trim(t.pattern, "*") != "" {
			return false
		}
	}
	return len(s.terms) > 0
}

// String returns the selector in its canonical form, which ParseSelector
// reads back to the same selector.
func (s Selector) String() string {
	parts := make([]string, len(s.terms))
	for i, t := range s.terms {
		if t.key == "" {
			parts[i] = t.pattern
		} else {
			parts[i] = t.key + "=" + t.pattern
		}
	}
	return strings.Join(parts, ",")
}

// Glob reports whether s matches pattern, where '*' matches any run of
// characters (including none) and '?' exactly one; every other character
// matches itself. Unlike path.Match nothing is special about '/', and
// there are no character classes or escapes, so every pattern is valid.
func Glob(pattern, s string) bool {
	p, str := []rune(pattern), []rune(s)
	var pi, si int
	star, mark := -1, 0
	for si < len(str) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == str[si]):
			pi++
			si++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			// Let the last star absorb one more character and retry.
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}
