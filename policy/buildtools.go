package policy

import (
	"fmt"
	"slices"
	"strings"
)

// Build tools run the project's own code by design: make runs its
// makefile's recipes, go test and cargo test run tests, npm runs
// package.json scripts. A policy cannot stop that, only the programs the
// command line itself names: go -exec, -toolexec, -vettool and the
// linker's -extld, npm --script-shell, cargo --config, make --eval and
// variables set on its command line. Those are checked here.

// hiddenRun is a refused-under-bash.allow unknown.
func hiddenRun(why string) runs { return runs{unknown: why, allowOnly: true} }

// goFlag returns the name of word t when it is a flag of the go command
// ("-exec", "--exec=x"), and its value when attached.
func goFlag(t string) (name, value string, eq bool) {
	if len(t) < 2 || t[0] != '-' {
		return "", "", false
	}
	t = strings.TrimPrefix(t[1:], "-")
	name, value, eq = strings.Cut(t, "=")
	return name, value, eq
}

// goRuns returns what the go command's flags run. Every word is looked
// at, since go test takes flags after its packages; -args ends them.
func (c *checker) goRuns(args []shWord) ([]runs, error) {
	if len(args) > 0 && args[0].text == "env" {
		return nil, c.goEnv(args[1:])
	}
	var rs []runs
	for i := 0; i < len(args); i++ {
		w := args[i]
		if w.text == "-args" || w.text == "--args" {
			break
		}
		if w.splits || w.text != "" && w.text[0] == dyn {
			return nil, c.refuse("go %s: the word is only known when the line runs and may be a flag that runs a program (-exec, -toolexec)", shown(w.src))
		}
		name, v, eq := goFlag(w.text)
		val := shWord{text: v, src: w.src}
		switch name {
		case "exec", "toolexec", "vettool", "ldflags", "gccgoflags", "overlay", "modfile", "C":
			if !eq {
				if i+1 >= len(args) {
					continue
				}
				i++
				val = args[i]
			}
		default:
			continue
		}
		switch name {
		case "exec", "toolexec", "vettool":
			rs = append(rs, optRun{kind: runShell}.runs(c, optVal{name, val})...)
		case "ldflags", "gccgoflags":
			rs = append(rs, goLinkerFlags(c, name, val)...)
		case "overlay", "modfile":
			rs = append(rs, hiddenRun("replaces the project's files with those -"+name+" names, which the checker cannot see"))
		case "C":
			c.line.cd = true
		}
	}
	return rs, nil
}

// goLinkerFlags returns what -ldflags or -gccgoflags run: the go command
// splits the value ("[pattern=]flags") into words, and the linker runs
// the program of -extld and -extar and hands -extldflags to it; gccgo's
// flags go to gcc, whose -wrapper and -B name programs.
func goLinkerFlags(c *checker, name string, val shWord) []runs {
	if !val.literal() {
		return []runs{hiddenRun("takes -" + name + " only known when the line runs, which the go command splits into flags that may name a program (-extld)")}
	}
	if name == "gccgoflags" {
		return []runs{hiddenRun("passes -gccgoflags to gcc, whose flags can name programs (-wrapper, -B)")}
	}
	text := val.text
	if pat, rest, ok := strings.Cut(text, "="); ok && !strings.HasPrefix(text, "-") && !strings.ContainsAny(pat, " \t") {
		text = rest
	}
	fields := strings.Fields(text)
	var rs []runs
	for i, f := range fields {
		n, v, eq := goFlag(strings.Trim(f, `'"`))
		switch n {
		case "extld", "extar":
			if !eq && i+1 < len(fields) {
				v = fields[i+1]
			}
			rs = append(rs, optRun{kind: runShell}.runs(c, optVal{n, shWord{text: strings.Trim(v, `'"`), src: val.src}})...)
		case "extldflags", "tmpdir":
			rs = append(rs, hiddenRun("passes linker flag -"+n+", which can name programs for the external linker"))
		}
	}
	return rs
}

// goEnv refuses go env -w of a variable that changes what later go
// commands run (GOFLAGS=-toolexec=..., CC, GOTOOLCHAIN).
func (c *checker) goEnv(args []shWord) error {
	write := false
	for _, a := range args {
		switch {
		case a.text == "-w":
			write = true
		case !write || strings.HasPrefix(a.text, "-"):
		case !a.literal():
			return c.refuse("go env -w %s: which variable it writes is only known when the line runs", shown(a.src))
		default:
			name, _, _ := strings.Cut(a.text, "=")
			if c.steers(name) || toolVariable(name) {
				return c.refuse("go env -w %s: it writes %s into the go command's configuration, which changes what later go commands run", shown(a.src), name)
			}
		}
	}
	return nil
}

