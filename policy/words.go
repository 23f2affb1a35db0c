package policy

import (
	"strings"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// shWord is one word of a command as far as it can be known before the
// line runs: quotes and escapes removed, braces expanded, and dyn in place
// of variables, substitutions and globs.
type shWord struct {
	text string
	src  string // as written, for messages
	// tilde is set when the word starts with an unquoted "~", which the
	// shell expands.
	tilde bool
	// splits is set when the word holds an unquoted expansion, which the
	// shell may split into several words.
	splits bool
}

func (w shWord) literal() bool { return strings.IndexByte(w.text, dyn) < 0 }

// dynWord is a word that is unknown altogether.
func dynWord(src string) shWord { return shWord{text: string(dyn), src: src} }

// maxBraceWords bounds the words one brace expansion may yield; beyond it
// the word counts as unknown.
const maxBraceWords = 64

// words evaluates ws as the shell would split them into a command's words.
func (c *checker) words(ws []*syntax.Word) ([]shWord, error) {
	var out []shWord
	for _, w := range ws {
		src := c.text(w)
		cp := &syntax.Word{Parts: append([]syntax.WordPart(nil), w.Parts...)}
		if !syntax.SplitBraces(cp) {
			sw, err := c.word(w.Parts, src)
			if err != nil {
				return nil, err
			}
			out = append(out, sw)
			continue
		}
		n := 0
		for bw, err := range expand.BracesSeq(nil, cp) {
			if n++; err != nil || n > maxBraceWords {
				out = append(out, dynWord(src))
				break
			}
			sw, err := c.word(bw.Parts, src)
			if err != nil {
				return nil, err
			}
			if sw.text == "" && !quoted(bw.Parts) {
				continue // bash drops empty words: {,rm} x is rm x
			}
			src = "" // the source shows once
			out = append(out, sw)
		}
	}
	return out, nil
}

// quoted reports whether parts hold quotes, which keep an empty word.
func quoted(parts []syntax.WordPart) bool {
	for _, p := range parts {
		switch p.(type) {
		case *syntax.SglQuoted, *syntax.DblQuoted:
			return true
		}
	}
	return false
}

// word evaluates the parts of one word.
func (c *checker) word(parts []syntax.WordPart, src string) (shWord, error) {
	sw := shWord{src: src}
	if len(parts) > 0 {
		if lit, ok := parts[0].(*syntax.Lit); ok && strings.HasPrefix(lit.Value, "~") {
			sw.tilde = true
		}
	}
	var b strings.Builder
	glob, err := c.parts(&b, parts, false)
	if err != nil {
		return sw, err
	}
	sw.text = b.String()
	sw.splits = unquotedExpansion(parts)
	if glob {
		sw.text = string(dyn)
		sw.splits = true
	}
	return sw, nil
}

// unquotedExpansion reports whether parts hold an expansion outside
// quotes, whose value the shell splits into words.
func unquotedExpansion(parts []syntax.WordPart) bool {
	for _, p := range parts {
		switch p.(type) {
		case *syntax.Lit, *syntax.SglQuoted, *syntax.DblQuoted:
		default:
			return true
		}
	}
	return false
}

// parts writes the known text of parts to b, dyn for the unknown, and
// reports whether the word is subject to pathname expansion.
func (c *checker) parts(b *strings.Builder, parts []syntax.WordPart, quoted bool) (glob bool, err error) {
	for _, wp := range parts {
		var lit string
		switch wp := wp.(type) {
		case *syntax.Lit:
			if quoted {
				lit = unescapeQuoted(wp.Value)
			} else {
				glob = glob || hasGlob(wp.Value)
				lit = unescapeBare(wp.Value)
			}
		case *syntax.SglQuoted:
			lit = wp.Value
			if wp.Dollar {
				// $'...': escapes as in printf; the text ends at a NUL,
				// as bash's does.
				lit, _ = expand.Literal(nil, &syntax.Word{Parts: []syntax.WordPart{wp}})
			}
		case *syntax.DblQuoted:
			g, err := c.parts(b, wp.Parts, true)
			if err != nil {
				return false, err
			}
			glob = glob || g
			continue
		case *syntax.ExtGlob, *syntax.BraceExp:
			glob = true
			continue
		default: // parameters, substitutions, arithmetic
			b.WriteByte(dyn)
			continue
		}
		if err := c.quotedCode(lit); err != nil {
			return false, err
		}
		b.WriteString(lit)
	}
	return glob, nil
}

// hasGlob reports whether an unquoted literal holds a pattern character
// the shell expands against file names: "*", "?", or a "[" with a "]"
// after it. Escaped characters do not count.
func hasGlob(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '*', '?':
			return true
		case '[':
			if strings.IndexByte(s[i+1:], ']') >= 0 {
				return true
			}
		}
	}
	return false
}

// unescapeBare removes the backslashes of an unquoted literal: "r\m" is
// "rm", a backslash-newline disappears.
func unescapeBare(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
			if s[i] == '\n' {
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unescapeQuoted removes the backslashes that escape inside double
// quotes: before $, `, ", \ and newline.
func unescapeQuoted(s string) string { return unescapeBefore(s, "$`\"\\\n") }

// unescapeBefore removes the backslashes before the characters in
// special; a backslash-newline disappears.
func unescapeBefore(s, special string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && strings.IndexByte(special, s[i+1]) >= 0 {
			i++
			if s[i] == '\n' {
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// quotedCode checks command substitutions written inside quotes. The shell
// does not run them where they are written, but it may run them later:
// arithmetic on a variable that holds "a[$(cmd)]" runs cmd, as do eval,
// PS4 and trap. So they are checked as if they ran: under an allow list
// they are refused, under deny rules the commands in them are checked.
func (c *checker) quotedCode(lit string) error {
	if !strings.Contains(lit, "$(") && !strings.Contains(lit, "`") {
		return nil
	}
	// Parsed as the body of a here-document, the text keeps everything
	// literal except the substitutions.
	const delim = "FLEET_POLICY_END_OF_TEXT"
	src := "cat <<" + delim + "\n" + lit + "\n" + delim + "\n"
	for _, v := range variants(c.lang) {
		f, err := parse(src, v)
		if err != nil || strings.Contains(lit, delim) || c.depth >= maxDepth {
			return c.refuse("quoted text %s holds $( or ` that does not parse, so what it could run cannot be checked; quote it differently", shown(lit))
		}
		if err := c.nested(src).substitutions(lit, f); err != nil {
			return err
		}
	}
	return nil
}

// substitutions checks the command substitutions in f, parsed from the
// quoted text lit.
func (c *checker) substitutions(lit string, f *syntax.File) error {
	var err error
	syntax.Walk(f, func(n syntax.Node) bool {
		if err != nil {
			return false
		}
		cs, ok := n.(*syntax.CmdSubst)
		if !ok {
			return true
		}
		if c.allowList() {
			err = c.refuse("quoted text %s holds a command substitution %s; bash can still run it (eval, arithmetic on a variable holding it), and under bash.allow it cannot be checked", shown(lit), shown(c.text(cs)))
		} else {
			err = c.walk(cs)
		}
		return false
	})
	return err
}
