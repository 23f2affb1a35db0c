package policy

import (
	"slices"
	"strings"
)

// Interpreters run program text given in an option (python -c, perl -e,
// node --eval) or read from standard input, in languages the checker
// cannot read; editors and database shells run commands from their
// options, their files and their standard input, shell commands among
// them. Under bash.allow that text is refused with the reason: only a
// script file named on the command line is allowed, as bash's own script
// files are (not followed).

// interp describes an interpreter's options.
type interp struct {
	spec optSpec
	// code are the options whose value is program text (short letters
	// and long names).
	code []string
	// hidden are options that load code or settings the checker cannot
	// see (php -d auto_prepend_file=..., node --env-file).
	hidden []string
	// interactive are options after which it reads program text from
	// standard input.
	interactive []string
	// module are options that name the program to run instead of a
	// script operand (python -m), or find it themselves (node --test).
	module []string
}

// interpreter returns the options of interpreter name, or nil.
func interpreter(name string) *interp {
	switch base := strings.TrimRight(name, "0123456789."); base {
	case "python", "pypy":
		return &interp{
			spec: optSpec{flags: "bBdEhiIOPqsSuvVx", valued: "cmWX",
				long: names("help version help-env help-xoptions help-all"), longVal: names("check-hash-based-pycs")},
			code: []string{"c"}, interactive: []string{"i"}, module: []string{"m"},
		}
	case "perl":
		return &interp{
			spec: optSpec{flags: "acfhnpsStTuUvwWX", valued: "eEIMm", attached: "0CDdilFx",
				long: names("help version")},
			code: []string{"e", "E", "M", "m"}, hidden: []string{"d"},
		}
	case "ruby", "jruby":
		return &interp{
			spec: optSpec{flags: "acdhlnpsSvwyU", valued: "eCEIr", attached: "0FiWxKT",
				long: names(`version verbose help copyright yydebug jit yjit enable disable encoding external-encoding
					internal-encoding backtrace-limit dump crash-report`)},
			code: []string{"e"},
		}
	case "node", "nodejs", "bun":
		return &interp{
			spec: optSpec{flags: "hvcpi", valued: "erC", lenient: true,
				long: names("help version check interactive test watch"),
				longVal: names(`eval print require import loader experimental-loader conditions title input-type
					env-file env-file-if-exists run`)},
			code:        []string{"e", "eval", "p", "print", "import", "loader", "experimental-loader"},
			hidden:      []string{"env-file", "env-file-if-exists", "run"},
			interactive: []string{"i", "interactive"},
			module:      []string{"test"},
		}
	case "php":
		return &interp{
			spec: optSpec{flags: "aeHhilmnsvw", valued: "cdfzrBRFESt",
				long: names("ini rf rc re rz ri help version"), longVal: nil},
			code: []string{"r", "B", "R", "F", "E"}, hidden: []string{"c", "d", "z", "S"}, interactive: []string{"a"},
		}
	case "lua", "luajit":
		return &interp{spec: optSpec{flags: "ivEW", valued: "elj"}, code: []string{"e"}, hidden: []string{"j"}, interactive: []string{"i"}}
	case "Rscript", "R":
		return &interp{
			spec: optSpec{valued: "ef", lenient: true, longVal: names("file")},
			code: []string{"e"},
		}
	case "julia":
		return &interp{
			spec: optSpec{flags: "hviq", valued: "eEL", lenient: true, longVal: names("eval print load")},
			code: []string{"e", "E", "eval", "print"}, interactive: []string{"i"},
		}
	case "tclsh", "wish":
		return &interp{spec: optSpec{longVal: nil, flags: "", valued: ""}}
	case "expect":
		return &interp{spec: optSpec{flags: "bdinNv", valued: "cfD"}, code: []string{"c"}, interactive: []string{"i"}}
	case "dc":
		return &interp{
			spec: optSpec{flags: "hV", valued: "ef", long: names("help version"), longVal: names("expression file")},
			code: []string{"e", "expression"},
		}
	}
	return nil
}

// commandShell reports whether name runs commands of its own language
// from its options, files and standard input, shell commands among them:
// editors, database shells, debuggers. Under bash.allow they are refused.
func commandShell(name string) string {
	switch name {
	case "ed", "red", "ex", "vi", "vim", "view", "vimdiff", "rvim", "rview", "nvim", "gvim", "evim", "emacs",
		"emacsclient", "nano", "pico", "joe", "jed", "mg", "micro", "kak", "hx", "helix", "sudoedit", "sensible-editor", "editor":
		return "is an editor, which runs commands from its options, files and standard input (! runs a shell)"
	case "sqlite3", "psql", "mysql", "mariadb", "mongo", "mongosh", "duckdb", "cqlsh", "clickhouse-client":
		return "is a database shell, whose commands (.shell, \\!, system) can run shell commands"
	case "gdb", "lldb", "cgdb", "pdb":
		return "is a debugger, which runs commands from its options, files and standard input (shell among them)"
	case "pwsh", "powershell", "m4", "mail", "mailx", "ftp", "tftp", "irb", "jshell", "ghci", "sbcl", "clisp",
		"guile", "racket", "scheme", "osascript", "mutt", "neomutt", "lftp", "smbclient", "gnuplot", "octave", "octave-cli":
		return "runs commands in its own language from its options, files and standard input, which the checker cannot read"
	}
	return ""
}

