package policy

import (
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// input is what a command reads on its standard input, as far as it is
// known before the line runs. Only a here-document or here-string with
// literal text, given to the command itself, is known; a pipe, a file, a
// redirection on an enclosing block and the line's own input are not.
type input struct {
	known bool
	text  string
}

// stdinOf returns what the command of a statement with redirections rs
// reads on its standard input: the last redirection of descriptor 0
// decides.
func (c *checker) stdinOf(rs []*syntax.Redirect) (input, error) {
	var in input
	for _, r := range rs {
		if !redirectsStdin(r) {
			continue
		}
		in = input{}
		switch r.Op {
		case syntax.Hdoc, syntax.DashHdoc:
			in = hereDoc(r)
		case syntax.WordHdoc:
			ws, err := c.words([]*syntax.Word{r.Word})
			if err != nil {
				return input{}, err
			}
			if len(ws) == 1 && ws[0].literal() && !ws[0].tilde {
				in = input{known: true, text: ws[0].text + "\n"}
			}
		}
	}
	return in, nil
}

// redirectsStdin reports whether r changes descriptor 0.
func redirectsStdin(r *syntax.Redirect) bool {
	if r.N != nil {
		return r.N.Value == "0"
	}
	switch r.Op {
	case syntax.RdrIn, syntax.RdrInOut, syntax.DplIn, syntax.Hdoc, syntax.DashHdoc, syntax.WordHdoc:
		return true
	}
	return false
}

// hereDoc returns the text of here-document r when it holds no
// expansions. With a quoted delimiter the body is taken as written;
// otherwise a backslash escapes $, `, \ and a newline, as bash reads it.
// <<- drops the tabs that start its lines.
func hereDoc(r *syntax.Redirect) input {
	if r.Hdoc == nil {
		return input{known: true}
	}
	var b strings.Builder
	for _, p := range r.Hdoc.Parts {
		lit, ok := p.(*syntax.Lit)
		if !ok {
			return input{}
		}
		b.WriteString(lit.Value)
	}
	text := b.String()
	if !quotedDelimiter(r.Word) {
		text = unescapeHereDoc(text)
	}
	if r.Op == syntax.DashHdoc {
		lines := strings.SplitAfter(text, "\n")
		for i, l := range lines {
			lines[i] = strings.TrimLeft(l, "\t")
		}
		text = strings.Join(lines, "")
	}
	return input{known: true, text: text}
}

// quotedDelimiter reports whether a here-document's delimiter is quoted
// in any way, which keeps its body from expansion.
func quotedDelimiter(w *syntax.Word) bool {
	if w == nil {
		return false
	}
	for _, p := range w.Parts {
		lit, ok := p.(*syntax.Lit)
		if !ok || strings.IndexByte(lit.Value, '\\') >= 0 {
			return true
		}
	}
	return false
}

// unescapeHereDoc removes the backslashes that escape in a here-document
// with an unquoted delimiter: before $, ` and \; a backslash-newline
// disappears.
func unescapeHereDoc(s string) string { return unescapeBefore(s, "$`\\\n") }

// stdinScript returns what a program that runs the commands on its
// standard input (a shell, source /dev/stdin, at) runs: the script of a
// literal here-document or here-string, or, for any other input, an
// unknown.
func (c *checker) stdinScript(lang shellLang, what string) runs {
	if !c.stdin.known || lang == langUnsupported {
		return runs{unknown: "reads the commands it runs from standard input" + what}
	}
	return runs{script: c.stdin.text, isScript: true, lang: lang, via: "a here-document"}
}

// stdinName reports whether a file name is standard input itself, as a
// here-document given to the command fills it.
func stdinName(name string) bool {
	switch name {
	case "-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0":
		return true
	}
	return false
}

// maxXargsInput bounds the here-document text xargs arguments are read
// from: with more, how xargs splits them into commands depends on the
// system's limits.
const maxXargsInput = 2048

// xargsItems splits the input of xargs into its arguments as GNU and BSD
// xargs do by default: blanks and newlines separate them, single and
// double quotes quote (not across a newline), a backslash escapes the
// next character. With lines set (-I), only a newline separates, and the
// blanks that start a line are dropped. ok is false for input xargs
// refuses (an unmatched quote).
func xargsItems(s string, lines bool) (items []string, ok bool) {
	var cur strings.Builder
	seen := false
	end := func() {
		if seen {
			items = append(items, cur.String())
		}
		cur.Reset()
		seen = false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\n':
			end()
		case (ch == ' ' || ch == '\t') && (!lines || !seen):
			if !lines {
				end()
			}
		case ch == '\'' || ch == '"':
			j := strings.IndexAny(s[i+1:], string(ch)+"\n")
			if j < 0 || s[i+1+j] == '\n' {
				return nil, false
			}
			cur.WriteString(s[i+1 : i+1+j])
			seen = true
			i += j + 1
		case ch == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			seen = true
		default:
			cur.WriteByte(ch)
			seen = true
		}
	}
	end()
	return items, true
}

// xargsInvocations returns the commands xargs runs with the literal input
// in: cmd with the arguments it reads, n at a time (0: all at once), or,
// with replace set (-I R), once per line with R replaced in cmd's words.
// ok is false when they cannot be known.
func xargsInvocations(cmd []shWord, in string, n int, replace *shWord, noEmpty bool) (rs []runs, ok bool) {
	if len(in) > maxXargsInput {
		return nil, false
	}
	items, ok := xargsItems(in, replace != nil)
	if !ok {
		return nil, false
	}
	if replace != nil {
		for _, it := range items {
			words := make([]shWord, len(cmd))
			for i, w := range cmd {
				words[i] = w
				if replace.text != "" {
					words[i].text = strings.ReplaceAll(w.text, replace.text, it)
				}
			}
			rs = append(rs, runs{words: words})
		}
		return rs, true
	}
	if len(items) == 0 {
		if noEmpty {
			return nil, true
		}
		return []runs{{words: cmd}}, true
	}
	if n <= 0 {
		n = len(items)
	}
	for len(items) > 0 {
		k := min(n, len(items))
		words := append([]shWord(nil), cmd...)
		for _, it := range items[:k] {
			words = append(words, shWord{text: it, src: it})
		}
		rs = append(rs, runs{words: words})
		items = items[k:]
	}
	return rs, true
}
