package policy

import (
	"fmt"
	"path"
	"strings"
	"unicode"

	"mvdan.cc/sh/v3/syntax"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// maxDepth bounds how deeply wrappers and nested scripts are followed.
const maxDepth = 16

// CheckCommand returns nil when the policy allows the command line, or a
// *Denial naming the command refused and why. A policy with neither bash
// nor path rules allows everything and does not parse the line.
//
// The line is parsed, and every simple command in it is checked against
// the bash rules: in pipelines and lists, subshells, groups, loop and
// branch bodies, function bodies, command and process substitutions, and
// what wrappers run (sudo, env, xargs, find -exec, sh -c with a literal
// script, ...), options name (sort --compress-program, tar --to-command,
// ...), awk and sed programs run, and shells, xargs, at and crontab read
// from a literal here-document. Deny rules match options in every spelling
// programs read them in (abbreviations, clusters). Under an allow list,
// what cannot be checked is refused: substitutions, command names known
// only at run time, eval, source, arithmetic on variables, program text in
// other languages, lines that do not parse. Whatever the rules, a line may
// not set the variables that decide what commands run (PATH, LD_PRELOAD,
// GIT_*, ...).
//
// Every file a redirection opens is checked: files is asked about it with
// what the redirection does (Read for <, Write for >, >>, &>, both for <>),
// and /dev/tcp and /dev/udp, which bash opens as network connections, are
// refused. nil files means the policy's own path rules on the path
// cleaned as text (see FileCheck: a caller with a file system resolves
// links). A target only known at run time is refused when path rules
// apply to what the redirection does, or when it could name /dev/tcp.
// Without bash rules only the line's redirections are checked, not those
// of scripts it hands to other programs (bash -c '...'), which are
// arguments like any other.
//
// On Windows, or with PowerShell as the shell, command rules refuse every
// line: PowerShell is not parsed, and an allow list that cannot be checked
// must not look as if it were. Without command rules nothing is checked
// there, not even redirections.
func (p *Policy) CheckCommand(line string, files FileCheck) error {
	if p == nil {
		return nil
	}
	return p.CheckCommandIn(line, p.env.Cwd, files)
}

// CheckCommandIn is CheckCommand for a line that runs in the directory
// cwd, an absolute path, rather than the agent's working directory:
// relative redirection targets resolve against it. A policy narrowed for
// a caller (ForCaller) checks the line with the caller's own rules too.
func (p *Policy) CheckCommandIn(line, cwd string, files FileCheck) error {
	if err := p.checkOwnCommand(line, cwd, files); err != nil || p == nil || p.narrow == nil {
		return err
	}
	return p.narrowed(p.narrow.checkOwnCommand(line, cwd, files))
}

// checkOwnCommand is CheckCommandIn with p's own rules.
func (p *Policy) checkOwnCommand(line, cwd string, files FileCheck) error {
	if p == nil {
		return nil
	}
	commands := !p.rules.Bash.empty()
	if !commands && !p.hasOwnPathRules(Read) && !p.hasOwnPathRules(Write) {
		return nil
	}
	lang := p.lang
	if !commands {
		if lang = shellLanguage(p.env.Shell); lang == langUnsupported || lang == langPowerShell || p.env.OS == osWindows {
			return nil // a shell whose lines cannot be parsed; without bash rules they are not
		}
	}
	if lang == langPowerShell {
		return &Denial{"bash", "this host's policy has bash rules, which are written for POSIX shells, and its shell is " +
			shellName(p.env.Shell) + ", whose command lines the agent cannot check; bash is refused here rather than run unchecked. " +
			"Use the file tools, or give this host a policy without bash rules (tools.deny: [bash] keeps bash off)"}
	}
	if !path.IsAbs(cwd) {
		return &Denial{"bash", fmt.Sprintf("the working directory %q is not an absolute path", cwd)}
	}
	if strings.IndexByte(line, 0) >= 0 {
		return &Denial{"bash", "the command line contains a NUL byte"}
	}
	if files == nil {
		files = p.lexicalFiles
	}
	c := &checker{p: p, redirectsOnly: !commands, line: &lineState{files: files, cwd: path.Clean(cwd)}}
	if err := c.script(line, lang); err != nil {
		return err
	}
	return c.finish()
}

// lineState is shared by everything checked for one command line.
type lineState struct {
	files FileCheck
	cwd   string // where the line runs
	// cd is set when the line changes directory anywhere: relative
	// redirection targets can then no longer be placed.
	cd       bool
	relative []relTarget // relative redirection targets, checked last
	// only holds, by Op, the first file the line opens for that alone;
	// reopened the first descriptor of the shell it opens again by name
	// (/dev/fd/N, /dev/stdout, ...) for that.
	only, reopened [2]string
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
	// stdin is what the command being checked reads on its standard
	// input, as far as it is known.
	stdin input
	// redirectsOnly is set without bash rules: only redirections are
	// checked, and commands only for whether they change directory.
	redirectsOnly bool
	// gitEnv says why commands run without the environment the agent
	// gives bash (sudo, env -i, ...): git would miss its guard there.
	gitEnv string
	// assigns are the variables the line puts in the environment of the
	// command being checked ("NAME=value" words): its prefix
	// assignments and those of env and the like that run it.
	assigns []shWord
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

// shown is s as a message quotes it: in backquotes, on one line,
// clipped.
func shown(s string) string {
	return "`" + protocol.Ellipsis(strings.ReplaceAll(s, "\n", `\n`), 120) + "`"
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
		return c.refuse("%s: scripts nested too deeply to check", shown(src))
	}
	for _, v := range variants(lang) {
		f, err := parse(src, v)
		if err != nil {
			return c.refuse("%s does not parse as %s (%v), so it cannot be checked; fix the syntax", shown(src), variantName(v), err)
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
	var stdins map[*syntax.CallExpr]input // from here-documents
	syntax.Walk(node, func(n syntax.Node) bool {
		if err != nil {
			return false
		}
		if c.redirectsOnly {
			err = c.redirectsIn(n)
			return err == nil
		}
		switch n := n.(type) {
		case *syntax.CallExpr:
			sub := *c
			sub.stdin = stdins[n]
			err = sub.call(n)
		case *syntax.DeclClause:
			err = c.decl(n)
		case *syntax.CoprocClause:
			if err = c.evaluates(n); err == nil {
				err = c.coprocName(n)
			}
		case *syntax.Stmt:
			if ce, ok := n.Cmd.(*syntax.CallExpr); ok && len(n.Redirs) > 0 {
				var in input
				if in, err = c.stdinOf(n.Redirs); err != nil {
					break
				}
				if in.known {
					if stdins == nil {
						stdins = map[*syntax.CallExpr]input{}
					}
					stdins[ce] = in
				}
			}
			err = c.redirects(n.Redirs)
		case *syntax.CmdSubst:
			if c.allowList() {
				err = c.refuse("command substitution %s: under bash.allow what it runs cannot be checked; run it on its own and use its output", shown(c.text(n)))
			}
		case *syntax.ProcSubst:
			if c.allowList() {
				err = c.refuse("process substitution %s: under bash.allow what it runs cannot be checked", shown(c.text(n)))
			}
		default:
			err = c.evaluates(n)
		}
		return err == nil
	})
	return err
}

// coprocName checks "coproc NAME <redirections>": the parser takes NAME
// for the coprocess's name, but bash runs it as a command, with the
// redirections.
func (c *checker) coprocName(cp *syntax.CoprocClause) error {
	if cp.Name == nil || cp.Stmt == nil || cp.Stmt.Cmd != nil {
		return nil
	}
	words, err := c.words([]*syntax.Word{cp.Name})
	if err != nil || len(words) == 0 {
		return err
	}
	sub := *c
	if sub.stdin, err = c.stdinOf(cp.Stmt.Redirs); err != nil {
		return err
	}
	return sub.command(words)
}

// redirectsIn checks node for a line checked for its redirections only.
func (c *checker) redirectsIn(node syntax.Node) error {
	switch n := node.(type) {
	case *syntax.Stmt:
		return c.redirects(n.Redirs)
	case *syntax.CallExpr:
		// Words that cannot be read (quoted text with a substitution
		// that does not parse) may say anything.
		words, err := c.words(n.Args)
		if err != nil || len(words) > 0 && mayChangeDir(words) {
			c.line.cd = true
		}
	}
	return nil
}

// call checks a simple command: its assignments, then its words.
func (c *checker) call(ce *syntax.CallExpr) error {
	for _, a := range ce.Assigns {
		if err := c.assign(a); err != nil {
			return err
		}
		if a.Name != nil && a.Value != nil && a.Array == nil && a.Index == nil {
			vs, err := c.words([]*syntax.Word{a.Value})
			if err != nil {
				return err
			}
			w := shWord{text: a.Name.Value + "=", src: c.text(a)}
			for _, v := range vs {
				w.text += v.text
			}
			c.assigns = append(c.assigns, w)
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
		return c.refuse("%s: wrappers nested too deeply to check", shown(joinSrc(words)))
	}
	name := words[0]
	switch {
	case !name.literal() && c.allowList():
		return c.refuse("command %s: its name %s is only known when the line runs; under bash.allow write command names out", shown(joinSrc(words)), shown(name.src))
	case !name.literal():
		c.line.cd = true // it may be cd
		if err := c.match(words); err != nil {
			return err
		}
		return c.git(words)
	case c.allowList() && strings.ContainsFunc(name.text, unicode.IsSpace):
		// Words are matched joined by spaces: a name with a space in it
		// would pass for a name and its first argument.
		return c.refuse("command %s: its name %s holds white space; under bash.allow command names are single words", shown(joinSrc(words)), shown(name.src))
	}
	base := path.Base(name.text)
	switch base {
	case "cd", "pushd", "popd":
		c.line.cd = true
	case "eval", "source", ".":
		if c.allowList() {
			return c.refuse("%s: %s runs text the rules cannot see; under bash.allow it is refused", shown(joinSrc(words)), base)
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
	if rules := c.p.bash.deny; len(rules) > 0 {
		if err := c.denied(words, rules); err != nil {
			return err
		}
	}
	if rules := c.p.bash.allow; len(rules) > 0 {
		var b strings.Builder
		for i, w := range words {
			switch {
			case i > 0:
				b.WriteByte(' ')
				b.WriteString(w.text)
			case w.literal():
				b.WriteString(commandName(w.text, false))
			default:
				b.WriteByte(dyn)
			}
		}
		s := b.String()
		for i := range rules {
			if rules[i].must(s) {
				return nil
			}
		}
		return &Denial{"bash.allow", fmt.Sprintf("command %s is not covered by bash.allow (%s)", shown(joinSrc(words)), patternTexts(rules))}
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
