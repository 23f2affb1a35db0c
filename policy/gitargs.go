package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// gitLine is a git command line split at its command: the global options
// before it, the command, and the command's arguments.
type gitLine struct {
	// repo are the global options that choose the repository or set
	// configuration (-C, --git-dir, --work-tree, --bare, -c,
	// --config-env), with their values: git config --list is given them
	// to see what the command would.
	repo     []shWord
	settings []gitCLISetting // -c and --config-env
	command  shWord          // text "" when there is none (--version, ...)
	args     []shWord
	// open is set when a word only known at run time stands where a
	// global option may: the command and its arguments are unknown.
	open bool
}

// gitCLISetting is configuration given on git's command line.
type gitCLISetting struct {
	key, value string
	noValue    bool
	fromEnv    bool // --config-env: the value is an environment variable's
	literal    bool // the setting is known before the line runs
}

var (
	// gitGlobalValued are git's global options that take the next word
	// as their value; those before "|" also take "=value".
	gitGlobalValued = []string{"-C", "-c", "--shallow-file", "|", "--git-dir", "--work-tree", "--namespace", "--super-prefix", "--config-env"}
	gitGlobalFlags  = []string{"-p", "--paginate", "-P", "--no-pager", "--no-replace-objects", "--bare", "--literal-pathspecs",
		"--no-literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs", "--no-optional-locks"}
	// gitGlobalInfo print something and exit (--help runs git help).
	gitGlobalInfo = []string{"--exec-path", "--html-path", "--man-path", "--info-path", "-v", "--version", "-h", "--help"}
	// gitRepoOptions choose the repository or set configuration.
	gitRepoOptions = []string{"-C", "-c", "--git-dir", "--work-tree", "--bare", "--config-env"}
)

// parseGitLine splits the words after "git". It refuses global options
// git does not have (git would refuse them too) and --exec-path=DIR,
// which runs git's programs from another directory.
func parseGitLine(words []shWord) (gitLine, error) {
	var gl gitLine
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !w.literal() {
			// --git-dir="$d" is --git-dir; "$opt" may be anything.
			known, _, _ := strings.Cut(w.text, string(dyn))
			name, _, eq := strings.Cut(known, "=")
			if eq && slices.Index(gitGlobalValued, name) > slices.Index(gitGlobalValued, "|") {
				gl.global(name, w, shWord{text: w.text[len(name)+1:], src: w.src})
				continue
			}
			gl.open = true
			return gl, nil
		}
		t := w.text
		name, value, eq := strings.Cut(t, "=")
		valuedAt := slices.Index(gitGlobalValued, name)
		switch {
		case !strings.HasPrefix(t, "-"):
			gl.command, gl.args = w, words[i+1:]
			return gl, nil
		case name == "--exec-path" && eq:
			return gl, fmt.Errorf("git %s runs git's commands from another directory", shown(w.src))
		case name == "--list-cmds" && eq, slices.Contains(gitGlobalInfo, t):
			return gl, nil
		case slices.Contains(gitGlobalFlags, t):
			if t == "--bare" {
				gl.repo = append(gl.repo, w)
			}
		case valuedAt > slices.Index(gitGlobalValued, "|") && eq:
			gl.global(name, w, shWord{text: value, src: w.src})
		case valuedAt >= 0 && !eq && t != "|":
			if i+1 == len(words) {
				return gl, nil // git says the value is missing
			}
			i++
			gl.global(name, w, words[i])
		default:
			return gl, fmt.Errorf("git option %s is not one git has, or not one the checker knows", shown(w.src))
		}
	}
	return gl, nil
}

