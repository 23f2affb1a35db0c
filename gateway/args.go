package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// This file keeps a per-host tool call's arguments, which may carry tens
// of megabytes of file content, from being copied whole inside the
// gateway. The gateway needs only their small parts — the host, flags,
// the strings the audit summarises — and forwards the rest to the agent
// untouched. So it looks at a shrunk copy, in which every long string is
// cut to its start, and passes the arguments as the client sent them to
// the router, which streams them to the agent in parts.

// maxArgString is the longest string kept whole in shrunk arguments. It
// is more than the audit keeps of any string (4 × maxSummaryText before
// redaction, in gateway/audit), and no argument the gateway reads is
// longer.
const maxArgString = 32 << 10

// maxArgDepth bounds the nesting of arguments the gateway looks at.
const maxArgDepth = 1000

// callArgs are a tool call's arguments as the gateway sees them.
type callArgs struct {
	// raw is what the client sent, forwarded to the agent as it is.
	raw json.RawMessage
	// small is raw with every string longer than maxArgString cut.
	small json.RawMessage
	// sizes holds, when raw is an object, the size of each of its
	// members' values in full: a string's decoded length, the encoded
	// length of anything else.
	sizes map[string]int
}

// shrinkArgs returns raw's shrunk form. Arguments that are not one JSON
// value (the SDK parsed them already, so only a nesting deeper than
// maxArgDepth) are kept as they are, for the SDK to report.
func shrinkArgs(raw json.RawMessage) *callArgs {
	a := &callArgs{raw: raw, small: raw}
	if len(raw) == 0 {
		return a
	}
	small, sizes, err := shrinkJSON(raw, maxArgString)
	if err == nil {
		a.small, a.sizes = small, sizes
	}
	return a
}

// shrinkJSON returns data, which must be one JSON value, with every string
// (object keys included) longer than max bytes as encoded cut to at most
// its first max bytes, on a character boundary; and, when data is an
// object, the size in full of each member's value (see callArgs.sizes).
func shrinkJSON(data []byte, max int) ([]byte, map[string]int, error) {
	s := shrinker{in: data, max: max, copy: true, out: make([]byte, 0, min(len(data), 4<<10))}
	if err := s.run(); err != nil {
		return nil, nil, err
	}
	sizes := make(map[string]int, len(s.members))
	for k, m := range s.members {
		sizes[k] = m.size
	}
	if s.members == nil {
		sizes = nil
	}
	return s.out, sizes, nil
}

// span is where an object member's value lies in the input, and its size
// (see callArgs.sizes).
type span struct{ start, end, size int }

// jsonMembers returns where the values of the members of data, a JSON
// object, lie in it, without copying anything. When data is cut short or
// malformed, it returns the members it read in full before the problem
// and, with its end -1, the one it was reading, with the error.
// An object with a key twice is an error too: JSON decoders differ on
// which of the two counts.
func jsonMembers(data []byte) (map[string]span, error) {
	s := shrinker{in: data, max: len(data)}
	err := s.run()
	switch {
	case err != nil:
	case s.members == nil:
		err = errors.New("JSON is not an object")
	case s.dup != "":
		err = fmt.Errorf("JSON object has the key %q twice", s.dup)
	}
	return s.members, err
}

type shrinker struct {
	in    []byte
	pos   int
	copy  bool // build out; otherwise only scan
	out   []byte
	max   int
	depth int
	// members are the top-level object's members (nil when data is not
	// an object); a member cut short has its span end at -1. dup is the
	// first key the object has twice.
	members map[string]span
	dup     string
}

func (s *shrinker) run() error {
	s.ws()
	if s.pos < len(s.in) && s.in[s.pos] == '{' {
		s.members = make(map[string]span)
	}
	if err := s.value(); err != nil {
		return err
	}
	s.ws()
	if s.pos != len(s.in) {
		return s.errorf("data after the JSON value")
	}
	return nil
}

func (s *shrinker) putc(c byte) {
	if s.copy {
		s.out = append(s.out, c)
	}
}

