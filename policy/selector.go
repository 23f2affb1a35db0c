package policy

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is the host selector syntax: one way to name a set of hosts,
// used by the gateway's access rules, the hosts filter and fan-out. It is
// in the spirit of Kubernetes label selectors, with globs for values and a
// bare word for host names:
//
//	*                      every host
//	web-*                  hosts whose name matches a glob (* any run, ? one character)
//	env=staging            hosts with label env matching a glob (env=* : the label is set)
//	env!=prod              hosts whose env label does not match, or that have none (env!=* : not set)
//	region in (eu,us-*)    hosts whose region label matches one of the globs
//	region notin (eu,us)   hosts whose region label matches none of them, or that have none
//	role=web,env!=prod     several terms joined by ',': a host must match all of them
//
// Spaces around terms, operators and list items are ignored; commas
// inside parentheses separate list items, not terms. Host-name globs use
// the characters of host names (letters, digits, '-', '_') plus '*' and
// '?'; label keys and values are those of protocol's label grammar
// (protocol.IsLabelKeyRune, protocol.IsLabelValueRune), values with the
// glob characters '*' and '?' besides.

// MaxSelectorLen bounds a selector: at most this many characters, spaces
// not counted (a text with more than four times as many bytes, spaces
// included, is refused outright).
const MaxSelectorLen = 1024

// selectorForms says what a term may be, for error messages.
const selectorForms = "a term is a host-name glob (web-*), key=value, key!=value, key in (v1,v2) or key notin (v1,v2); terms are joined by ','"

// Selector picks hosts by name and labels. The zero Selector matches
// nothing; parse one with ParseSelector. A Selector is immutable and safe
// for concurrent use.
type Selector struct {
	terms []selTerm
}

// selOp is what a term tests.
type selOp uint8

const (
	opName  selOp = iota // the host name matches values[0]
	opEq                 // label key is set and matches values[0]
	opNe                 // label key is unset or does not match values[0]
	opIn                 // label key is set and matches one of values
	opNotIn              // label key is unset or matches none of values
)

// selTerm is one condition of a Selector. Every value is a glob.
type selTerm struct {
	op     selOp
	key    string // label key; empty for opName
	values []string
}

// SelectorError is a selector that does not parse. Pos is the 1-based
// column (in characters) of the problem.
type SelectorError struct {
	Selector string
	Pos      int
	Msg      string
}

func (e *SelectorError) Error() string {
	if e.Pos == 0 {
		return fmt.Sprintf("host selector %q: %s", e.Selector, e.Msg)
	}
	return fmt.Sprintf("host selector %q: at column %d: %s", e.Selector, e.Pos, e.Msg)
}

// ParseSelector parses s. The error, a *SelectorError, says where s goes
// wrong and what is allowed there.
func ParseSelector(s string) (Selector, error) {
	if n := nonSpaceLen(s); n > MaxSelectorLen || len(s) > 4*MaxSelectorLen {
		return Selector{}, fmt.Errorf("host selector %.20q... is %d characters long (%d without spaces); at most %d are allowed, spaces not counted",
			s, len(s), n, MaxSelectorLen)
	}
	if !utf8.ValidString(s) {
		return Selector{}, &SelectorError{Selector: s, Msg: "not valid UTF-8"}
	}
	if strings.TrimSpace(s) == "" {
		return Selector{}, &SelectorError{Selector: s, Msg: "empty: use * for every host, a name glob (web-*) or a label match (env=staging)"}
	}
	p := selParser{s: s}
	var sel Selector
	for {
		t, err := p.term()
		if err != nil {
			return Selector{}, err
		}
		sel.terms = append(sel.terms, t)
		p.space()
		if p.eof() {
			return sel, nil
		}
		if p.s[p.pos] != ',' {
			return Selector{}, p.errorf(p.pos, "unexpected %s: %s", p.describe(p.pos), selectorForms)
		}
		p.pos++
	}
}

func nonSpaceLen(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if !isSelSpace(s[i]) {
			n++
		}
	}
	return n
}

// selParser reads a selector left to right; pos is a byte offset.
type selParser struct {
	s   string
	pos int
}

func (p *selParser) eof() bool { return p.pos >= len(p.s) }

func (p *selParser) space() {
	for !p.eof() && isSelSpace(p.s[p.pos]) {
		p.pos++
	}
}

func isSelSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// isSelDelim reports the bytes that end a word.
func isSelDelim(b byte) bool {
	return isSelSpace(b) || b == ',' || b == '=' || b == '!' || b == '(' || b == ')'
}

// word reads a run of non-delimiters and returns it with its offset.
func (p *selParser) word() (string, int) {
	start := p.pos
	for !p.eof() && !isSelDelim(p.s[p.pos]) {
		p.pos++
	}
	return p.s[start:p.pos], start
}

// errorf builds an error at byte offset at.
func (p *selParser) errorf(at int, format string, args ...any) error {
	return &SelectorError{Selector: p.s, Pos: utf8.RuneCountInString(p.s[:at]) + 1, Msg: fmt.Sprintf(format, args...)}
}