// global records global option name, given as opt, with value v.
func (gl *gitLine) global(name string, opt, v shWord) {
	if slices.Contains(gitRepoOptions, name) {
		if opt.text == name {
			gl.repo = append(gl.repo, opt, v)
		} else {
			gl.repo = append(gl.repo, opt)
		}
	}
	switch name {
	case "-c":
		key, value, hasValue := strings.Cut(v.text, "=")
		gl.settings = append(gl.settings, gitCLISetting{key: normaliseGitKey(key), value: value, noValue: !hasValue, literal: v.literal()})
	case "--config-env":
		key, _, _ := strings.Cut(v.text, "=")
		gl.settings = append(gl.settings, gitCLISetting{key: normaliseGitKey(key), fromEnv: true, literal: v.literal()})
	}
}

// gitFindings are what a git command's arguments do beyond the command
// itself.
type gitFindings struct {
	refuse   string          // why the command line is refused
	writes   []shWord        // files it writes, named by its options
	settings []gitCLISetting // configuration it applies (git clone -c)
	// resumes is set for rebase, cherry-pick and revert with --continue
	// or --skip: they carry on with steps kept in the repository.
	resumes bool
	// open is set when a word only known at run time may be an option.
	open bool
	// runsGit are the arguments of a git command it runs (git
	// for-each-repo runs one in each repository it lists).
	runsGit []shWord
}

// gitArgs returns what a git command does with args beyond the command
// itself.
func gitArgs(cmd string, args []shWord) gitFindings {
	var f gitFindings
	rule := gitCommandRule(cmd)
	switch {
	case rule.refused != "":
		f.refuse = rule.refused
		return f
	case cmd == "config":
		if f.refuse = gitConfigWrites(args); f.refuse != "" {
			return f
		}
	case cmd == "for-each-repo":
		f.runsGit = gitForEachRepo(args)
	}
	var operands []shWord
	for i := 0; i < len(args) && f.refuse == ""; i++ {
		w := args[i]
		known, _, _ := strings.Cut(w.text, string(dyn))
		switch {
		case !w.literal() && (known == "" || known == "-"):
			f.open = true // it may be any option
		case w.text == "--":
			operands = append(operands, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(w.text, "--"):
			i += f.long(cmd, rule, args[i:])
		case strings.HasPrefix(w.text, "-") && len(w.text) > 1:
			i += f.short(cmd, rule, args[i:])
		default:
			operands = append(operands, w)
		}
	}
	if rule.operands != nil && f.refuse == "" {
		f.refuse = rule.operands(args, operands)
	}
	// git bundle create FILE writes FILE.
	if cmd == "bundle" && len(operands) > 1 && operands[0].text == "create" {
		f.writes = append(f.writes, operands[1])
	}
	return f
}

// long reads the long option args[0] and returns how many following
// words are its value.
func (f *gitFindings) long(cmd string, rule gitCommand, args []shWord) int {
	w := args[0]
	name, value, eq := strings.Cut(w.text[2:], "=")
	if strings.IndexByte(name, dyn) >= 0 {
		f.open = true // it may be any option
		return 0
	}
	valueWord := shWord{text: value, src: w.src}
	skip := 0
	if !eq && len(args) > 1 {
		valueWord, skip = args[1], 1
	}
	switch {
	case name == "":
	case abbreviates(name, rule.runs...):
		f.refuse = rule.runsRefusal(cmd, w)
	case rule.resumable && abbreviates(name, "continue", "skip"):
		f.resumes = true
	case abbreviates(name, "output") || abbreviates(name, rule.writes...):
		f.writes = append(f.writes, valueWord)
		return skip
	case abbreviates(name, rule.config...):
		f.settings = append(f.settings, cliSetting(valueWord))
		return skip
	}
	return 0
}

// runsRefusal says why option w of git cmd, one of rule.runs, is refused.
func (rule gitCommand) runsRefusal(cmd string, w shWord) string {
	if rule.runsWhy != "" {
		return fmt.Sprintf("git %s %s %s, which the rules cannot check", cmd, shown(w.src), rule.runsWhy)
	}
	return fmt.Sprintf("git %s %s runs a program named on its command line, which the rules cannot check", cmd, shown(w.src))
}

// abbreviates reports whether name is one of names or an abbreviation of
// one (git accepts any unambiguous one; an ambiguous one it refuses).
func abbreviates(name string, names ...string) bool {
	return name != "" && slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, name) })
}

