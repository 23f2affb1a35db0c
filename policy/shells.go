package policy

import (
	"path"
	"slices"
	"strings"
)

// shell returns what a shell run with args runs: the script of -c, or its
// standard input. A script file is not followed, but a name that stands
// for standard input (-, /dev/stdin, /dev/fd/N, /proc/PID/fd/N) is
// standard input.
func (c *checker) shell(name string, args []shWord) ([]runs, error) {
	lang := shellLanguage(name)
	p, err := c.parseOpts(name, args, optSpec{flags: "abcefhiklmnprstuvxBCEHPT", valued: "oO", plus: true,
		long: []string{"login", "noprofile", "norc", "posix", "restricted", "verbose", "debugger", "dump-strings",
			"dump-po-strings", "noediting", "pretty-print", "version", "help"},
		longVal: []string{"rcfile", "init-file"}})
	cmdMode := strings.Contains(p.short, "c")
	switch {
	case err != nil && lang == langUnsupported:
		return []runs{{unknown: "takes options the checker does not know for " + name}}, nil
	case err != nil:
		return nil, err
	}
	// An interactive bash (-i) runs its --rcfile first.
	for _, rc := range append(p.values("", "rcfile"), p.values("", "init-file")...) {
		if rs := c.scriptFile(rc, lang); rs != nil {
			return rs, nil
		}
	}
	switch {
	case cmdMode && len(p.rest) == 0:
		return nil, nil // an error in the shell
	case cmdMode && lang == langUnsupported:
		return []runs{{unknown: "runs a " + name + " script, which the checker cannot parse"}}, nil
	case cmdMode:
		return []runs{scriptWord(p.rest[0], lang)}, nil
	case strings.Contains(p.short, "s"):
		return []runs{c.stdinScript(lang, "")}, nil
	}
	rest := p.rest
	if len(rest) > 0 && rest[0].text == "-" {
		rest = rest[1:] // a lone "-" ends the options
	}
	if len(rest) == 0 {
		return []runs{c.stdinScript(lang, "")}, nil
	}
	return c.scriptFile(rest[0], lang), nil
}

// scriptFile returns what reading the script file named w, in language
// lang, runs: nothing the checker can follow, unless the name stands for
// standard input (whose literal here-document is checked) or is only
// known when the line runs.
func (c *checker) scriptFile(w shWord, lang shellLang) []runs {
	switch {
	case !w.literal():
		return []runs{{unknown: "reads a script whose name " + shown(w.src) + " is only known when the line runs"}}
	case stdinName(w.text):
		return []runs{c.stdinScript(lang, " ("+w.text+")")}
	case c.readsStdin(w.text):
		return []runs{{unknown: "reads the commands it runs from standard input (" + w.text + ")"}}
	}
	return nil
}

// readsStdin reports whether the file name stands for standard input or
// another open descriptor, such as a here-document's.
func (c *checker) readsStdin(name string) bool {
	if name == "-" {
		return true
	}
	if c.p.env.FoldCase {
		name = strings.ToLower(FoldName(name)) // /DEV/STDIN is /dev/stdin there
	}
	p := name
	if !path.IsAbs(p) {
		// After a cd, "stdin" or "0" may be in /dev or /dev/fd.
		if base := path.Base(p); c.line.cd && (base == "stdin" || strings.Trim(base, "0123456789") == "") {
			return true
		}
		p = path.Join(c.line.cwd, p)
	}
	p = path.Clean(p)
	return p == "/dev/stdin" || strings.HasPrefix(p, "/dev/fd/") ||
		strings.HasPrefix(p, "/proc/") && strings.Contains(p, "/fd/")
}

// sourced returns what source and . run: the file is not followed, unless
// it stands for standard input or is only known when the line runs.
func (c *checker) sourced(args []shWord) []runs {
	if len(args) > 1 && args[0].text == "-p" {
		args = args[2:] // bash 5.3: a search path
	}
	if len(args) > 0 && args[0].text == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		return nil
	}
	return c.scriptFile(args[0], c.lang)
}