// interpreterRuns returns what interpreter name runs: refused program
// text, or nothing for a script file.
func (c *checker) interpreterRuns(name string, in *interp, args []shWord) ([]runs, error) {
	hidden := func(why string) ([]runs, error) {
		return []runs{{unknown: why, allowOnly: true}}, nil
	}
	p, err := c.parseOpts(name, args, in.spec)
	if err != nil {
		if !c.allowList() {
			return nil, nil
		}
		return nil, err
	}
	for _, v := range p.vals {
		switch {
		case slices.Contains(in.code, v.name):
			return hidden("runs program text given with " + optionSpelling(v.name) + ", which the checker cannot read; run a script file instead")
		case slices.Contains(in.hidden, v.name):
			return hidden("loads code or settings named by " + optionSpelling(v.name) + ", which the checker cannot see")
		}
	}
	for _, m := range in.module {
		if p.has(shortName(m), longName(m)) {
			return nil, nil // runs a module or test files: files, not followed
		}
	}
	for _, o := range in.interactive {
		if p.has(shortName(o), longName(o)) {
			return hidden("reads program text from standard input (" + optionSpelling(o) + ")")
		}
	}
	if len(p.rest) == 0 || stdinName(p.rest[0].text) || c.readsStdin(p.rest[0].text) {
		return hidden("reads its program from standard input, which the checker cannot read")
	}
	if !p.rest[0].literal() {
		return hidden("runs a script whose name " + shown(p.rest[0].src) + " is only known when the line runs")
	}
	return nil, nil
}

func optionSpelling(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// atRuns returns what at and batch schedule: the script of a literal
// here-document, a file named with -f (not followed), or an unknown.
// Listing, removing and showing jobs runs nothing.
func (c *checker) atRuns(name string, args []shWord) ([]runs, error) {
	p, err := c.parseOpts(name, args, optSpec{flags: "VmMlvkrdcbhs", valued: "qfut", permute: true})
	if err != nil {
		return nil, err
	}
	if strings.ContainsAny(p.short, "lrdchV") || name == "atq" || name == "atrm" {
		return nil, nil
	}
	c.line.cd = true // the job runs later, wherever at starts it
	if fs := p.values("f", ""); len(fs) > 0 {
		return c.scriptFile(fs[len(fs)-1], langSh), nil
	}
	return []runs{c.stdinScript(langSh, " (the job at runs later)")}, nil
}

// crontabRuns returns what crontab installs: the commands of a literal
// crontab given on standard input, each a script for /bin/sh run later
// in the home directory. A crontab file is not followed; editing one (-e)
// runs an editor on standard input.
func (c *checker) crontabRuns(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("crontab", args, optSpec{flags: "elrisxTV", valued: "uc"})
	switch {
	case err != nil:
		return nil, err
	case strings.ContainsAny(p.short, "lrT"):
		return nil, nil
	case p.has("e", ""):
		return []runs{{unknown: "edits the crontab with an editor that reads standard input", allowOnly: true}}, nil
	case len(p.rest) > 0 && !stdinName(p.rest[0].text):
		return c.scriptFile(p.rest[0], langSh), nil
	case !c.stdin.known:
		return []runs{{unknown: "installs a crontab read from standard input, whose commands run later"}}, nil
	}
	c.line.cd = true
	return c.crontabLines(c.stdin.text)
}

// crontabLines returns the commands of a crontab: after five time fields
// or an @name, the rest of a line is a command for /bin/sh, where an
// unescaped % ends the command and starts its standard input. A line
// setting a variable that steers the shell (SHELL, PATH) is refused.
func (c *checker) crontabLines(text string) ([]runs, error) {
	var rs []runs
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimLeft(line, " \t")
		if line == "" || line[0] == '#' {
			continue
		}
		if name, _, ok := strings.Cut(line, "="); ok && validName(strings.TrimSpace(name)) {
			if c.steers(strings.TrimSpace(name)) {
				return nil, c.refuse("crontab line %s: setting %s changes what its commands run", shown(line), strings.TrimSpace(name))
			}
			continue
		}
		fields := 5
		if line[0] == '@' {
			fields = 1
		}
		cmd := line
		for i := 0; i < fields; i++ {
			cmd = strings.TrimLeft(cmd, " \t")
			j := strings.IndexAny(cmd, " \t")
			if j < 0 {
				return nil, c.refuse("crontab line %s has no command", shown(line))
			}
			cmd = cmd[j:]
		}
		var b strings.Builder
		for i := 0; i < len(cmd); i++ {
			switch {
			case cmd[i] == '\\' && i+1 < len(cmd) && cmd[i+1] == '%':
				b.WriteByte('%')
				i++
				continue
			case cmd[i] == '%':
				i = len(cmd) // the rest is the command's standard input
				continue
			}
			b.WriteByte(cmd[i])
		}
		rs = append(rs, runs{script: b.String(), isScript: true, lang: langSh, via: "the crontab it installs"})
	}
	return rs, nil
}
