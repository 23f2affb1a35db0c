package policy

import (
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
			return gl, fmt.Errorf("git %s runs git's commands from another directory", clip(w.src))
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
			return gl, fmt.Errorf("git option %s is not one git has, or not one the checker knows", clip(w.src))
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
}

// gitCommand describes one git command's options that run a program,
// write a file they name, or give configuration.
type gitCommand struct {
	refused string // the whole command is refused: why
	// operands refuses the command when its first operand is a key.
	operands map[string]string
	// runs are long options that run a program; their abbreviations
	// (which git accepts) too. runShort are short ones.
	runs     []string
	runShort string
	// valued are the short options that take a value (so that a
	// cluster such as -xCMD is read right); attached those whose
	// optional value can only be attached (-S[KEYID]).
	valued, attached string
	// writes are long options whose value is a file written;
	// writeShort the short ones.
	writes     []string
	writeShort string
	// config are options whose value is a setting KEY=VALUE.
	config      []string
	configShort string
	resumable   bool
}

var gitCommands = map[string]gitCommand{
	// Options that run a program: the remote's upload-pack or
	// receive-pack (run through a shell for local and ssh remotes), the
	// command of archive --remote, rebase's commands between steps,
	// grep's pager.
	"fetch":      {runs: []string{"upload-pack"}},
	"pull":       {runs: []string{"upload-pack"}},
	"ls-remote":  {runs: []string{"upload-pack", "exec"}},
	"fetch-pack": {runs: []string{"upload-pack", "exec"}},
	"push":       {runs: []string{"receive-pack", "exec"}},
	"send-pack":  {runs: []string{"receive-pack", "exec"}},
	"archive":    {runs: []string{"exec"}, writes: []string{"output"}, writeShort: "o", valued: "o"},
	"clone": {runs: []string{"upload-pack", "template"}, runShort: "u", valued: "obucj",
		config: []string{"config"}, configShort: "c"},
	"init":        {runs: []string{"template"}},
	"rebase":      {runs: []string{"exec"}, runShort: "x", valued: "xsXC", attached: "S", resumable: true},
	"cherry-pick": {resumable: true},
	"revert":      {resumable: true},
	"grep":        {runs: []string{"open-files-in-pager"}, runShort: "O", valued: "efABCm"},
	// Operands that run a program, or schedule git to run outside the
	// agent.
	"bisect":      {operands: map[string]string{"run": "git bisect run runs the command it is given"}},
	"submodule":   {operands: map[string]string{"foreach": "git submodule foreach runs the command it is given in every submodule"}},
	"maintenance": {operands: map[string]string{"start": "git maintenance start schedules git to run outside the agent", "register": "git maintenance register schedules git to run outside the agent"}},
	// Options naming a file the command writes (like --output, which
	// every command that shows a diff takes).
	"format-patch": {writes: []string{"output-directory"}, writeShort: "o", valued: "ov"},
	"config":       {writes: []string{"file"}, writeShort: "f", valued: "f"},
	// Commands that run programs whatever their arguments. difftool and
	// mergetool start a tool even when none is configured (vimdiff),
	// which reads its own configuration and environment (VIMINIT).
	"difftool":         {refused: "git difftool runs a program to show each diff (vimdiff when none is configured), which runs what its own configuration and environment say"},
	"mergetool":        {refused: "git mergetool runs a program to resolve each conflict (vimdiff when none is configured), which runs what its own configuration and environment say"},
	"filter-branch":    {refused: "git filter-branch runs the shell commands it is given"},
	"send-email":       {refused: "git send-email runs mail programs and commands it is given"},
	"instaweb":         {refused: "git instaweb starts a web server and a browser"},
	"web--browse":      {refused: "git web--browse starts a browser"},
	"daemon":           {refused: "git daemon serves repositories and runs access hooks"},
	"shell":            {refused: "git shell runs the commands of ~/git-shell-commands"},
	"credential":       {refused: "git credential runs credential helpers and hands out passwords"},
	"credential-store": {refused: "git credential-store hands out stored passwords"},
	"credential-cache": {refused: "git credential-cache hands out cached passwords"},
}

// gitArgs returns what a git command does with args beyond the command
// itself.
func gitArgs(cmd string, args []shWord) gitFindings {
	var f gitFindings
	rule := gitCommands[cmd]
	if rule.refused != "" {
		f.refuse = rule.refused
		return f
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
	if len(operands) > 0 && f.refuse == "" {
		f.refuse = rule.operands[operands[0].text]
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
		f.refuse = fmt.Sprintf("git %s %s runs a program named on its command line, which the rules cannot check", cmd, clip(w.src))
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
			f.refuse = fmt.Sprintf("git %s %s runs a program named on its command line, which the rules cannot check", cmd, clip(w.src))
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
// the command line or configuration git may not run with.
func (g *GitRules) CheckArgs(args []string) (GitInvocation, error) {
	words := make([]shWord, len(args))
	for i, a := range args {
		if strings.IndexByte(a, dyn) >= 0 {
			return GitInvocation{}, &Denial{"bash", "a git argument contains a NUL byte"}
		}
		words[i] = shWord{text: a, src: a}
	}
	gl, err := parseGitLine(words)
	if err != nil {
		return GitInvocation{}, &Denial{"bash", err.Error()}
	}
	var inv GitInvocation
	for _, w := range gl.repo {
		inv.Repo = append(inv.Repo, w.text)
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
	inv.Resumes = f.resumes
	return inv, nil
}
