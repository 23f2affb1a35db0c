package policy

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"unicode"

	"mvdan.cc/sh/v3/syntax"
)

// maxDepth bounds how deeply wrappers and nested scripts are followed.
const maxDepth = 16

// CheckCommand returns nil when the bash rules allow the command line, or
// a *Denial naming the command refused and why. Without bash rules it
// allows everything and does not parse the line.
//
// The line is parsed, and every simple command in it is checked: in
// pipelines and lists, subshells, groups, loop and branch bodies, function
// bodies, command and process substitutions, and what wrappers run (sudo,
// env, xargs, find -exec, sh -c with a literal script, ...). Under an allow
// list, what cannot be checked is refused: substitutions, command names
// known only at run time, eval, source, arithmetic on variables, lines that
// do not parse. Whatever the rules, a line may not set the variables that
// decide what commands run (PATH, LD_PRELOAD, GIT_*, ...).
//
// writes is asked about every file an output redirection (>, >>, &>, <>)
// writes to, as an absolute path; nil means the policy's own path rules.
func (p *Policy) CheckCommand(line string, writes func(path string) error) error {
	if p == nil || p.rules.Bash.empty() {
		return nil
	}
	if strings.IndexByte(line, 0) >= 0 {
		return &Denial{"bash", "the command line contains a NUL byte"}
	}
	if writes == nil {
		writes = func(path string) error { return p.CheckPath(Write, path, path) }
	}
	c := &checker{p: p, line: &lineState{writes: writes}}
	if err := c.script(line, p.lang); err != nil {
		return err
	}
	return c.relativeTargets()
}

// lineState is shared by everything checked for one command line.
type lineState struct {
	writes func(path string) error
	// cd is set when the line changes directory anywhere: relative
	// redirection targets can then no longer be placed.
	cd       bool
	relative []shWord // relative redirection targets, checked last
}

// checker checks one script: the command line, or a script nested in it.
type checker struct {
	p     *Policy
	line  *lineState
	src   string // the script, for messages
	lang  shellLang
	depth int
	// elsewhere is set inside commands that run under another root
	// directory or on another host: the files they write cannot be
	// placed.
	elsewhere bool
	// gitEnv says why commands run without the environment the agent
	// gives bash (sudo, env -i, ...): git would miss its guard there.
	gitEnv string
}

func (c *checker) allowList() bool { return len(c.p.bash.allow) > 0 }

// nested returns a checker for text found inside the current script.
func (c *checker) nested(src string) *checker {
	sub := *c
	sub.src = src
	sub.depth++
	return &sub
}

func (c *checker) refuse(format string, args ...any) error {
	return &Denial{"bash", fmt.Sprintf(format, args...)}
}

// text returns the source of node n, within the current script.
func (c *checker) text(n syntax.Node) string {
	start, end := int(n.Pos().Offset()), int(n.End().Offset())
	if start < 0 || end > len(c.src) || start > end {
		return ""
	}
	return c.src[start:end]
}

// clip shortens s for a message.
func clip(s string) string {
	const most = 120
	s = strings.ReplaceAll(s, "\n", `\n`)
	if len(s) > most {
		s = s[:most] + "…"
	}
	return "`" + s + "`"
}

// variants returns the syntaxes a script for lang is read in. A POSIX
// shell reads some lines differently from bash ("((id))" runs id in
// nested subshells there, and is arithmetic to bash), and /bin/sh is bash
// on some systems: a line for sh is checked as both.
func variants(lang shellLang) []syntax.LangVariant {
	switch lang {
	case langMksh:
		return []syntax.LangVariant{syntax.LangMirBSDKorn}
	case langSh:
		return []syntax.LangVariant{syntax.LangPOSIX, syntax.LangBash}
	}
	return []syntax.LangVariant{syntax.LangBash}
}

func parse(src string, variant syntax.LangVariant) (*syntax.File, error) {
	return syntax.NewParser(syntax.Variant(variant)).Parse(strings.NewReader(src), "")
}

func variantName(v syntax.LangVariant) string {
	switch v {
	case syntax.LangMirBSDKorn:
		return "mksh"
	case syntax.LangPOSIX:
		return "POSIX sh"
	}
	return "bash"
}