// short reads the cluster of short options args[0] and returns how many
// following words are a value.
func (f *gitFindings) short(cmd string, rule gitCommand, args []shWord) int {
	w := args[0]
	t := w.text
	for j := 1; j < len(t); j++ {
		ch := t[j]
		if ch == dyn {
			f.open = true
			return 0
		}
		if strings.IndexByte(rule.runShort, ch) >= 0 {
			f.refuse = rule.runsRefusal(cmd, w)
			return 0
		}
		if strings.IndexByte(rule.attached, ch) >= 0 {
			return 0
		}
		if strings.IndexByte(rule.valued, ch) < 0 {
			continue
		}
		value, skip := shWord{text: t[j+1:], src: w.src}, 0
		if j == len(t)-1 {
			if len(args) < 2 {
				return 0
			}
			value, skip = args[1], 1
		}
		switch {
		case strings.IndexByte(rule.writeShort, ch) >= 0:
			f.writes = append(f.writes, value)
		case strings.IndexByte(rule.configShort, ch) >= 0:
			f.settings = append(f.settings, cliSetting(value))
		}
		return skip
	}
	return 0
}

func cliSetting(v shWord) gitCLISetting {
	key, value, hasValue := strings.Cut(v.text, "=")
	return gitCLISetting{key: normaliseGitKey(key), value: value, noValue: !hasValue, literal: v.literal()}
}

// checkSettings refuses configuration given on the command line that git
// may not run with.
func (g *GitRules) checkSettings(settings []gitCLISetting) error {
	for _, s := range settings {
		if !s.literal {
			continue // the guard checks it when the line runs
		}
		e := GitConfigEntry{Scope: "command", Origin: "command line:", Key: s.key, Value: s.value, NoValue: s.noValue}
		if s.fromEnv {
			// The value comes from the environment; the guard checks it.
			if g.allowedAnyValue(e) {
				continue
			}
		} else if g.allowed(e) {
			continue
		}
		if err := g.CheckConfig([]GitConfigEntry{e}); err != nil {
			return err
		}
	}
	return nil
}

// allowedAnyValue reports whether key e.Key may be given on the command
// line whatever its value, as far as values can be told apart.
func (g *GitRules) allowedAnyValue(e GitConfigEntry) bool {
	e.Value = "x"
	return g.allowed(e)
}

// GitInvocation is what git's guard needs to know about a git command
// line the rules allow.
type GitInvocation struct {
	// Repo are the global options that choose the repository or set
	// configuration, to give git config --list.
	Repo []string
	// Resumes is set for rebase, cherry-pick and revert with --continue
	// or --skip: they carry on with steps kept in the repository, which
	// must be checked (CheckGitTodo).
	Resumes bool
}

// CheckArgs checks the arguments of a git command line (those after
// "git") as git's guard sees them when the command runs, every word
// known: it returns a *Denial for options that run a program named on
// the command line, configuration git may not run with, and a command
// line the policy's deny rules refuse (with git's global options, or
// without them: "git -C dir push" is "git push" too). The guard sees
// every git process, also those git and other programs start, so a deny
// rule holds through whatever runs git.
func (g *GitRules) CheckArgs(args []string) (GitInvocation, error) {
	words := make([]shWord, len(args))
	for i, a := range args {
		if strings.IndexByte(a, dyn) >= 0 {
			return GitInvocation{}, &Denial{"bash", "a git argument contains a NUL byte"}
		}
		words[i] = shWord{text: a, src: a}
	}
	return g.checkArgs(words, 0)
}