// su returns the command of su -c (a script for the target user's shell,
// which may be a POSIX shell or bash) or, without one, the shell reading
// standard input. A login shell (-, -l) starts in the target user's home.
func (c *checker) su(args []shWord) []runs {
	for _, a := range args {
		t := a.text
		if t == "-" || t == "--login" || strings.HasPrefix(t, "-") && !strings.HasPrefix(t, "--") && strings.Contains(t, "l") {
			c.line.cd = true
		}
	}
	for i, a := range args {
		var script *shWord
		switch {
		case a.text == "-c" || a.text == "--command" || a.text == "--session-command":
			if i+1 < len(args) {
				script = &args[i+1]
			}
		case strings.HasPrefix(a.text, "--command=") || strings.HasPrefix(a.text, "--session-command="):
			_, v, _ := strings.Cut(a.text, "=")
			script = &shWord{text: v, src: a.src}
		default:
			continue
		}
		if script == nil || !script.literal() {
			return []runs{{unknown: "runs a command that is only known when the line runs"}}
		}
		return []runs{{script: script.text, isScript: true, lang: langSh}}
	}
	return []runs{{unknown: "starts a shell that reads its commands from standard input"}}
}

// runuser -u USER [--] COMMAND runs the command itself; otherwise
// runuser reads its words as su does.
func (c *checker) runuser(args []shWord) ([]runs, error) {
	if !slices.ContainsFunc(args, func(w shWord) bool {
		return w.text == "-u" || strings.HasPrefix(w.text, "--user") || strings.HasPrefix(w.text, "-u") && !strings.HasPrefix(w.text, "--")
	}) {
		return c.su(args), nil
	}
	p, err := c.parseOpts("runuser", args, optSpec{flags: "lmpPfh", valued: "ugGswc",
		long:    names("login preserve-environment pty help version"),
		longVal: names("user group supp-group shell whitelist-environment command session-command")})
	if err != nil {
		return nil, err
	}
	if p.has("l", "login") {
		c.line.cd = true
	}
	if cs := append(p.values("c", "command"), p.values("", "session-command")...); len(cs) > 0 {
		return []runs{scriptWord(cs[len(cs)-1], langSh)}, nil
	}
	if len(p.rest) == 0 {
		return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
	}
	return runsInheriting(p.rest), nil
}

func (c *checker) watch(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("watch", args, optSpec{flags: "bcdegtpwqrx", valued: "nq",
		long: []string{"beep", "color", "no-color", "differences", "errexit", "chgexit", "no-title", "precise",
			"no-wrap", "no-linewrap", "exec", "help", "version"},
		longVal: []string{"interval", "equexit", "shotsdir"}})
	if err != nil {
		return nil, err
	}
	if p.has("x", "exec") {
		return runsCommand(p.rest), nil
	}
	if len(p.rest) == 0 {
		return nil, nil
	}
	return []runs{c.joined(p.rest, langSh)}, nil // watch runs sh -c
}

// mapfileCallback returns the callback of mapfile -C: a command bash
// evaluates with two more words, the line's index and text.
func (c *checker) mapfileCallback(name string, args []shWord) ([]runs, error) {
	p, err := c.parseOpts(name, args, optSpec{flags: "t", valued: "dnOsuCc"})
	if err != nil {
		return nil, err
	}
	var rs []runs
	for _, cb := range p.values("C", "") {
		if !cb.literal() {
			return []runs{{unknown: "sets a callback that is only known when the line runs"}}, nil
		}
		rs = append(rs, runs{script: cb.text + ` "$1" "$2"`, isScript: true, lang: c.lang})
	}
	return rs, nil
}

// trapRuns returns the action of trap ACTION SIGNAL...: a script the shell
// runs when a signal arrives or the shell exits.
func trapRuns(args []shWord, lang shellLang) []runs {
	for len(args) > 0 && (args[0].text == "-p" || args[0].text == "-l" || args[0].text == "-P") {
		args = args[1:]
	}
	if len(args) > 0 && args[0].text == "--" {
		args = args[1:]
	}
	if len(args) < 2 {
		return nil // prints traps, or resets one
	}
	action := args[0]
	switch {
	case !action.literal():
		return []runs{{unknown: "sets a trap whose action is only known when the line runs"}}
	case action.text == "-" || action.text == "":
		return nil
	}
	return []runs{{script: action.text, isScript: true, lang: lang}}
}

// aliasRuns returns the values of alias NAME=VALUE: text the shell may run
// in place of NAME.
func aliasRuns(args []shWord, lang shellLang) []runs {
	var rs []runs
	for _, a := range args {
		_, v, ok := strings.Cut(a.text, "=")
		switch {
		case !ok:
		case !a.literal():
			rs = append(rs, runs{unknown: "defines an alias only known when the line runs"})
		default:
			rs = append(rs, runs{script: v, isScript: true, lang: lang})
		}
	}
	return rs
}