// script parses src in each syntax of lang and checks it.
func (c *checker) script(src string, lang shellLang) error {
	if c.depth > maxDepth {
		return c.refuse("%s: scripts nested too deeply to check", clip(src))
	}
	for _, v := range variants(lang) {
		f, err := parse(src, v)
		if err != nil {
			return c.refuse("%s does not parse as %s (%v), so it cannot be checked; fix the syntax", clip(src), variantName(v), err)
		}
		sub := *c
		sub.src, sub.lang = src, lang
		if err := sub.walk(f); err != nil {
			return err
		}
	}
	return nil
}

// walk checks every command under node.
func (c *checker) walk(node syntax.Node) error {
	var err error
	syntax.Walk(node, func(n syntax.Node) bool {
		if err != nil {
			return false
		}
		switch n := n.(type) {
		case *syntax.CallExpr:
			err = c.call(n)
		case *syntax.DeclClause:
			err = c.decl(n)
		case *syntax.Stmt:
			err = c.redirects(n.Redirs)
		case *syntax.CmdSubst:
			if c.allowList() {
				err = c.refuse("command substitution %s: under bash.allow what it runs cannot be checked; run it on its own and use its output", clip(c.text(n)))
			}
		case *syntax.ProcSubst:
			if c.allowList() {
				err = c.refuse("process substitution %s: under bash.allow what it runs cannot be checked", clip(c.text(n)))
			}
		default:
			err = c.evaluates(n)
		}
		return err == nil
	})
	return err
}

// call checks a simple command: its assignments, then its words.
func (c *checker) call(ce *syntax.CallExpr) error {
	for _, a := range ce.Assigns {
		if err := c.assign(a); err != nil {
			return err
		}
	}
	words, err := c.words(ce.Args)
	if err != nil || len(words) == 0 {
		return err
	}
	return c.command(words)
}

// command checks one command given by its words, then what it runs.
func (c *checker) command(words []shWord) error {
	if c.depth > maxDepth {
		return c.refuse("%s: wrappers nested too deeply to check", clip(joinSrc(words)))
	}
	name := words[0]
	switch {
	case !name.literal() && c.allowList():
		return c.refuse("command %s: its name %s is only known when the line runs; under bash.allow write command names out", clip(joinSrc(words)), clip(name.src))
	case !name.literal():
		c.line.cd = true // it may be cd
		if err := c.match(words); err != nil {
			return err
		}
		return c.git(words)
	case c.allowList() && strings.ContainsFunc(name.text, unicode.IsSpace):
		// Words are matched joined by spaces: a name with a space in it
		// would pass for a name and its first argument.
		return c.refuse("command %s: its name %s holds white space; under bash.allow command names are single words", clip(joinSrc(words)), clip(name.src))
	}
	base := path.Base(name.text)
	switch base {
	case "cd", "pushd", "popd":
		c.line.cd = true
	case "eval", "source", ".":
		if c.allowList() {
			return c.refuse("%s: %s runs text the rules cannot see; under bash.allow it is refused", clip(joinSrc(words)), base)
		}
		c.line.cd = true // what it runs may change directory
	}
	if err := c.match(words); err != nil {
		return err
	}
	if err := c.git(words); err != nil {
		return err
	}
	if err := c.builtin(base, words); err != nil {
		return err
	}
	return c.unwrap(words)
}

// match checks the words of one command against the rules.
func (c *checker) match(words []shWord) error {
	subject := func(forDeny bool) string {
		var b strings.Builder
		for i, w := range words {
			if i == 0 {
				if w.literal() {
					b.WriteString(commandName(w.text, forDeny))
				} else {
					b.WriteByte(dyn)
				}
				continue
			}
			b.WriteByte(' ')
			b.WriteString(w.text)
		}
		return b.String()
	}
	if rules := c.p.bash.deny; len(rules) > 0 {
		s := subject(true)
		for i := range rules {
			if rules[i].may(s) {
				if !strings.Contains(s, string(dyn)) {
					return &Denial{"bash.deny", fmt.Sprintf("command %s matches bash.deny %q", clip(joinSrc(words)), rules[i].text)}
				}
				return &Denial{"bash.deny", fmt.Sprintf("command %s could match bash.deny %q, depending on values only known when it runs", clip(joinSrc(words)), rules[i].text)}
			}
		}
	}
	if rules := c.p.bash.allow; len(rules) > 0 {
		s := subject(false)
		for i := range rules {
			if rules[i].must(s) {
				return nil
			}
		}
		return &Denial{"bash.allow", fmt.Sprintf("command %s is not covered by bash.allow (%s)", clip(joinSrc(words)), patternTexts(rules))}
	}
	return nil
}