// describe names what stands at byte offset at, for messages.
func (p *selParser) describe(at int) string {
	if at >= len(p.s) {
		return "end of selector"
	}
	rest := p.s[at:]
	if isSelDelim(rest[0]) && !isSelSpace(rest[0]) {
		return fmt.Sprintf("'%c'", rest[0])
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < utf8.RuneSelf && isSelDelim(byte(r)) })
	if end < 0 {
		end = len(rest)
	}
	return fmt.Sprintf("%q", rest[:end])
}

// term reads one term.
func (p *selParser) term() (selTerm, error) {
	p.space()
	w, at := p.word()
	after := p.pos
	p.space()
	next := byte(0)
	if !p.eof() {
		next = p.s[p.pos]
	}
	switch {
	case w == "" && (next == ',' || next == 0):
		return selTerm{}, p.errorf(at, "empty term: remove the extra ',' or put a term there (%s)", selectorForms)
	case w == "" && next == '!' && !strings.HasPrefix(p.s[p.pos:], "!="):
		return selTerm{}, p.errorf(p.pos, "'!' must follow a label key: write key!=value, or key!=* for hosts without the label")
	case w == "" && (next == '=' || next == '!'):
		return selTerm{}, p.errorf(at, "label match without a key: write key=value, e.g. env=staging")
	case w == "":
		return selTerm{}, p.errorf(p.pos, "unexpected %s: %s", p.describe(p.pos), selectorForms)
	case next == ',' || next == 0:
		return p.nameTerm(w, at)
	case next == '=' || next == '!':
		if err := p.checkKey(w, at); err != nil {
			return selTerm{}, err
		}
		return p.compare(w)
	}
	p.pos = after
	p.space()
	opWord, opAt := p.word()
	switch opWord {
	case "in", "notin":
		if err := p.checkKey(w, at); err != nil {
			return selTerm{}, err
		}
		values, err := p.list(w, opWord)
		if err != nil {
			return selTerm{}, err
		}
		op := opIn
		if opWord == "notin" {
			op = opNotIn
		}
		return selTerm{op: op, key: w, values: values}, nil
	case "":
		return selTerm{}, p.errorf(opAt, "unexpected %s after %q: %s", p.describe(opAt), w, selectorForms)
	}
	return selTerm{}, p.errorf(opAt, "unexpected %q after %q: %s", opWord, w, selectorForms)
}

func (p *selParser) nameTerm(w string, at int) (selTerm, error) {
	for i, r := range w {
		if !isHostGlobChar(r) {
			return selTerm{}, p.errorf(at+i, "host-name glob %q has %q: use letters, digits, '-', '_', '*' and '?' (or key=value for a label)", w, string(r))
		}
	}
	return selTerm{op: opName, values: []string{w}}, nil
}

func (p *selParser) checkKey(key string, at int) error {
	for i, r := range key {
		if !protocol.IsLabelKeyRune(r) {
			return p.errorf(at+i, "label key %q has %q: use letters, digits, '-', '_', '.' and '/'", key, string(r))
		}
	}
	return nil
}

// compare reads the operator and value of key=value or key!=value; pos is
// at the operator.
func (p *selParser) compare(key string) (selTerm, error) {
	opAt := p.pos
	op := opEq
	if p.s[p.pos] == '!' {
		if p.pos+1 >= len(p.s) || p.s[p.pos+1] != '=' {
			return selTerm{}, p.errorf(opAt, "'!' must be followed by '=': write %s!=value", key)
		}
		op = opNe
		p.pos++
	}
	p.pos++ // '='
	if !p.eof() && p.s[p.pos] == '=' {
		return selTerm{}, p.errorf(p.pos, "'==' is not an operator: write %s=value (or %s!=value)", key, key)
	}
	p.space()
	v, vat := p.word()
	if v == "" {
		if p.eof() || p.s[p.pos] == ',' {
			return selTerm{}, p.errorf(vat, "label %q has no value: write %s=value, or %s=* for any value", key, key, key)
		}
		return selTerm{}, p.errorf(vat, "unexpected %s where the value of %q belongs: label values cannot contain spaces or any of , = ! ( )", p.describe(vat), key)
	}
	if err := p.checkValue(v, vat); err != nil {
		return selTerm{}, err
	}
	p.space()
	if !p.eof() && p.s[p.pos] != ',' {
		return selTerm{}, p.errorf(p.pos, "unexpected %s after the value %q: label values cannot contain spaces or any of , = ! ( ); terms are joined by ','", p.describe(p.pos), v)
	}
	return selTerm{op: op, key: key, values: []string{v}}, nil
}

