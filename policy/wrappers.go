package policy

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"strings"
)

// runs is one thing a wrapper command runs.
type runs struct {
	words    []shWord // a command, checked like any other; or
	script   string   // a shell script, parsed and checked; or
	isScript bool
	lang     shellLang
	unknown  string // why what it runs cannot be known
	// allowOnly is set on an unknown that only an allow list refuses:
	// program text the checker cannot read (python -c, make --eval).
	// Deny rules alone cannot see into it, as they cannot see into a
	// script file.
	allowOnly bool
	// elsewhere is set when it runs under another root directory or on
	// another host, where the files it writes cannot be placed.
	elsewhere bool
	// inherit is set when the command reads the wrapper's own standard
	// input: a here-document given to sudo is read by what sudo runs.
	inherit bool
	// nameOnly is set when only the command's name is the caller's to
	// check: it is matched against the rules and not unwrapped.
	nameOnly bool
	// via says how the wrapper comes to run it, for a refusal's message
	// ("--compress-program", "system() in its program").
	via string
	// denyOnly is set when the command is checked against the deny
	// rules only: one of the readings of words whose split the checker
	// is not sure of.
	denyOnly bool
}

// unwrap checks what a wrapper command (sudo, env, xargs, sh -c, ...)
// runs. The wrapper itself has been checked already.
func (c *checker) unwrap(words []shWord) error {
	rs, err := c.wrapped(words)
	if err != nil {
		return err
	}
	for _, r := range rs {
		sub := *c
		sub.depth++
		sub.elsewhere = c.elsewhere || r.elsewhere
		if !r.inherit {
			sub.stdin = input{}
		}
		sub.gitEnv = cmp.Or(c.gitEnv, envResets(words))
		switch {
		case r.unknown != "" && r.allowOnly && !c.allowList():
		case r.unknown != "" && r.allowOnly:
			return c.refuse("%s %s, which the rules cannot check; under bash.allow it is refused", shown(joinSrc(words)), r.unknown)
		case r.unknown != "":
			return c.refuse("%s %s, so the rules cannot check it", shown(joinSrc(words)), r.unknown)
		case r.isScript:
			err = sub.script(r.script, r.lang)
		case r.denyOnly:
			err = sub.denied(r.words, c.p.bash.deny)
		case r.nameOnly:
			err = sub.match(r.words)
		case len(r.words) > 0:
			err = sub.command(r.words)
		}
		var d *Denial
		if r.via != "" && errors.As(err, &d) {
			d.Reason += fmt.Sprintf(" (%s runs it through %s)", path.Base(words[0].text), r.via)
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
	case "nice", "nohup", "timeout", "time", "command", "builtin", "exec", "stdbuf", "setsid", "ionice", "busybox", "toybox":
		return c.prefix(name, args)
	case "xargs":
		return c.xargs(args)
	case "find":
		return c.findExec(args)
	case "bash", "rbash", "sh", "dash", "ash", "posh", "ksh", "ksh93", "mksh", "oksh", "zsh", "yash", "fish", "csh", "tcsh":
		return c.shell(name, args)
	case "su":
		return c.su(args), nil
	case "runuser":
		return c.runuser(args)
	case "eval":
		return []runs{c.joined(args, c.lang)}, nil
	case "source", ".":
		return c.sourced(args), nil
	case "watch":
		return c.watch(args)
	case "trap":
		return trapRuns(args, c.lang), nil
	case "alias":
		return aliasRuns(args, c.lang), nil
	case "mapfile", "readarray":
		return c.mapfileCallback(name, args)
	case "flock", "chrt", "taskset", "unshare", "setpriv", "nsenter", "chroot", "script", "systemd-run":
		return c.launcher(name, args)
	case "run0":
		return c.systemdRun(args) // systemd-run as root, in the same syntax
	case "ssh", "autossh", "sshpass", "ssh-copy-id":
		return c.sshRuns(name, args)
	case "parallel", "sem":
		return []runs{{unknown: "builds the commands it runs from its arguments and input"}}, nil
	}
	if rs, ok, err := c.runnerRuns(name, args); ok {
		return rs, err
	}
	return c.programRuns(name, args)
}

// skipAssignments drops the NAME=value words env and sudo take before the
// command, refusing those that steer the shell. Like env, it takes any
// word with "=" in it for an assignment.
func (c *checker) skipAssignments(cmd string, args []shWord) ([]shWord, error) {
	for len(args) > 0 {
		w := args[0]
		known, _, _ := strings.Cut(w.text, string(dyn))
		name, _, ok := strings.Cut(known, "=")
		switch {
		case ok && c.steers(name):
			return nil, c.refuse("%s %s: setting %s changes what commands run, which the rules cannot follow", cmd, shown(w.src), name)
		case ok:
			c.assigns = append(c.assigns, w)
		case !w.literal():
			return nil, c.refuse("%s %s: whether it sets a variable (PATH, say) or names the command to run is only known when the line runs", cmd, shown(w.src))
		default:
			return args, nil
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

// runsInheriting is runsCommand for a command that reads the wrapper's
// standard input.
func runsInheriting(words []shWord) []runs {
	rs := runsCommand(words)
	for i := range rs {
		rs[i].inherit = true
	}
	return rs
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
	if name == "sudo" && (p.has("D", "chdir") || p.has("i", "login")) {
		c.line.cd = true // runs in another directory, or the target user's home
	}
	switch {
	case name == "sudo" && p.has("R", "chroot"):
		return []runs{{words: rest, elsewhere: true}}, nil
	case p.has("e", "edit"):
		return nil, nil // sudoedit: edits files, runs no command
	case len(rest) == 0 && (p.has("i", "login") || p.has("s", "shell")):
		return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
	}
	return runsInheriting(rest), nil
}

func (c *checker) env(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("env", args, optSpec{flags: "i0v", valued: "uCS", dash: true,
		long: []string{"ignore-environment", "null", "debug", "list-signal-handling", "ignore-signal",
			"default-signal", "block-signal", "help", "version"},
		longVal: []string{"unset", "chdir", "split-string"}})
	if err != nil {
		return nil, err
	}
	if p.has("S", "split-string") {
		return []runs{{unknown: "splits its own command line (-S)"}}, nil
	}
	if p.has("C", "chdir") {
		c.line.cd = true
	}
	rest, err := c.skipAssignments("env", p.rest)
	if err != nil {
		return nil, err
	}
	return runsInheriting(rest), nil
}

// prefix handles wrappers that take options, perhaps an operand, then a
// command.
func (c *checker) prefix(name string, args []shWord) ([]runs, error) {
	var spec optSpec
	operands := 0
	switch name {
	case "nice":
		spec = optSpec{valued: "n", longVal: []string{"adjustment"}, numeric: true, long: []string{"help", "version"}}
	case "nohup", "builtin", "busybox", "toybox":
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
	case name == "command" && p.has("v", "") || name == "command" && p.has("V", ""):
		return nil, nil // only says what the name is
	case name == "ionice" && (strings.ContainsAny(p.short, "pPu") || p.has("", "pid") || p.has("", "pgid") || p.has("", "uid")):
		return nil, nil // changes running processes
	case len(p.rest) <= operands:
		return nil, nil
	}
	return runsInheriting(p.rest[operands:]), nil
}

func (c *checker) xargs(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("xargs", args, optSpec{flags: "0prtxo", valued: "adEILnPs", attached: "eil",
		long: []string{"null", "interactive", "no-run-if-empty", "verbose", "exit", "open-tty", "show-limits",
			"help", "version", "eof", "replace", "max-lines"},
		longVal: []string{"arg-file", "delimiter", "max-args", "max-procs", "max-chars", "process-slot-var"}})
	if err != nil {
		return nil, err
	}
	cmd := append([]shWord(nil), p.rest...)
	if len(cmd) == 0 {
		cmd = []shWord{{text: "echo", src: "echo"}}
	}
	if rs, ok := c.xargsLiteral(cmd, p); ok {
		return rs, nil
	}
	// With -I R (-i, --replace), each R in the command is replaced by
	// what xargs reads: in the command's name or in a script it is code.
	for _, r := range xargsReplace(p) {
		if !r.literal() {
			return []runs{{unknown: "replaces a string only known when the line runs"}}, nil
		}
		for i, w := range cmd {
			if r.text != "" && strings.Contains(w.text, r.text) {
				cmd[i].text = strings.ReplaceAll(w.text, r.text, string(dyn))
			}
		}
	}
	// The arguments xargs reads from its input follow.
	return runsCommand(append(cmd, dynWord("<input>"))), nil
}

// xargsLiteral returns the commands xargs runs when its arguments come
// from a literal here-document or here-string and are split in the
// default way: the command with the real arguments. ok is false when
// they cannot be known.
func (c *checker) xargsLiteral(cmd []shWord, p parsedOpts) (rs []runs, ok bool) {
	if !c.stdin.known || strings.ContainsAny(p.short, "0aEdLlse") {
		return nil, false
	}
	for _, l := range p.long {
		switch l {
		case "null", "arg-file", "delimiter", "max-lines", "max-chars", "eof":
			return nil, false
		}
	}
	var replace *shWord
	switch rs := xargsReplace(p); {
	case len(rs) > 1:
		return nil, false
	case len(rs) == 1 && !rs[0].literal():
		return nil, false
	case len(rs) == 1:
		replace = &rs[0]
	}
	n := 0
	for _, v := range append(p.values("n", ""), p.values("", "max-args")...) {
		if !isNumber(v) {
			return nil, false
		}
		n = 0
		for _, d := range v.text {
			n = min(n*10+int(d-'0'), maxXargsInput)
		}
	}
	return xargsInvocations(cmd, c.stdin.text, n, replace, p.has("r", "no-run-if-empty"))
}

// xargsReplace returns the replace strings of xargs -I, -i and --replace.
func xargsReplace(p parsedOpts) []shWord {
	var rs []shWord
	for _, v := range p.vals {
		switch {
		case v.name == "I":
			rs = append(rs, v.val)
		case (v.name == "i" || v.name == "replace") && v.val.text == "":
			rs = append(rs, shWord{text: "{}", src: v.val.src})
		case v.name == "i" || v.name == "replace":
			rs = append(rs, v.val)
		}
	}
	if p.has("", "replace") && len(p.values("", "replace")) == 0 {
		rs = append(rs, shWord{text: "{}", src: "--replace"})
	}
	return rs
}

// findExec returns the commands find's -exec, -execdir, -ok and -okdir
// actions run. -execdir and -okdir run them in other directories. The
// files -fprint, -fprint0, -fprintf and -fls write are checked like an
// output redirection's.
func (c *checker) findExec(args []shWord) ([]runs, error) {
	var rs []runs
	for _, a := range args {
		if a.splits {
			// Unquoted, it may split into an -exec action.
			return []runs{{unknown: "has a word (" + shown(a.src) + ") only known when the line runs, which may hold an -exec action"}}, nil
		}
	}
	for i := 0; i < len(args); i++ {
		switch args[i].text {
		case "-exec", "-ok":
		case "-execdir", "-okdir":
			c.line.cd = true
		case "-fprint", "-fprint0", "-fprintf", "-fls":
			if i+1 < len(args) {
				if err := c.writesNamed("find "+args[i].text, args[i+1]); err != nil {
					return nil, err
				}
				i++
			}
			continue
		default:
			continue
		}
		j := i + 1
		for j < len(args) && args[j].text != ";" && !(args[j].text == "+" && args[j-1].text == "{}") {
			j++
		}
		cmd := append([]shWord(nil), args[i+1:j]...)
		for k, w := range cmd {
			// find puts a file name in place of {}: in a command's name or
			// in a script it is code.
			cmd[k].text = strings.ReplaceAll(w.text, "{}", string(dyn))
		}
		if len(cmd) == 0 {
			rs = append(rs, runs{unknown: "has an " + args[i].text + " action whose command is missing"})
		} else {
			rs = append(rs, runs{words: cmd})
		}
		i = j
	}
	return rs, nil
}

// joined returns the script made of args joined by spaces, as eval and
// watch run them.
func (c *checker) joined(args []shWord, lang shellLang) runs {
	texts := make([]string, len(args))
	for i, a := range args {
		if !a.literal() {
			return runs{unknown: fmt.Sprintf("runs text (%s) that is only known when the line runs", shown(a.src))}
		}
		texts[i] = a.text
	}
	return runs{script: strings.Join(texts, " "), isScript: true, lang: lang}
}

// scriptWord returns what a shell runs with w as its -c script.
func scriptWord(w shWord, lang shellLang) runs {
	if !w.literal() {
		return runs{unknown: "runs a script that is only known when the line runs"}
	}
	return runs{script: w.text, isScript: true, lang: lang}
}
