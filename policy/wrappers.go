package policy

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// runs is one thing a wrapper command runs.
type runs struct {
	words    []shWord // a command, checked like any other; or
	script   string   // a shell script, parsed and checked; or
	isScript bool
	lang     shellLang
	unknown  string // why what it runs cannot be known
}

// unwrap checks what a wrapper command (sudo, env, xargs, sh -c, ...)
// runs. The wrapper itself has been checked already.
func (c *checker) unwrap(words []shWord) error {
	rs, err := c.wrapped(words)
	if err != nil {
		return err
	}
	for _, r := range rs {
		switch {
		case r.unknown != "":
			return c.refuse("%s %s, so the rules cannot check it", clip(joinSrc(words)), r.unknown)
		case r.isScript:
			err = c.script(r.script, r.lang, c.depth+1)
		case len(r.words) > 0:
			sub := *c
			sub.depth++
			err = sub.command(r.words)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// wrapped returns what the command words runs, when it is a wrapper.
func (c *checker) wrapped(words []shWord) ([]runs, error) {
	name, args := path.Base(words[0].text), words[1:]
	switch name {
	case "sudo", "doas":
		return c.sudo(name, args)
	case "env":
		return c.env(args)
	case "nice", "nohup", "timeout", "time", "command", "builtin", "exec", "stdbuf", "setsid", "ionice", "busybox":
		return c.prefix(name, args)
	case "xargs":
		return c.xargs(args)
	case "find":
		return findExec(args), nil
	case "bash", "rbash", "sh", "dash", "ash", "posh", "ksh", "ksh93", "mksh", "oksh", "zsh", "yash", "fish", "csh", "tcsh":
		return c.shell(name, args)
	case "su", "runuser":
		return suRuns(args), nil
	case "eval":
		return []runs{c.joined(args)}, nil
	case "watch":
		return c.watch(args)
	case "trap":
		return trapRuns(args, c.lang), nil
	case "alias":
		return aliasRuns(args, c.lang), nil
	}
	return nil, nil
}

// skipAssignments drops the NAME=value words env and sudo take before the
// command, refusing those that steer the shell.
func (c *checker) skipAssignments(cmd string, args []shWord) ([]shWord, error) {
	for len(args) > 0 {
		name, _, ok := strings.Cut(args[0].text, "=")
		if !ok || !validName(name) {
			break
		}
		if steersShell(name) {
			return nil, c.refuse("%s %s: setting %s changes what commands run, which the rules cannot follow", cmd, clip(args[0].src), name)
		}
		args = args[1:]
	}
	return args, nil
}

func validName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == ""
}

// runsCommand returns what a wrapper runs when it is the command words,
// or nothing when words is empty.
func runsCommand(words []shWord) []runs {
	if len(words) == 0 {
		return nil
	}
	return []runs{{words: words}}
}

func (c *checker) sudo(name string, args []shWord) ([]runs, error) {
	spec := optSpec{flags: "AbEeHiKklnPSsVv", valued: "CDghpRrTtUu",
		long: []string{"askpass", "background", "bell", "preserve-env", "edit", "help", "set-home", "login",
			"remove-timestamp", "reset-timestamp", "list", "non-interactive", "preserve-groups", "stdin",
			"shell", "version", "validate"},
		longVal: []string{"close-from", "chdir", "group", "host", "prompt", "chroot", "role", "type",
			"command-timeout", "other-user", "user"}}
	if name == "doas" {
		spec = optSpec{flags: "nsL", valued: "uC"}
	}
	p, err := c.parseOpts(name, args, spec)
	if err != nil {
		return nil, err
	}
	rest, err := c.skipAssignments(name, p.rest)
	if err != nil {
		return nil, err
	}
	shell := strings.ContainsAny(p.short, "is") || slices.Contains(p.long, "login") || slices.Contains(p.long, "shell")
	switch {
	case strings.Contains(p.short, "e") || slices.Contains(p.long, "edit"):
		return nil, nil // sudoedit: edits files, runs no command
	case len(rest) == 0 && shell:
		return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
	}
	return runsCommand(rest), nil
}

func (c *checker) env(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("env", args, optSpec{flags: "i0v", valued: "uCS", dash: true,
		long: []string{"ignore-environment", "null", "debug", "list-signal-handling", "ignore-signal",
			"default-signal", "block-signal", "help", "version"},
		longVal: []string{"unset", "chdir", "split-string"}})
	if err != nil {
		return nil, err
	}
	if strings.Contains(p.short, "S") || slices.Contains(p.long, "split-string") {
		return []runs{{unknown: "splits its own command line (-S)"}}, nil
	}
	rest, err := c.skipAssignments("env", p.rest)
	if err != nil {
		return nil, err
	}
	return runsCommand(rest), nil
}

// prefix handles wrappers that take options, perhaps an operand, then a
// command.
func (c *checker) prefix(name string, args []shWord) ([]runs, error) {
	var spec optSpec
	operands := 0
	switch name {
	case "nice":
		spec = optSpec{valued: "n", longVal: []string{"adjustment"}, numeric: true, long: []string{"help", "version"}}
	case "nohup", "builtin", "busybox":
		spec = optSpec{long: []string{"help", "version"}}
	case "timeout":
		spec = optSpec{flags: "fpv", valued: "ks", long: []string{"foreground", "preserve-status", "verbose", "help", "version"},
			longVal: []string{"kill-after", "signal"}}
		operands = 1 // the duration
	case "time":
		spec = optSpec{flags: "pvqa", valued: "fo", long: []string{"portability", "verbose", "quiet", "append", "help", "version"},
			longVal: []string{"format", "output"}}
	case "command":
		spec = optSpec{flags: "pvV"}
	case "exec":
		spec = optSpec{flags: "cl", valued: "a"}
	case "stdbuf":
		spec = optSpec{valued: "ioe", longVal: []string{"input", "output", "error"}, long: []string{"help", "version"}}
	case "setsid":
		spec = optSpec{flags: "cfw", long: []string{"ctty", "fork", "wait", "help", "version"}}
	case "ionice":
		spec = optSpec{flags: "t", valued: "cnpPu", long: []string{"ignore", "help", "version"},
			longVal: []string{"class", "classdata", "pid", "pgid", "uid"}}
	}
	p, err := c.parseOpts(name, args, spec)
	if err != nil {
		return nil, err
	}
	switch {
	case name == "command" && strings.ContainsAny(p.short, "vV"):
		return nil, nil // only says what the name is
	case name == "ionice" && (strings.ContainsAny(p.short, "pPu") || slices.ContainsFunc(p.long, func(s string) bool { return s == "pid" || s == "pgid" || s == "uid" })):
		return nil, nil // changes running processes
	case len(p.rest) <= operands:
		return nil, nil
	}
	return runsCommand(p.rest[operands:]), nil
}

func (c *checker) xargs(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("xargs", args, optSpec{flags: "0prtxo", valued: "adEILnPs", attached: "eil",
		long: []string{"null", "interactive", "no-run-if-empty", "verbose", "exit", "open-tty", "show-limits",
			"help", "version", "eof", "replace", "max-lines"},
		longVal: []string{"arg-file", "delimiter", "max-args", "max-procs", "max-chars", "process-slot-var"}})
	if err != nil {
		return nil, err
	}
	cmd := p.rest
	if len(cmd) == 0 {
		cmd = []shWord{{text: "echo", src: "echo"}}
	}
	// The arguments xargs reads from its input follow.
	cmd = append(cmd[:len(cmd):len(cmd)], dynWord("<input>"))
	return runsCommand(cmd), nil
}

// findExec returns the commands find's -exec, -execdir, -ok and -okdir
// actions run.
func findExec(args []shWord) []runs {
	var rs []runs
	for i := 0; i < len(args); i++ {
		switch args[i].text {
		case "-exec", "-execdir", "-ok", "-okdir":
		default:
			continue
		}
		j := i + 1
		for j < len(args) && args[j].text != ";" && !(args[j].text == "+" && args[j-1].text == "{}") {
			j++
		}
		if len(args[i+1:j]) == 0 {
			rs = append(rs, runs{unknown: "has an " + args[i].text + " action whose command is missing"})
		} else {
			rs = append(rs, runs{words: args[i+1 : j]})
		}
		i = j
	}
	return rs
}

// shell returns what a shell run with args runs: the script of -c, or its
// standard input. A script file is not followed.
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
	case cmdMode && len(p.rest) == 0:
		return nil, nil // an error in the shell
	case cmdMode && lang == langUnsupported:
		return []runs{{unknown: "runs a " + name + " script, which the checker cannot parse"}}, nil
	case cmdMode && !p.rest[0].literal():
		return []runs{{unknown: "runs a script that is only known when the line runs"}}, nil
	case cmdMode:
		return []runs{{script: p.rest[0].text, isScript: true, lang: lang}}, nil
	case strings.Contains(p.short, "s") || len(p.rest) == 0:
		return []runs{{unknown: "reads the commands it runs from standard input"}}, nil
	}
	return nil, nil // runs a script file
}

