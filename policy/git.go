package policy

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// Under command rules git runs through the agent's git guard, which is
// first in the PATH bash gets: it checks the configuration the command
// would use (see gitconfig.go) and what its arguments run, then runs the
// real git with settings that turn off what configuration could make it
// run. The checker makes sure every git in a line gets there: by its
// name, with the agent's environment, and refuses what is plain to see
// on the line (options that run programs, configuration given with -c,
// files written by --output) with a message before anything runs.

// gitPrograms are git's own programs besides git: they read a
// repository's configuration and run its hooks.
var gitPrograms = []string{"git-receive-pack", "git-upload-pack", "git-upload-archive", "git-shell", "git-cvsserver",
	"git-http-backend", "git-daemon", "scalar"}

// GitRules returns the git rules of the policy's command rules, or nil
// when it has none: git then runs as it is.
func (p *Policy) GitRules() *GitRules {
	if p == nil || p.rules.Bash.empty() {
		return nil
	}
	return p.git
}

// GitGuarded reports whether the policy was read for an agent that runs
// git through its git guard (Env.GitGuarded).
func (p *Policy) GitGuarded() bool { return p != nil && p.env.GitGuarded }

func (p *Policy) compileGit() []error {
	allow := p.rules.Bash.Git.AllowConfig
	var errs []error
	if len(allow) > 0 && p.rules.Bash.empty() {
		errs = append(errs, fmt.Errorf("bash.git.allow_config: has no effect without bash.allow or bash.deny: git is guarded only under command rules"))
	}
	g, err := newGitRules(allow, p.bash.deny)
	if err != nil {
		errs = append(errs, fmt.Errorf("bash.git.allow_config: %w", err))
	}
	p.git = g
	return errs
}

// git checks a command that is git, or one of git's programs.
func (c *checker) git(words []shWord) error {
	name := words[0]
	if !name.literal() {
		if c.gitEnv != "" {
			return c.refuse("%s: the command %s is only known when the line runs and may be git, which %s", shown(joinSrc(words)), shown(name.src), c.gitEnv)
		}
		return nil
	}
	base := path.Base(name.text)
	switch {
	case strings.HasPrefix(base, "git-credential"):
		return c.refuse("%s: %s", shown(joinSrc(words)), strings.Replace(gitCredentialRefusal, "git credential and", base+": git credential and", 1))
	case base != "git" && !slices.Contains(gitPrograms, base) && !(strings.HasPrefix(base, "git-") && strings.Contains(name.text, "/")):
		return nil
	case !c.p.env.GitGuarded:
		return c.refuse("%s: git is refused on this host: it runs programs its repository's configuration names (hooks, filters, aliases, core.fsmonitor), and this agent cannot run it through its git guard", shown(joinSrc(words)))
	case base != "git":
		return c.refuse("%s: %s is part of git and reads the repository's configuration; run it as git COMMAND, which the agent's git guard checks", shown(joinSrc(words)), base)
	case name.text != "git":
		return c.refuse("%s: run git by its name, so that it runs through the agent's git guard, which checks the configuration it would use", shown(joinSrc(words)))
	case c.gitEnv != "":
		return c.refuse("%s: git %s, so the agent's git guard and its settings would not apply", shown(joinSrc(words)), c.gitEnv)
	}
	return c.gitArgs(words)
}

// gitArgs refuses what the arguments of a git command plainly run, the
// configuration they give, and files they write that the path rules do
// not allow. Words only known at run time are the guard's to check.
func (c *checker) gitArgs(words []shWord) error {
	gl, err := parseGitLine(words[1:])
	if err != nil {
		return c.refuse("%s: %v", shown(joinSrc(words)), err)
	}
	g := c.p.git
	if err := g.checkSettings(gl.settings); err != nil {
		return err
	}
	if gl.open {
		return c.gitOpen(words)
	}
	// "git -C dir push" is "git push" to a deny rule.
	if gl.command.text != "" && len(gl.args)+2 < len(words) {
		if err := c.denied(append([]shWord{words[0], gl.command}, gl.args...), c.p.bash.deny); err != nil {
			return err
		}
	}
	f := gitArgs(gl.command.text, gl.args)
	switch {
	case f.refuse != "":
		return c.refuse("%s: %s", shown(joinSrc(words)), f.refuse)
	case f.open:
		if err := c.gitOpen(words); err != nil {
			return err
		}
	}
	if err := g.checkSettings(f.settings); err != nil {
		return err
	}
	for _, w := range f.writes {
		if err := c.gitWrites(words, w); err != nil {
			return err
		}
	}
	if f.runsGit != nil {
		// git for-each-repo runs git with these words in each repository.
		sub := c.nested(c.src)
		return sub.command(append([]shWord{words[0]}, f.runsGit...))
	}
	return nil
}

// gitOpen refuses, when the path rules restrict writing, a git command
// with a word only known when the line runs where an option may be: it
// may be --output=FILE.
func (c *checker) gitOpen(words []shWord) error {
	if !c.p.hasOwnPathRules(Write) {
		return nil
	}
	return c.refuse("%s: a word only known when the line runs may be an option such as --output=FILE, which writes a file the path rules must check; write options out, and put paths after --", shown(joinSrc(words)))
}