// npmProgram: npm's configuration keys that name programs, given as
// options (npm accepts any unambiguous prefix of a key).
func npmProgram() *optProgram {
	return &optProgram{
		spec: lenient("gDSEOBPvhsqdlpyfc", "wC",
			names(`global save save-dev save-exact save-optional save-bundle save-prod ignore-scripts
				foreground-scripts yes force dry-run workspaces include-workspace-root silent quiet long
				parseable json version help`),
			names(`script-shell shell call node-options git editor browser viewer node-gyp userconfig
				globalconfig init-module onload-script prefix workspace package loglevel registry tag
				scope cache otp`)),
		runs: []optRun{
			{names: []string{"script-shell", "shell", "git", "editor", "browser", "viewer", "node-gyp"}, kind: runNamed},
			{names: []string{"c", "call"}, kind: runShell},
			{names: []string{"node-options"}, kind: runHidden, why: "sets node options for the scripts it runs (--require loads code)"},
			{names: []string{"userconfig", "globalconfig"}, kind: runHidden, why: "reads a configuration file, which can name the shell scripts run with"},
			{names: []string{"init-module", "onload-script"}, kind: runHidden, why: "runs a module named in an option"},
		},
	}
}

// npmRuns returns what npm (or npx) runs besides the package's own
// scripts: programs named by its options, the command of npm exec and
// npx, and configuration that would name programs later.
func (c *checker) npmRuns(name string, args []shWord) ([]runs, error) {
	prog := npmProgram()
	rs, err := c.tableRuns(name, args, prog)
	if err != nil {
		return nil, err
	}
	p, err := c.parseOpts(name, args, prog.spec)
	if err != nil {
		return nil, err
	}
	if p.has("C", "prefix") {
		c.line.cd = true
	}
	rest := p.rest
	sub := "exec"
	if name != "npx" {
		if len(rest) == 0 {
			return rs, nil
		}
		sub, rest = rest[0].text, rest[1:]
	}
	switch sub {
	case "exec", "x":
		if len(p.values("c", "call")) > 0 {
			return rs, nil
		}
		if len(rest) > 0 && rest[0].text == "--" {
			rest = rest[1:]
		}
		if len(rest) == 0 {
			return append(rs, runs{unknown: "starts a shell that reads its commands from standard input"}), nil
		}
		return append(rs, runs{words: rest}), nil
	case "explore":
		if i := indexWord(rest, "--"); i >= 0 && i+1 < len(rest) {
			return append(rs, c.joined(rest[i+1:], langSh)), nil
		}
		return append(rs, runs{unknown: "starts a shell that reads its commands from standard input"}), nil
	case "config", "set", "c":
		if len(rest) > 0 && (rest[0].text == "set" || rest[0].text == "edit") || sub == "set" {
			return append(rs, hiddenRun("changes npm's configuration, which can name the programs later npm commands run")), nil
		}
	case "pkg":
		if len(rest) > 0 && rest[0].text == "set" {
			return append(rs, hiddenRun("changes package.json, whose scripts later npm commands run")), nil
		}
	case "init", "create", "innit", "edit":
		return append(rs, hiddenRun("runs a package or an editor that "+sub+" names")), nil
	case "test", "tst", "t", "start", "stop", "restart", "run", "run-script", "rum", "urn":
		if r, ok := npmScriptArgs(sub, rest); ok {
			return append(rs, r), nil
		}
	}
	return rs, nil
}