// list reads "(v1, v2, ...)" after key in / key notin.
func (p *selParser) list(key, op string) ([]string, error) {
	p.space()
	if p.eof() || p.s[p.pos] != '(' {
		return nil, p.errorf(p.pos, "expected '(' after %q, found %s: write %s %s (v1,v2)", op, p.describe(p.pos), key, op)
	}
	open := p.pos
	p.pos++
	var values []string
	for {
		p.space()
		v, vat := p.word()
		if v == "" {
			switch {
			case p.eof():
				return nil, p.errorf(open, "'(' is never closed: write %s %s (v1,v2)", key, op)
			case p.s[p.pos] == ')' && len(values) == 0:
				return nil, p.errorf(vat, "empty list: name at least one value, e.g. %s %s (a,b)", key, op)
			case p.s[p.pos] == ',' || p.s[p.pos] == ')':
				return nil, p.errorf(vat, "empty value in the list of %q: remove the extra ','", key)
			}
			return nil, p.errorf(vat, "unexpected %s in the list of %q: values cannot contain spaces or any of , = ! ( )", p.describe(vat), key)
		}
		if err := p.checkValue(v, vat); err != nil {
			return nil, err
		}
		values = append(values, v)
		p.space()
		switch {
		case p.eof():
			return nil, p.errorf(open, "'(' is never closed: write %s %s (v1,v2)", key, op)
		case p.s[p.pos] == ',':
			p.pos++
		case p.s[p.pos] == ')':
			p.pos++
			return values, nil
		default:
			return nil, p.errorf(p.pos, "unexpected %s after %q in the list of %q: separate values with ',' and close the list with ')'", p.describe(p.pos), v, key)
		}
	}
}

func (p *selParser) checkValue(v string, at int) error {
	for i, r := range v {
		if !protocol.IsLabelValueRune(r) && r != '*' && r != '?' {
			return p.errorf(at+i, "label value %q has %q: values cannot contain spaces, control characters or any of , = ! ( )", v, string(r))
		}
	}
	return nil
}

func isHostGlobChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '*' || r == '?'
}

// Match reports whether the host called host, with labels, is selected:
// whether it matches every term.
func (s Selector) Match(host string, labels map[string]string) bool {
	if len(s.terms) == 0 {
		return false
	}
	for i := range s.terms {
		if !s.terms[i].match(host, labels) {
			return false
		}
	}
	return true
}

func (t *selTerm) match(host string, labels map[string]string) bool {
	if t.op == opName {
		return Glob(t.values[0], host)
	}
	v, ok := labels[t.key]
	hit := false
	if ok {
		for _, p := range t.values {
			if Glob(p, v) {
				hit = true
				break
			}
		}
	}
	if t.op == opNe || t.op == opNotIn {
		return !hit
	}
	return hit
}

// All reports whether s selects every host whatever its name and labels:
// every term is a name glob of stars only.
func (s Selector) All() bool {
	for _, t := range s.terms {
		if t.op != opName || strings.Trim(t.values[0], "*") != "" {
			return false
		}
	}
	return len(s.terms) > 0
}

// String returns the selector in its canonical form (no spaces but around
// in and notin), which ParseSelector reads back to the same selector. The
// zero Selector prints as "".
func (s Selector) String() string {
	var b strings.Builder
	for i, t := range s.terms {
		if i > 0 {
			b.WriteByte(',')
		}
		switch t.op {
		case opName:
			b.WriteString(t.values[0])
		case opEq, opNe:
			b.WriteString(t.key)
			if t.op == opNe {
				b.WriteByte('!')
			}
			b.WriteByte('=')
			b.WriteString(t.values[0])
		case opIn, opNotIn:
			b.WriteString(t.key)
			if t.op == opIn {
				b.WriteString(" in (")
			} else {
				b.WriteString(" notin (")
			}
			b.WriteString(strings.Join(t.values, ","))
			b.WriteByte(')')
		}
	}
	return b.String()
}

// Glob reports whether s matches pattern, where '*' matches any run of
// characters (including none) and '?' exactly one; every other character
// matches itself. Unlike path.Match nothing is special about '/', and
// there are no character classes or escapes, so every pattern is valid.
// It allocates nothing and takes at most len(pattern)×len(s) steps.
func Glob(pattern, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		if pi < len(pattern) {
			switch c := pattern[pi]; c {
			case '*':
				star, mark = pi, si
				pi++
				continue
			case '?':
				_, n := utf8.DecodeRuneInString(s[si:])
				pi++
				si += n
				continue
			default:
				// A literal character, compared byte by byte: a whole
				// UTF-8 sequence matches only at the start of the same
				// sequence in s, since s is only ever advanced by runes.
				_, n := utf8.DecodeRuneInString(pattern[pi:])
				if si+n <= len(s) && pattern[pi:pi+n] == s[si:si+n] {
					pi += n
					si += n
					continue
				}
			}
		}
		if star < 0 {
			return false
		}
		// Let the last star absorb one more character and retry.
		_, n := utf8.DecodeRuneInString(s[mark:])
		mark += n
		pi, si = star+1, mark
	}
	for pi < len(pattern) && pattern[pi] == '*' {
		pi++
	}
	return pi == len(pattern)
}