func (s *shrinker) puts(b []byte) {
	if s.copy {
		s.out = append(s.out, b...)
	}
}

var errJSONEnd = errors.New("JSON ends too soon")

func (s *shrinker) errorf(format string, args ...any) error {
	return fmt.Errorf("JSON at byte %d: %s", s.pos, fmt.Sprintf(format, args...))
}

func (s *shrinker) ws() {
	for s.pos < len(s.in) {
		switch s.in[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *shrinker) value() error {
	s.ws()
	if s.pos >= len(s.in) {
		return errJSONEnd
	}
	switch c := s.in[s.pos]; {
	case c == '{':
		return s.object()
	case c == '[':
		return s.array()
	case c == '"':
		_, err := s.str()
		return err
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	default:
		return s.errorf("unexpected %q", c)
	}
}

func (s *shrinker) enter() error {
	if s.depth++; s.depth > maxArgDepth {
		return s.errorf("nested more than %d deep", maxArgDepth)
	}
	return nil
}

func (s *shrinker) object() error {
	if err := s.enter(); err != nil {
		return err
	}
	top := s.depth == 1 && s.members != nil
	s.putc('{')
	s.pos++
	s.ws()
	if s.pos < len(s.in) && s.in[s.pos] == '}' {
		s.putc('}')
		s.pos++
		s.depth--
		return nil
	}
	for {
		s.ws()
		if s.pos >= len(s.in) || s.in[s.pos] != '"' {
			return s.orEnd("an object key")
		}
		keyAt := s.pos
		if _, err := s.str(); err != nil {
			return err
		}
		key := s.in[keyAt:s.pos]
		s.ws()
		if s.pos >= len(s.in) || s.in[s.pos] != ':' {
			return s.orEnd("':' after an object key")
		}
		s.putc(':')
		s.pos++
		s.ws()
		start := s.pos
		isString := s.pos < len(s.in) && s.in[s.pos] == '"'
		n, err := s.valueSized(isString)
		if top {
			var k string
			if json.Unmarshal(key, &k) != nil {
				k = ""
			}
			if _, seen := s.members[k]; seen && s.dup == "" {
				s.dup = k
			}
			switch {
			case err != nil:
				// Where the value that was cut short starts, for a
				// caller reading what it can of it.
				s.members[k] = span{start: start, end: -1}
			case !isString:
				n = s.pos - start
				fallthrough
			default:
				s.members[k] = span{start: start, end: s.pos, size: n}
			}
		}
		if err != nil {
			return err
		}
		if end, err := s.after('}', "an object"); end || err != nil {
			return err
		}
	}
}

// after consumes what follows a value in an object or array: a comma, or
// the closing character (it then reports end).
func (s *shrinker) after(closing byte, in string) (end bool, err error) {
	s.ws()
	if s.pos >= len(s.in) {
		return false, errJSONEnd
	}
	switch c := s.in[s.pos]; c {
	case ',', closing:
		s.putc(c)
		s.pos++
		if c == closing {
			s.depth--
			return true, nil
		}
		return false, nil
	default:
		return false, s.errorf("unexpected %q in %s", c, in)
	}
}

// valueSized parses a value; for a string it returns its decoded length.
func (s *shrinker) valueSized(isString bool) (int, error) {
	if isString {
		return s.str()
	}
	return 0, s.value()
}

func (s *shrinker) array() error {
	if err := s.enter(); err != nil {
		return err
	}
	s.putc('[')
	s.pos++
	s.ws()
	if s.pos < len(s.in) && s.in[s.pos] == ']' {
		s.putc(']')
		s.pos++
		s.depth--
		return nil
	}
	for {
		if err := s.value(); err != nil {
			return err
		}
		if end, err := s.after(']', "an array"); end || err != nil {
			return err
		}
	}
}

func (s *shrinker) orEnd(want string) error {
	if s.pos >= len(s.in) {
		return errJSONEnd
	}
	return s.errorf("want %s, not %q", want, s.in[s.pos])
}

func (s *shrinker) literal(lit string) error {
	if len(s.in)-s.pos < len(lit) || string(s.in[s.pos:s.pos+len(lit)]) != lit {
		return s.errorf("bad literal, want %s", lit)
	}
	s.puts([]byte(lit))
	s.pos += len(lit)
	return nil
}

func (s *shrinker) number() error {
	start := s.pos
	digits := func() int {
		n := 0
		for s.pos < len(s.in) && s.in[s.pos] >= '0' && s.in[s.pos] <= '9' {
			s.pos++
			n++
		}
		return n
	}
	if s.in[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos < len(s.in) && s.in[s.pos] == '0':
		s.pos++
	case digits() == 0:
		return s.errorf("bad number")
	}
	if s.pos < len(s.in) && s.in[s.pos] == '.' {
		s.pos++
		if digits() == 0 {
			return s.errorf("bad number")
		}
	}
	if s.pos < len(s.in) && (s.in[s.pos] == 'e' || s.in[s.pos] == 'E') {
		s.pos++
		if s.pos < len(s.in) && (s.in[s.pos] == '+' || s.in[s.pos] == '-') {
			s.pos++
		}
		if digits() == 0 {
			return s.errorf("bad number")
		}
	}
	s.puts(s.in[start:s.pos])
	return nil
}

// str copies the string at s.pos, cut to at most s.max bytes, and returns
// its decoded length in full. A cut falls before an escape or a UTF-8
// character, never inside one.
func (s *shrinker) str() (int, error) {
	start := s.pos + 1 // after the quote
	s.pos = start
	decoded := 0
	cut := start // the last place the string may be cut within max bytes
	for {
		if s.pos >= len(s.in) {
			return 0, errJSONEnd
		}
		c := s.in[s.pos]
		if s.pos-start <= s.max && utf8.RuneStart(c) {
			cut = s.pos
		}
		switch {
		case c == '"':
			end := s.pos
			if end-start > s.max {
				end = cut
			}
			s.putc('"')
			s.puts(s.in[start:end])
			s.putc('"')
			s.pos++
			return decoded, nil
		case c < 0x20:
			return 0, s.errorf("control character in a string")
		case c == '\\':
			n, err := s.escape()
			if err != nil {
				return 0, err
			}
			decoded += n
		default:
			s.pos++
			decoded++
		}
	}
}

// escape consumes the escape at s.pos and returns how many bytes it
// decodes to.
func (s *shrinker) escape() (int, error) {
	if s.pos+1 >= len(s.in) {
		return 0, errJSONEnd
	}
	switch s.in[s.pos+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.pos += 2
		return 1, nil
	case 'u':
		r, ok := hex4(s.in[s.pos+2:])
		if !ok {
			return 0, s.errorf("bad \\u escape")
		}
		s.pos += 6
		if r >= 0xD800 && r < 0xDC00 && s.pos+1 < len(s.in) && s.in[s.pos] == '\\' && s.in[s.pos+1] == 'u' {
			// With its second half, the first half of a surrogate pair
			// is one 4-byte character.
			if r2, ok := hex4(s.in[s.pos+2:]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
				s.pos += 6
				return 4, nil
			}
		}
		if r >= 0xD800 && r < 0xE000 {
			r = utf8.RuneError
		}
		return utf8.RuneLen(r), nil
	default:
		return 0, s.errorf("bad escape \\%c", s.in[s.pos+1])
	}
}

// hex4 decodes the 4 hex digits at the start of p.
func hex4(p []byte) (rune, bool) {
	if len(p) < 4 {
		return 0, false
	}
	r := rune(0)
	for _, h := range p[:4] {
		var v byte
		switch {
		case h >= '0' && h <= '9':
			v = h - '0'
		case h >= 'a' && h <= 'f':
			v = h - 'a' + 10
		case h >= 'A' && h <= 'F':
			v = h - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(v)
	}
	return r, true
}