// npmScriptArgs returns what npm hands a package script that the rules
// cannot follow: the script's program gets the words after the script's
// name, and node, mocha and test runners load a file they name as code
// (node --test --require FILE, --import, --config, --setupFiles), a file
// the caller may have written wherever it may write. A word naming a
// file (holding a slash) or only known when the line runs is refused
// under bash.allow.
func npmScriptArgs(sub string, rest []shWord) (runs, bool) {
	script := sub
	switch sub {
	case "run", "run-script", "rum", "urn":
		if len(rest) == 0 {
			return runs{}, false
		}
		script, rest = rest[0].text, rest[1:]
	case "tst", "t":
		script = "test"
	}
	for _, w := range rest {
		if w.text != "--" && (!w.literal() || strings.ContainsAny(w.text, `/\`)) {
			return hiddenRun(fmt.Sprintf("hands %s to the package's %s script, whose program may load a file it names as code (node --require, a test runner's --config)",
				shown(w.src), script)), true
		}
	}
	return runs{}, false
}

func indexWord(ws []shWord, t string) int {
	for i, w := range ws {
		if w.text == t {
			return i
		}
	}
	return -1
}

// cargoRuns returns what cargo's options run: --config can set runners,
// linkers, wrappers and aliases, and a toolchain given by path runs its
// programs. Words after "--" go to the program or tests cargo runs.
func (c *checker) cargoRuns(args []shWord) ([]runs, error) {
	for i, w := range args {
		t := w.text
		switch {
		case t == "--":
			return nil, nil
		case w.splits || t != "" && t[0] == dyn:
			return nil, c.refuse("cargo %s: the word is only known when the line runs and may be --config, which can name programs", shown(w.src))
		case i == 0 && strings.HasPrefix(t, "+") && strings.ContainsAny(t, "/\\"):
			return []runs{hiddenRun("uses a toolchain from a directory (" + shown(w.src) + ")")}, nil
		case t == "--config" || strings.HasPrefix(t, "--config=") || len(t) > 2 && strings.HasPrefix("--config", t):
			return []runs{hiddenRun("sets configuration with --config, which can name programs to run (runners, linkers, rustc wrappers, aliases)")}, nil
		}
	}
	return nil, nil
}

func makeSpec() optSpec {
	s := lenient("bmBdeEhiknpqrRsStvwL", "CfIoW",
		names(`always-make debug environment-overrides help ignore-errors keep-going check-symlink-times
			just-print dry-run recon print-data-base question no-builtin-rules no-builtin-variables silent
			quiet no-silent no-keep-going stop touch trace version print-directory no-print-directory
			warn-undefined-variables shuffle jobs load-average output-sync`),
		names(`directory eval file makefile include-dir old-file assume-old what-if new-file assume-new
			jobserver-auth jobserver-style`))
	// -j and -l take an optional number, attached or (as make reads
	// them) the next word; taking the next word as their value is safe,
	// since one that looks like an option is read as one too.
	s.valued += "Ejl"
	s.flags = strings.ReplaceAll(s.flags, "E", "")
	s.attached = "O"
	return s
}

// makeRuns returns what make's options and command-line variables run
// besides the makefile's recipes: --eval text and a makefile read from
// standard input are make's own language, a variable value holding $ can
// call $(shell ...), NAME!=CMD runs CMD, and SHELL, MAKEFLAGS and the
// like change how every recipe runs. Variables make takes from its
// environment are held to the same rules: a recipe that uses one pastes
// its value into a shell command line, whichever way it was set.
func (c *checker) makeRuns(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("make", args, makeSpec())
	if err != nil {
		return nil, err
	}
	var rs []runs
	for _, v := range p.vals {
		switch v.name {
		case "E", "eval":
			rs = append(rs, hiddenRun("evaluates make text given with --eval, which can run commands ($(shell ...))"))
		case "f", "file", "makefile":
			if stdinName(v.val.text) || c.readsStdin(v.val.text) || !v.val.literal() {
				rs = append(rs, hiddenRun("reads a makefile from standard input or a name only known when the line runs"))
			}
		case "C", "directory":
			c.line.cd = true
		}
	}
	for _, w := range append(slices.Clip(c.assigns), p.rest...) {
		r, err := c.makeVariable(w)
		if err != nil {
			return nil, err
		}
		rs = append(rs, r...)
	}
	return rs, nil
}

// recipeSyntax are the characters with which a variable's value, pasted
// into a recipe, ends its command and starts another.
const recipeSyntax = ";&|<>()`\n"

// makeVariable checks one operand of make that sets a variable.
func (c *checker) makeVariable(w shWord) ([]runs, error) {
	i := strings.IndexByte(w.text, '=')
	if i < 0 {
		return nil, nil // a target
	}
	name, value := w.text[:i], w.text[i+1:]
	name = strings.TrimPrefix(name, "override ")
	shellAssign := strings.HasSuffix(name, "!")
	name = strings.TrimSpace(strings.TrimRight(name, ":+?!"))
	switch {
	case strings.IndexByte(name, dyn) >= 0 || strings.ContainsAny(name, "$("):
		return []runs{hiddenRun("sets a make variable whose name is only known when it runs (" + shown(w.src) + ")")}, nil
	case c.steers(name) || name == ".SHELLFLAGS":
		return nil, c.refuse("make %s: setting %s changes how make runs its recipes, which the rules cannot follow", shown(w.src), name)
	case shellAssign && strings.ContainsAny(value, "$"+string(dyn)):
		return []runs{{unknown: "runs a command (" + name + "!=) that make builds when it runs"}}, nil
	case strings.ContainsAny(value, "$"+string(dyn)):
		return []runs{hiddenRun("sets make variable " + name + " to text make expands, which can run commands ($(shell ...))")}, nil
	case shellAssign:
		return []runs{{script: value, isScript: true, lang: langSh, via: name + "!="}}, nil
	case strings.ContainsAny(value, recipeSyntax):
		return []runs{hiddenRun("sets make variable " + name + " to text holding shell syntax (" + shown(w.src) + "), which a recipe using it runs as commands")}, nil
	}
	return nil, nil
}