func joinSrc(words []shWord) string {
	s := make([]string, 0, len(words))
	for _, w := range words {
		if w.src != "" {
			s = append(s, w.src)
		}
	}
	return strings.Join(s, " ")
}

func patternTexts(l []cmdPattern) string {
	const most = 8
	var s []string
	for i, p := range l {
		if i == most {
			s = append(s, fmt.Sprintf("and %d more", len(l)-most))
			break
		}
		s = append(s, p.text)
	}
	return strings.Join(s, ", ")
}

// redirects checks the files output redirections write to.
func (c *checker) redirects(rs []*syntax.Redirect) error {
	for _, r := range rs {
		if !writesFile(r) {
			continue
		}
		ws, err := c.words([]*syntax.Word{r.Word})
		if err != nil {
			return err
		}
		if c.elsewhere && !(len(ws) == 1 && ws[0].literal() && notAFile(ws[0].text)) {
			return c.refuse("output redirection to %s: the command runs under another root directory or on another host, where the path rules cannot place the file it writes", clip(c.text(r.Word)))
		}
		// "~" is where $HOME points when the line runs, which the line
		// itself may change.
		unknown := len(ws) != 1 || !ws[0].literal() || ws[0].tilde
		if unknown && c.p.HasPathRules(Write) {
			return c.refuse("output redirection to %s: which file it writes is only known when the line runs, so the path rules cannot check it; write to an absolute path", clip(c.text(r.Word)))
		}
		if unknown && (len(ws) != 1 || !ws[0].literal() || ws[0].text != "~" && !strings.HasPrefix(ws[0].text, "~/")) {
			continue
		}
		if err := c.target(ws[0]); err != nil {
			return err
		}
	}
	return nil
}

// writesFile reports whether r writes to a file named by its word.
func writesFile(r *syntax.Redirect) bool {
	switch r.Op {
	case syntax.RdrOut, syntax.AppOut, syntax.RdrClob, syntax.AppClob, syntax.RdrInOut,
		syntax.RdrAll, syntax.RdrAllClob, syntax.AppAll, syntax.AppAllClob:
		return true
	case syntax.DplOut:
		// >&2 and >&- duplicate or close descriptors; >&file is &>file.
		// An unknown word may name a file.
		lit := r.Word.Lit()
		return lit == "" || strings.TrimRight(strings.TrimSuffix(lit, "-"), "0123456789") != ""
	}
	return false
}

// target checks one literal redirection target.
func (c *checker) target(w shWord) error {
	t := w.text
	switch {
	case notAFile(t):
		return nil
	case w.tilde:
		if c.p.env.Home == "" {
			return c.refuse("output redirection to %s: the agent's user has no home directory to expand ~ to", clip(w.src))
		}
		t = filepath.Join(c.p.env.Home, t[1:])
	case !filepath.IsAbs(t):
		c.line.relative = append(c.line.relative, w)
		return nil
	}
	return c.line.writes(filepath.Clean(t))
}

// notAFile reports whether redirection target t is a device or descriptor
// rather than a file.
func notAFile(t string) bool {
	switch t {
	case "/dev/null", "/dev/stdout", "/dev/stderr", "/dev/stdin", "/dev/tty":
		return true
	}
	return strings.HasPrefix(t, "/dev/fd/") && strings.Trim(t[len("/dev/fd/"):], "0123456789") == ""
}

// relativeTargets checks the relative redirection targets once the whole
// line is known: a cd anywhere in it, even after them or in a loop, makes
// them impossible to place.
func (c *checker) relativeTargets() error {
	for _, w := range c.line.relative {
		if c.line.cd {
			return c.refuse("output redirection to %s in a line that changes directory: which file it writes cannot be known; use an absolute path", clip(w.src))
		}
		if err := c.line.writes(filepath.Join(c.p.env.Cwd, w.text)); err != nil {
			return err
		}
	}
	return nil
}