func (g *GitRules) checkArgs(words []shWord, depth int) (GitInvocation, error) {
	if depth > maxDepth {
		return GitInvocation{}, &Denial{"bash", "git commands nested too deeply to check"}
	}
	gl, err := parseGitLine(words)
	if err != nil {
		return GitInvocation{}, &Denial{"bash", err.Error()}
	}
	var inv GitInvocation
	for _, w := range gl.repo {
		inv.Repo = append(inv.Repo, w.text)
	}
	if err := g.denied(words, gl); err != nil {
		return inv, err
	}
	if err := g.checkSettings(gl.settings); err != nil {
		return inv, err
	}
	f := gitArgs(gl.command.text, gl.args)
	if f.refuse != "" {
		return inv, &Denial{"bash", f.refuse}
	}
	if err := g.checkSettings(f.settings); err != nil {
		return inv, err
	}
	if f.runsGit != nil {
		if _, err := g.checkArgs(f.runsGit, depth+1); err != nil {
			return inv, err
		}
	}
	inv.Resumes = f.resumes
	return inv, nil
}

// denied checks git with args against the deny rules: as written, and
// with the global options left out.
func (g *GitRules) denied(args []shWord, gl gitLine) error {
	if len(g.deny) == 0 {
		return nil
	}
	git := shWord{text: "git", src: "git"}
	if err := denyMatch(append([]shWord{git}, args...), g.deny); err != nil {
		return err
	}
	if gl.command.text == "" || len(gl.args)+1 == len(args) {
		return nil
	}
	return denyMatch(append([]shWord{git, gl.command}, gl.args...), g.deny)
}

// CheckAlias checks what a git command line runs when its command is an
// alias the configuration entries define (aliases the operator allows
// with bash.git.allow_config): git expands one that does not start with
// "!" into a git command line of its own, which is checked like args,
// deny rules included. isCommand reports whether a name is one of git's
// commands, which win over aliases. An alias that starts with "!" runs a
// shell command; it is the operator's to allow, and it is not checked.
func (g *GitRules) CheckAlias(args []string, entries []GitConfigEntry, isCommand func(string) bool) error {
	for range maxDepth {
		words := make([]shWord, len(args))
		for i, a := range args {
			words[i] = shWord{text: a, src: a}
		}
		gl, err := parseGitLine(words)
		cmd := gl.command.text
		if err != nil || gl.open || cmd == "" || isCommand(cmd) {
			return nil
		}
		value, found := "", false
		for _, e := range entries {
			if e.Key == "alias."+strings.ToLower(cmd) {
				value, found = e.Value, true
			}
		}
		if !found || strings.HasPrefix(value, "!") {
			return nil
		}
		expanded, ok := splitGitCmdline(value)
		if !ok || len(expanded) == 0 {
			return nil // git refuses it
		}
		next := slices.Clone(args[:len(args)-len(gl.args)-1])
		next = append(append(next, expanded...), args[len(args)-len(gl.args):]...)
		if _, err := g.CheckArgs(next); err != nil {
			var d *Denial
			if errors.As(err, &d) {
				d.Reason += fmt.Sprintf(" (git alias %s runs %s)", cmd, shown(value))
			}
			return err
		}
		args = next
	}
	return &Denial{"bash", "git aliases nested too deeply to check"}
}

// splitGitCmdline splits an alias's value into words as git does: at
// white space, with single and double quotes, and backslashes outside
// single quotes. ok is false for an unterminated quote, which git
// refuses.
func splitGitCmdline(s string) (words []string, ok bool) {
	var b strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote == '\'' && ch == '\'', quote == '"' && ch == '"':
			quote = 0
		case quote != '\'' && ch == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
			inWord = true
		case quote != 0:
			b.WriteByte(ch)
		case ch == '\'' || ch == '"':
			quote, inWord = ch, true
		case strings.IndexByte(" \t\n\r\f\v", ch) >= 0: // isspace()
			if inWord {
				words = append(words, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteByte(ch)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, false
	}
	if inWord {
		words = append(words, b.String())
	}
	return words, true
}
