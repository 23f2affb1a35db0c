package policy

import (
	"path"
	"strings"

	"mvdan.cc/sh/v3/syntax"
)

// steersShell reports whether setting variable name changes which program
// a command name runs, makes a program run another one (a pager, an
// editor, git's ssh), or makes an interpreter run code by itself (every
// python run imports the module PYTHONWARNINGS names, every java run the
// agent JAVA_TOOL_OPTIONS names). Such variables are refused wherever a
// line sets them, whatever the rules.
func steersShell(name string) bool {
	switch name {
	case "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "SHELL", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS",
		"PS0", "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "BASH_LOADABLES_PATH", "EXECIGNORE", "ZDOTDIR", "FPATH",
		"PAGER", "MANPAGER", "SYSTEMD_PAGER", "LESS", "LESSOPEN", "LESSCLOSE", "EDITOR", "VISUAL", "FCEDIT",
		"SUDO_EDITOR", "SYSTEMD_EDITOR", "SVN_EDITOR", "CVSEDITOR", "HGEDITOR", "PSQL_PAGER", "PSQL_EDITOR",
		"BROWSER", "SSH_ASKPASS", "SUDO_ASKPASS", "GCONV_PATH", "GLIBC_TUNABLES",
		"TAR_OPTIONS", "RSYNC_RSH", "BORG_RSH", "HGRCPATH", "MAILRC",
		// Code every run of an interpreter runs: options it reads
		// from the environment (-r, -M, -javaagent, -eval), start-up
		// code, modules it imports by name.
		"NODE_OPTIONS", "PERL5OPT", "RUBYOPT", "PYTHONWARNINGS", "PYTHONBREAKPOINT", "JAVA_TOOL_OPTIONS",
		"_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "LUA_INIT", "LUA_INIT_5_1", "LUA_INIT_5_2", "LUA_INIT_5_3", "LUA_INIT_5_4",
		"ERL_AFLAGS", "ERL_FLAGS", "ERL_ZFLAGS", "ELIXIR_ERL_OPTIONS", "DOTNET_STARTUP_HOOKS", "CORECLR_ENABLE_PROFILING",
		"CORECLR_PROFILER", "CORECLR_PROFILER_PATH", "NODE_REPL_EXTERNAL_MODULE", "OPENSSL_CONF", "OPENSSL_ENGINES",
		"OPENSSL_MODULES", "GTK_MODULES", "GTK3_MODULES", "GIO_EXTRA_MODULES",
		// The ssh of systemctl -H, git svn and git cvsimport.
		"SYSTEMD_SSH", "SVN_SSH", "CVS_RSH", "CVS_SERVER":
		return true
	}
	for _, prefix := range []string{"LD_", "DYLD_", "GIT_", "BASH_FUNC_"} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// evaluatesValue reports whether bash evaluates what is assigned to
// variable name as arithmetic, as it does for integer variables.
func evaluatesValue(name string) bool {
	switch name {
	case "OPTIND", "RANDOM", "SRANDOM", "HISTCMD":
		return true
	}
	return false
}

// assign checks one variable assignment.
func (c *checker) assign(a *syntax.Assign) error {
	if a.Name != nil && !a.Naked && c.steers(a.Name.Value) {
		return c.refuse("%s: setting %s changes what commands run, which the rules cannot follow; set it in the agent's environment instead", shown(c.text(a)), a.Name.Value)
	}
	if a.Name != nil && evaluatesValue(a.Name.Value) && c.allowList() && (a.Value == nil || !numberWord(a.Value.Parts)) {
		return c.refuseArith(a)
	}
	if a.Index != nil && c.allowList() && !indexLiteral(a.Index) {
		return c.refuseArith(a)
	}
	if a.Value != nil {
		if _, err := c.words([]*syntax.Word{a.Value}); err != nil {
			return err
		}
	}
	if a.Array != nil {
		for _, e := range a.Array.Elems {
			if e.Index != nil && c.allowList() && !indexLiteral(e.Index) {
				return c.refuseArith(e)
			}
			if e.Value == nil {
				continue
			}
			if _, err := c.words([]*syntax.Word{e.Value}); err != nil {
				return err
			}
		}
	}
	return nil
}

// decl checks export, declare, local, readonly, typeset and nameref: as a
// command, each of its assignments, and the variables it sets.
func (c *checker) decl(dc *syntax.DeclClause) error {
	words := []shWord{{text: dc.Variant.Value, src: dc.Variant.Value}}
	for _, a := range dc.Args {
		if err := c.assign(a); err != nil {
			return err
		}
		w := shWord{src: c.text(a)}
		if a.Name != nil {
			w.text = a.Name.Value
		}
		if a.Value != nil {
			vs, err := c.words([]*syntax.Word{a.Value})
			if err != nil {
				return err
			}
			for _, v := range vs {
				if a.Name != nil {
					w.text += "="
				}
				w.text += v.text
			}
		}
		words = append(words, w)
	}
	if err := c.declares(words); err != nil {
		return err
	}
	return c.match(words)
}

// declares checks the words of a declaration command after quote
// removal: "declare 'PATH=/x'" sets PATH as surely as PATH=/x does.
// Namerefs make a later assignment set a variable the line does not name,
// and integer variables evaluate what is assigned to them as arithmetic.
func (c *checker) declares(words []shWord) error {
	variant := path.Base(words[0].text)
	opts, names, err := c.declOpts(words)
	if err != nil {
		return err
	}
	nameref := variant == "nameref" || variant != "export" && strings.Contains(opts, "n")
	switch {
	case c.allowList() && nameref:
		return c.refuse("%s: a nameref makes later assignments set a variable the line does not name; under bash.allow namerefs are refused", shown(joinSrc(words)))
	case c.allowList() && strings.Contains(opts, "i") && variant != "export" && variant != "readonly":
		return c.refuse("%s cannot be checked: arithmetic on variables (an integer variable evaluates what is assigned to it); under bash.allow it is refused", shown(joinSrc(words)))
	}
	// export -n takes a variable out of the environment commands get.
	lookOnly := strings.ContainsAny(opts, "pfF") || variant == "export" && !strings.Contains(opts, "n") || variant == "readonly"
	for _, w := range names {
		name, value, isAssign := strings.Cut(w.text, "=")
		if err := c.setsVar(variant, w, strings.TrimSuffix(name, "+"), !isAssign && lookOnly); err != nil {
			return err
		}
		if c.allowList() && variant != "export" && !compoundLiteral(value) {
			// declare -a a="$x" assigns an array when x is "([i]=v)",
			// subscripts and all, as does declare a="$x" when a is one.
			return c.refuse("%s %s cannot be checked: arithmetic on variables (a value that is, or may be, an array assignment has its subscripts evaluated); under bash.allow subscripts are literal numbers", variant, shown(w.src))
		}
		if nameref {
			if err := c.namerefTarget(variant, w, value, isAssign); err != nil {
				return err
			}
		}
	}
	return nil
}

// declOpts splits the arguments of a declaration into its options and
// the variables it names. A word only known at run time where an option
// may be could be either.
func (c *checker) declOpts(words []shWord) (opts string, names []shWord, err error) {
	args := words[1:]
	for i, w := range args {
		t := w.text
		switch {
		case t == "--":
			return opts, args[i+1:], nil
		case t == "" || t[0] == dyn || (t[0] == '-' || t[0] == '+') && !w.literal():
			return "", nil, c.refuse("%s: %s is only known when the line runs, so what %s declares cannot be checked", shown(joinSrc(words)), shown(w.src), words[0].text)
		case (t[0] == '-' || t[0] == '+') && len(t) > 1:
			opts += t[1:]
		default:
			return opts, args[i:], nil
		}
	}
	return opts, nil, nil
}

// compoundLiteral reports whether a value a declaration assigns is not an
// array assignment such as "([i]=a)", or is one whose subscripts are
// literal numbers. A value that starts with a part only known at run time
// may be one.
func compoundLiteral(value string) bool {
	switch {
	case value == "" || value[0] != '(' && value[0] != dyn:
		return true
	case strings.IndexByte(value, dyn) >= 0:
		return false
	}
	for rest := value; ; {
		_, after, ok := strings.Cut(rest, "[")
		if !ok {
			return true
		}
		sub, tail, ok := strings.Cut(after, "]")
		if !ok || !subscriptText(sub) {
			return false
		}
		rest = tail
	}
}

// namerefTarget checks what a nameref refers to: a variable named in the
// line that does not steer the shell.
func (c *checker) namerefTarget(cmd string, w shWord, target string, isAssign bool) error {
	base, _, _ := strings.Cut(target, "[")
	switch {
	case !isAssign:
		return c.refuse("%s %s: a nameref without a target lets a later assignment choose the variable it sets", cmd, shown(w.src))
	case strings.IndexByte(base, dyn) >= 0:
		return c.refuse("%s %s: the variable the nameref refers to is only known when the line runs", cmd, shown(w.src))
	case c.steers(base):
		return c.refuse("%s %s: a nameref to %s would set it, which changes what commands run", cmd, shown(w.src), base)
	}
	return nil
}

// setsVar checks name, the variable a command sets (read NAME, printf -v
// NAME, declare NAME=...), perhaps with a subscript: it must be known,
// must not steer the shell (unless keep: the command leaves its value
// alone), and under an allow list its subscript must be a literal, since
// bash evaluates subscripts as arithmetic.
func (c *checker) setsVar(cmd string, w shWord, name string, keep bool) error {
	base, sub, hasSub := strings.Cut(name, "[")
	switch {
	case strings.IndexByte(base, dyn) >= 0:
		return c.refuse("%s %s: which variable it sets is only known when the line runs", cmd, shown(w.src))
	case !validName(base):
		return nil // bash refuses it
	case c.steers(base) && !keep:
		return c.refuse("%s %s: setting %s changes what commands run, which the rules cannot follow; set it in the agent's environment instead", cmd, shown(w.src), base)
	case evaluatesValue(base) && !keep && c.allowList():
		return c.refuse("%s %s cannot be checked: arithmetic on variables (bash evaluates what is assigned to %s); under bash.allow assign it a literal number", cmd, shown(w.src), base)
	case hasSub && c.allowList() && !subscriptText(strings.TrimSuffix(sub, "]")):
		return c.refuse("%s %s cannot be checked: arithmetic on variables (bash evaluates the subscript, and a variable's value in it runs as code); under bash.allow subscripts are literal numbers", cmd, shown(w.src))
	}
	return nil
}