// gitWrites checks file w, which a git option writes, like an output
// redirection's target.
func (c *checker) gitWrites(words []shWord, w shWord) error {
	return c.writesNamed(shown(joinSrc(words))+" writes", w)
}

// envResets says how a wrapper with words runs its command without the
// environment the agent gives bash (its PATH, which finds the git guard
// first, and git's settings), or "" when it keeps it.
func envResets(words []shWord) string {
	name, args := path.Base(words[0].text), words[1:]
	switch name {
	case "sudo", "doas", "su", "runuser":
		return "runs under " + name + ", which resets the environment and PATH"
	case "systemd-run", "run0", "pkexec", "ssh", "autossh", "chroot", "nsenter", "unshare", "bwrap", "firejail":
		return "runs under " + name + ", in another environment or file system"
	case "env":
		return envOptionsReset(args)
	case "exec":
		if shortOption(args, 'c', "a") {
			return "runs under exec -c, which clears the environment"
		}
	case "command":
		if shortOption(args, 'p', "") {
			return "runs under command -p, which looks programs up in a default PATH"
		}
	case "setpriv":
		for _, a := range args {
			if n, _, _ := strings.Cut(strings.TrimPrefix(a.text, "--"), "="); strings.HasPrefix(a.text, "--") && abbreviates(n, "reset-env") || !a.literal() {
				return "runs under setpriv --reset-env, which resets the environment"
			}
		}
	case "bash", "rbash", "sh", "dash", "ash", "posh", "ksh", "ksh93", "mksh", "oksh", "zsh", "yash":
		if shellLogin(args) {
			return "runs in a login or interactive shell, whose start-up files may set PATH"
		}
	}
	return ""
}

// envOptionsReset says whether env's options clear the environment or
// unset PATH.
func envOptionsReset(args []shWord) string {
	const why = "runs under env with the environment cleared or PATH unset"
	for i := 0; i < len(args); i++ {
		t := args[i].text
		switch {
		case !args[i].literal():
			known, _, _ := strings.Cut(t, string(dyn))
			if known == "" || strings.HasPrefix(known, "-") {
				return why
			}
			return ""
		case t == "-":
			return why
		case t == "--":
			return ""
		case strings.HasPrefix(t, "--"):
			n, v, eq := strings.Cut(t[2:], "=")
			switch {
			case abbreviates(n, "ignore-environment"):
				return why
			case abbreviates(n, "unset"):
				if !eq && i+1 < len(args) {
					i++
					v = args[i].text
				}
				if v == "PATH" || strings.IndexByte(v, dyn) >= 0 {
					return why
				}
			case (abbreviates(n, "chdir") || abbreviates(n, "split-string")) && !eq:
				i++
			}
		case strings.HasPrefix(t, "-") && len(t) > 1:
			if envShortReset(args, &i) {
				return why
			}
		case strings.Contains(t, "="):
		default:
			return ""
		}
	}
	return ""
}

// envShortReset reads env's cluster of short options args[*i], moving *i
// past a value in the next word, and reports whether it clears the
// environment (-i) or unsets PATH (-u PATH).
func envShortReset(args []shWord, i *int) bool {
	t := args[*i].text
	for j := 1; j < len(t); j++ {
		switch t[j] {
		case 'i':
			return true
		case 'u', 'C', 'S':
			v := t[j+1:]
			if v == "" && *i+1 < len(args) {
				*i++
				v = args[*i].text
			}
			return t[j] == 'u' && (v == "PATH" || strings.IndexByte(v, dyn) >= 0)
		}
	}
	return false
}

// shortOption reports whether the options of a builtin such as exec or
// command (short ones only, before the command) include opt; valued are
// the options that take the next word. A word only known when the line
// runs may be any option.
func shortOption(args []shWord, opt byte, valued string) bool {
	for i := 0; i < len(args); i++ {
		t := args[i].text
		switch {
		case !args[i].literal():
			known, _, _ := strings.Cut(t, string(dyn))
			return known == "" || strings.HasPrefix(known, "-")
		case t == "--" || len(t) < 2 || t[0] != '-':
			return false
		case strings.IndexByte(t[1:], opt) >= 0:
			return true
		case strings.ContainsAny(t[len(t)-1:], valued):
			i++
		}
	}
	return false
}

// shellLogin reports whether a shell's options make it a login or an
// interactive shell, which reads start-up files.
func shellLogin(args []shWord) bool {
	for i := 0; i < len(args); i++ {
		t := args[i].text
		switch {
		case !args[i].literal():
			known, _, _ := strings.Cut(t, string(dyn))
			return known == "" || strings.HasPrefix(known, "-")
		case t == "--login" || t == "--rcfile" || t == "--init-file":
			return true
		case t == "--" || t == "-" || len(t) < 2 || t[0] != '-' && t[0] != '+':
			return false
		case strings.HasPrefix(t, "--"):
		case t[0] == '-' && strings.ContainsAny(t[1:], "il"):
			return true
		case strings.ContainsAny(t[1:], "oO"):
			i++ // -o OPTION
		}
	}
	return false
}