// suRuns returns the command of su -c (a shell script) or, without one,
// the shell reading standard input.
func suRuns(args []shWord) []runs {
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
		return []runs{{script: script.text, isScript: true, lang: langBash}}
	}
	return []runs{{unknown: "starts a shell that reads its commands from standard input"}}
}

// joined returns the script made of args joined by spaces, as eval and
// watch run them.
func (c *checker) joined(args []shWord) runs {
	texts := make([]string, len(args))
	for i, a := range args {
		if !a.literal() {
			return runs{unknown: fmt.Sprintf("runs text (%s) that is only known when the line runs", clip(a.src))}
		}
		texts[i] = a.text
	}
	return runs{script: strings.Join(texts, " "), isScript: true, lang: c.lang}
}

func (c *checker) watch(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("watch", args, optSpec{flags: "bcdegtpwqrx", valued: "nq",
		long: []string{"beep", "color", "no-color", "differences", "errexit", "chgexit", "no-title", "precise",
			"no-wrap", "no-linewrap", "exec", "help", "version"},
		longVal: []string{"interval", "equexit", "shotsdir"}})
	if err != nil {
		return nil, err
	}
	if strings.Contains(p.short, "x") || slices.Contains(p.long, "exec") {
		return runsCommand(p.rest), nil
	}
	if len(p.rest) == 0 {
		return nil, nil
	}
	return []runs{c.joined(p.rest)}, nil // watch runs sh -c
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
