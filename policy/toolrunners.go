package policy

import (
	"slices"
	"strings"
)

// Tools whose options name a program to run, a shell command, a library
// or a script to load: split --filter, tcpdump -z, netcat's -e and -c,
// socat's EXEC and SYSTEM addresses, aria2c's --on-download-* hooks,
// dpkg's and apt's invoke hooks, gpg's photo viewer and helper programs,
// svn's diff and editor commands, hg's hooks and aliases, cmake -E and its
// cache variables naming compilers, the C compilers' -wrapper, plugins
// and program prefixes, openssl's engines and providers, container
// commands. Each is checked as the command or script it is, refused when
// it is only known when the line runs, or refused under bash.allow when
// it is code the checker cannot read (a library, a script file named by
// an option).

// toolProgram returns the option table of a tool of this file, or nil.
func toolProgram(name string) *optProgram {
	switch name {
	case "split", "gsplit":
		return splitProgram()
	case "tcpdump":
		return tcpdumpProgram()
	case "nc", "netcat", "nc.traditional", "ncat":
		return netcatProgram(name)
	case "aria2c":
		return aria2Program()
	case "dpkg":
		return dpkgProgram()
	case "gpg", "gpg2", "gpgsm":
		return gpgProgram()
	case "svn":
		return svnProgram()
	case "tcc":
		return &optProgram{spec: lenient("", "", nil, nil), prepare: singleDashLong,
			runs: []optRun{{names: []string{"run"}, kind: runHidden, flag: true, why: "runs the C program it compiles (-run)"}}}
	}
	return nil
}

// splitProgram: split --filter=CMD writes each piece through the shell
// command CMD.
func splitProgram() *optProgram {
	return &optProgram{
		spec: lenient("dxeu", "abClnt", names("elide-empty-files unbuffered verbose help version numeric-suffixes hex-suffixes"),
			names("suffix-length additional-suffix bytes line-bytes lines number separator filter")),
		runs: []optRun{{names: []string{"filter"}, kind: runShell}},
	}
}

// tcpdumpProgram: tcpdump -z CMD runs CMD on each file it rotates out.
func tcpdumpProgram() *optProgram {
	return &optProgram{
		spec: lenient("AbdDefgHhIJKLlnNOpqStuUvx#", "BcCEFGimMQrstTVwWyYzZ", nil,
			names("relinquish-privileges interface snapshot-length time-stamp-type direction count print-sampling")),
		runs: []optRun{{names: []string{"z"}, kind: runProgram, args: [][]string{{string(dyn)}}}},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			for _, v := range p.values("w", "") {
				if err := c.writesNamed("tcpdump -w", v); err != nil {
					return nil, err
				}
			}
			return nil, nil
		},
	}
}

// netcatProgram: nc -e PROG runs PROG on the connection and -c CMD a
// shell command; ncat also takes --exec, --sh-exec and --lua-exec.
func netcatProgram(name string) *optProgram {
	prog := &optProgram{
		spec: lenient("46bCdDhklnNrStuUvz", "cegGiIomOpPqsTwx", nil, nil),
		runs: []optRun{
			{names: []string{"e"}, kind: runShell},
			{names: []string{"c"}, kind: runShell},
		},
	}
	if name == "ncat" {
		prog.spec = lenient("46CdhklnuvzU", "cegGimopsw", nil, names(`exec sh-exec lua-exec output hex-dump append-output
			source proxy proxy-type proxy-auth allow allowfile deny denyfile max-conns idle-timeout wait delay`))
		prog.runs = []optRun{
			{names: []string{"e", "exec", "c", "sh-exec"}, kind: runShell},
			{names: []string{"lua-exec"}, kind: runHidden, why: "runs a Lua script on the connection"},
		}
		prog.extra = func(c *checker, p parsedOpts) ([]runs, error) {
			for _, v := range append(p.values("o", "output"), p.values("", "hex-dump")...) {
				if err := c.writesNamed("ncat --output", v); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}
	}
	return prog
}

// aria2Program: aria2c runs the command an --on-* hook names with three
// arguments; its configuration (--conf-path) and input files (-i) can set
// them too.
func aria2Program() *optProgram {
	hooks := names(`on-download-complete on-download-start on-download-error on-download-pause on-download-stop
		on-bt-download-complete`)
	return &optProgram{
		spec: lenient("hvcjqZ", "dioxsjkm", names("continue quiet help version"), append(hooks, names("conf-path input-file dir out")...)),
		runs: []optRun{
			{names: hooks, kind: runProgram, args: [][]string{{string(dyn), string(dyn), string(dyn)}}},
			{names: []string{"conf-path", "i", "input-file"}, kind: runNever, why: "reads options from a file, which can name commands to run (on-download-complete)"},
		},
	}
}

// dpkgProgram: dpkg runs --pre-invoke, --post-invoke and --status-logger
// commands through the shell; --root and --instdir act on another tree.
func dpkgProgram() *optProgram {
	return &optProgram{
		spec: lenient("iRrPVLlscCAxXefbDgzZO?", "", names("install unpack configure remove purge list status listfiles search help version force-all"),
			names("pre-invoke post-invoke status-logger root instdir admindir log status-fd debug path-include path-exclude")),
		runs: []optRun{
			{names: []string{"pre-invoke", "post-invoke", "status-logger"}, kind: runShell},
		},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			if p.has("", "root") || p.has("", "instdir") {
				c.line.cd = true
			}
			return nil, nil
		},
	}
}

// aptProgram: apt's configuration (-o KEY=VALUE) runs the commands of
// its invoke hooks through the shell (APT::Update::Pre-Invoke,
// DPkg::Post-Invoke, ...), which are checked; keys naming programs or
// their directories (Dir::Bin::*, ProxyAutoDetect, a solver) and
// configuration files (-c) make what runs unknown.
func aptProgram() *optProgram {
	return &optProgram{
		spec: lenient("", "octa", nil, names(`option config-file target-release`)),
		runs: []optRun{
			{names: []string{"c", "config-file"}, kind: runNever,
				why: "reads configuration, which can name commands to run (APT::Update::Pre-Invoke, DPkg::Post-Invoke)"},
		},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			var rs []runs
			for _, v := range append(p.values("o", ""), p.values("", "option")...) {
				key, value, _ := strings.Cut(v.text, "=")
				k := strings.ToLower(key)
				switch {
				case !v.literal():
					rs = append(rs, runs{unknown: "sets configuration only known when the line runs, which can name commands to run"})
				case strings.Contains(k, "invoke") || strings.Contains(k, "pre-install-pkgs"):
					rs = append(rs, scriptWord(shWord{text: value, src: v.src}, langSh))
				case strings.HasPrefix(k, "dir") || strings.Contains(k, "autodetect") || strings.Contains(k, "auto-detect") ||
					strings.HasPrefix(k, "apt::solver") || strings.HasPrefix(k, "apt::planner") || strings.Contains(k, "::options") ||
					strings.Contains(k, "methods") || strings.Contains(k, "::bin") || strings.Contains(k, "hook") || strings.Contains(k, "command"):
					rs = append(rs, runs{unknown: "sets " + shown(key) + ", which names programs apt or dpkg runs"})
				}
			}
			return rs, nil
		},
	}
}

// gpgProgram: gpg runs a photo viewer (--photo-viewer, or the default
// one when it shows photos), helper programs (--agent-program,
// --dirmngr-program, --keyboxd-program) and keyserver helpers from
// --exec-path; --options and --homedir read a configuration that can
// name them all.
func gpgProgram() *optProgram {
	return &optProgram{
		spec: lenient("", "", nil, names(`photo-viewer exec-path agent-program dirmngr-program keyboxd-program options homedir
			list-options verify-options keyserver-options`)),
		runs: []optRun{
			{names: []string{"photo-viewer"}, kind: runShell},
			{names: []string{"agent-program", "dirmngr-program", "keyboxd-program"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"exec-path", "options", "homedir"}, kind: runNever, why: "names a configuration or helper programs gpg runs"},
		},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			for _, v := range append(p.values("", "list-options"), p.values("", "verify-options")...) {
				if strings.Contains(v.text, "show-photo") || !v.literal() {
					return []runs{{unknown: "shows photos, which runs a viewer program (" + shown(v.src) + ")"}}, nil
				}
			}
			return nil, nil
		},
	}
}

// svnProgram: svn runs --diff-cmd and --diff3-cmd with the files to
// compare and --editor-cmd through the shell; --config-option and
// --config-dir can set them and its ssh tunnels too.
func svnProgram() *optProgram {
	return &optProgram{
		spec: lenient("", "rmFcx", nil, names(`diff-cmd diff3-cmd editor-cmd config-option config-dir username password
			revision message file change extensions depth accept`)),
		runs: []optRun{
			{names: []string{"diff-cmd", "diff3-cmd"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"editor-cmd"}, kind: runShell},
			{names: []string{"config-option", "config-dir"}, kind: runNever, why: "sets configuration, which can name programs svn runs (editors, diff tools, ssh tunnels)"},
		},
	}
}

// hgRuns: hg --config SECTION.KEY=VALUE sets hooks (shell commands, or
// python:), aliases ("!" runs a shell command), extensions (python
// code), editors, merge tools and the ssh it runs; -e/--ssh names the
// ssh command, --remotecmd the program run on the other host.
func (c *checker) hgRuns(args []shWord) ([]runs, error) {
	var rs []runs
	for i := 0; i < len(args); i++ {
		w := args[i]
		t := w.text
		var val shWord
		switch {
		case t == "--":
			return rs, nil
		case !w.literal() && (t == "" || t[0] == dyn || w.splits):
			return nil, c.refuse("hg %s: the word is only known when the line runs and may be an option that runs a program (--config hooks.*)", shown(w.src))
		case strings.HasPrefix(t, "--") && hgOption(t) != "":
			name, v, eq := strings.Cut(t, "=")
			t = hgOption(name)
			val = shWord{text: v, src: w.src}
			if !eq {
				if i+1 >= len(args) {
					continue
				}
				i++
				val = args[i]
			}
		case t == "-e" || t == "-R":
			if i+1 >= len(args) {
				continue
			}
			i++
			val = args[i]
		case strings.HasPrefix(t, "-e") && len(t) > 2:
			t, val = "-e", shWord{text: t[2:], src: w.src}
		default:
			continue
		}
		switch t {
		case "-e", "--ssh":
			rs = append(rs, scriptWord(val, langSh))
		case "--remotecmd":
			r := scriptWord(val, langSh)
			r.elsewhere = true
			rs = append(rs, r)
		case "--config":
			r, err := c.hgConfig(val)
			if err != nil {
				return nil, err
			}
			rs = append(rs, r...)
		case "--cwd", "-R", "--repository":
			c.line.cd = true
		}
	}
	return rs, nil
}

// hgOption returns the long option of hg that t (--name or --name=value)
// spells, when it is one that runs a program or changes the repository;
// Python's getopt takes any unambiguous prefix.
func hgOption(t string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(t, "--"), "=")
	for _, o := range []struct {
		full string
		min  int // the shortest prefix that is not another option's
	}{{"config", 4}, {"ssh", 2}, {"remotecmd", 3}, {"cwd", 2}, {"repository", 3}} {
		if len(name) >= o.min && strings.HasPrefix(o.full, name) {
			return "--" + o.full
		}
	}
	return ""
}

// hgConfig returns what one hg --config setting runs.
func (c *checker) hgConfig(w shWord) ([]runs, error) {
	if !w.literal() {
		return []runs{{unknown: "sets configuration only known when the line runs, which can name hooks to run"}}, nil
	}
	key, value, _ := strings.Cut(w.text, "=")
	section, name, _ := strings.Cut(strings.ToLower(key), ".")
	switch {
	case section == "hooks" && strings.HasPrefix(value, "python:"), section == "extensions" && value != "" && value != "!":
		return []runs{hiddenRun("loads python code with hg --config " + shown(key))}, nil
	case section == "hooks":
		return []runs{{script: value, isScript: true, lang: langSh, via: "hg --config " + key}}, nil
	case section == "alias" && strings.HasPrefix(value, "!"):
		return []runs{{script: value[1:], isScript: true, lang: langSh, via: "hg --config " + key}}, nil
	case section == "ui" && (name == "editor" || name == "ssh" || name == "merge"), section == "pager" && name == "pager":
		return []runs{{script: value, isScript: true, lang: langSh, via: "hg --config " + key}}, nil
	case section == "ui" && name == "remotecmd":
		return []runs{{script: value, isScript: true, lang: langSh, elsewhere: true, via: "hg --config " + key}}, nil
	case section == "merge-tools" || section == "extdiff" || section == "diff-tools" || section == "extensions" ||
		section == "web" || section == "hostsecurity" || section == "format" && name == "usestore":
		return []runs{{unknown: "sets " + shown(key) + ", which can name programs hg runs or load code"}}, nil
	}
	return nil, nil
}

// cmakeRuns: cmake -E env|time|chdir runs a command; cmake -E's own file
// commands (rm, copy, rename, make_directory, touch, create_symlink, cat,
// echo, tar) are checked as the programs they stand for (cmake -E rm is
// rm to a deny rule); -P and -C run a cmake script (a file named on the
// command line, not followed, unless it is standard input); cache
// variables that name compilers, launchers, emulators or files to
// include run them when the project is configured.
func (c *checker) cmakeRuns(name string, args []shWord) ([]runs, error) {
	for i := 0; i < len(args); i++ {
		w := args[i]
		t := w.text
		switch {
		case !w.literal() && (t == "" || t[0] == dyn || w.splits):
			return nil, c.refuse("%s %s: the word is only known when the line runs and may be an option that runs a program (-E, -P, -D)", name, shown(w.src))
		case t == "-E":
			return c.cmakeE(args[i+1:])
		case t == "-P" || t == "-C" || t == "--toolchain" || strings.HasPrefix(t, "-C") || strings.HasPrefix(t, "--toolchain="):
			// A script named on the command line is not followed, as
			// bash's are not; one read from standard input is refused.
			file := shWord{text: strings.TrimPrefix(strings.TrimPrefix(t, "--toolchain="), "-C"), src: w.src}
			if t == "-P" || t == "-C" || t == "--toolchain" {
				if i+1 >= len(args) {
					return nil, nil
				}
				i++
				file = args[i]
			}
			if !file.literal() || stdinName(file.text) || c.readsStdin(file.text) {
				return []runs{hiddenRun("runs a cmake script (" + shown(file.src) + ") from standard input or a name only known when the line runs")}, nil
			}
			if t == "-P" {
				return nil, nil // the words after the script are its own
			}
		case t == "-D" && i+1 < len(args) || strings.HasPrefix(t, "-D") && len(t) > 2:
			def := strings.TrimPrefix(t, "-D")
			if t == "-D" {
				i++
				def = args[i].text
			}
			key, _, _ := strings.Cut(def, "=")
			key, _, _ = strings.Cut(key, ":")
			if cmakeProgramVariable(key) {
				return []runs{hiddenRun("sets cmake variable " + shown(key) + ", which names a program or a file of cmake code the build runs")}, nil
			}
		}
	}
	return nil, nil
}

// cmakeProgramVariable reports whether a cmake cache variable names a
// program or cmake code to include.
func cmakeProgramVariable(key string) bool {
	k := strings.ToUpper(key)
	for _, part := range []string{"COMPILER", "LAUNCHER", "LINKER", "TOOLCHAIN", "INCLUDE", "PROGRAM", "EMULATOR", "_AR", "RANLIB",
		"SHELL", "CODE_INJECTION", "PROJECT_", "MODULE_PATH", "PREFIX_PATH", "FIND_ROOT", "DLLTOOL", "OBJCOPY", "STRIP", "NM"} {
		if strings.Contains(k, part) {
			return true
		}
	}
	return false
}

// cmakeFileCommands are cmake -E's commands that stand for programs.
var cmakeFileCommands = map[string]string{
	"rm": "rm", "remove": "rm", "remove_directory": "rm", "copy": "cp", "copy_directory": "cp", "copy_if_different": "cp",
	"copy_directory_if_different": "cp", "rename": "mv", "make_directory": "mkdir", "touch": "touch", "touch_nocreate": "touch",
	"create_symlink": "ln", "create_hardlink": "ln", "cat": "cat", "echo": "echo", "echo_append": "echo", "tar": "tar",
	"chdir": "", "env": "", "time": "",
}

// cmakeE returns what cmake -E COMMAND ARGS runs.
func (c *checker) cmakeE(args []shWord) ([]runs, error) {
	if len(args) == 0 {
		return nil, nil
	}
	sub := args[0]
	rest := args[1:]
	if !sub.literal() {
		return []runs{{unknown: "runs a cmake -E command only known when the line runs"}}, nil
	}
	prog, ok := cmakeFileCommands[sub.text]
	switch {
	case sub.text == "env":
		// cmake -E env [--unset=VAR] [--modify ...] [NAME=VALUE]... COMMAND
		for len(rest) > 0 && strings.HasPrefix(rest[0].text, "--") && rest[0].text != "--" {
			rest = rest[1:]
		}
		if len(rest) > 0 && rest[0].text == "--" {
			rest = rest[1:]
		}
		cmd, err := c.skipAssignments("cmake -E env", rest)
		if err != nil {
			return nil, err
		}
		return runsInheriting(cmd), nil
	case sub.text == "time":
		return runsInheriting(rest), nil
	case sub.text == "chdir":
		c.line.cd = true
		if len(rest) < 2 {
			return nil, nil
		}
		return runsInheriting(rest[1:]), nil
	case ok:
		if prog == "tar" {
			return c.tableRuns("tar", rest, tarProgram())
		}
		return []runs{{words: append([]shWord{{text: prog, src: prog}}, rest...), nameOnly: true, via: "cmake -E " + sub.text}}, nil
	}
	return nil, nil
}

// compilerName reports whether name is a C, C++ or Fortran compiler
// driver: gcc, g++, cc, c++, clang, clang++, gfortran, with a target
// prefix (x86_64-linux-gnu-gcc) or a version suffix (gcc-12, clang-17).
func compilerName(name string) bool {
	for i := len(name) - 1; i > 0 && (name[i] >= '0' && name[i] <= '9' || name[i] == '.'); i-- {
		if name[i-1] == '-' {
			name = name[:i-1]
			break
		}
	}
	for _, d := range []string{"gcc", "g++", "cc", "c++", "clang", "clang++", "gfortran", "clang-cl", "cpp"} {
		if name == d || strings.HasSuffix(name, "-"+d) {
			return true
		}
	}
	return false
}

// compilerRuns: a compiler driver runs the program -wrapper names
// (PROG,ARG,...) in front of each of its programs, finds its programs
// where -B, --gcc-toolchain or -fuse-ld=PATH say, runs what a specs file
// says, loads plugins (-fplugin, -fpass-plugin, -Xclang -load, the
// linker's --plugin), and reads options from @FILE.
func (c *checker) compilerRuns(name string, args []shWord) ([]runs, error) {
	var rs []runs
	for i := 0; i < len(args); i++ {
		w := args[i]
		t := w.text
		next := func() shWord {
			if i+1 < len(args) {
				return args[i+1]
			}
			return shWord{}
		}
		switch {
		case !w.literal() && (t == "" || t[0] == dyn || t[0] == '@' || strings.HasPrefix(t, "-B") || strings.HasPrefix(t, "-f") || w.splits):
			return nil, c.refuse("%s %s: the word is only known when the line runs and may be an option that runs a program (-wrapper, -B, -fplugin)", name, shown(w.src))
		case t == "-wrapper":
			v := next()
			i++
			if !v.literal() || v.text == "" {
				return []runs{{unknown: "runs a -wrapper only known when the line runs"}}, nil
			}
			var words []shWord
			for _, f := range strings.Split(v.text, ",") {
				words = append(words, shWord{text: f, src: f})
			}
			rs = append(rs, runs{words: append(words, dynWord("")), via: "-wrapper"})
		case t == "-B" || strings.HasPrefix(t, "-B"), strings.HasPrefix(t, "@"),
			strings.HasPrefix(t, "-fplugin"), strings.HasPrefix(t, "-fpass-plugin"), strings.HasPrefix(t, "-specs"), strings.HasPrefix(t, "--specs"),
			strings.HasPrefix(t, "--gcc-toolchain"), strings.HasPrefix(t, "--gcc-install-dir"), strings.HasPrefix(t, "-ccc-"),
			strings.HasPrefix(t, "--ld-path"), strings.HasPrefix(t, "-fuse-ld=") && strings.Contains(t, "/"),
			strings.HasPrefix(t, "-Wl,") && strings.Contains(t, "plugin"), strings.HasPrefix(t, "-Wa,") && strings.Contains(t, "plugin"),
			(t == "-Xclang" || t == "-Xlinker" || t == "-Xassembler" || t == "-Xpreprocessor") && strings.Contains(next().text, "plugin"),
			t == "-Xclang" && (next().text == "-load" || !next().literal()), t == "-plugin" || strings.HasPrefix(t, "--plugin"):
			rs = append(rs, hiddenRun("takes "+shown(w.src)+", which makes it run programs or load libraries it names"))
		}
	}
	return rs, nil
}

// containerRuns: docker, podman and nerdctl run, exec, create and start
// run commands inside a container, with whatever it mounts of this
// host; kubectl exec, run, debug and attach run them in a cluster.
//
// The command is found among all the words, since the global options'
// values come before it: a container named "run" makes docker logs run
// refused too. --config and --kubeconfig name configurations that run
// credential helpers and exec plugins.
func containerRuns(name string, args []shWord) []runs {
	cmds := []string{"run", "exec", "create", "start", "compose", "container", "debug", "attach"}
	if name == "kubectl" || name == "oc" {
		cmds = []string{"exec", "run", "debug", "attach", "cp", "plugin"}
	}
	for _, w := range args {
		t, _, _ := strings.Cut(w.text, "=")
		switch {
		case w.text == "--":
			return nil
		case !w.literal():
			return []runs{{unknown: "takes a word only known when the line runs, which may be a command that runs one in a container"}}
		case slices.Contains(cmds, w.text):
			return []runs{{unknown: "runs a command in a container (" + name + " " + w.text + "), which the rules cannot check"}}
		case t == "--config" || t == "--kubeconfig":
			return []runs{{unknown: "reads a configuration (" + shown(w.src) + ") that can name programs to run (credential helpers, exec plugins)"}}
		}
	}
	return nil
}

// opensslRuns: openssl loads engines (openssl engine, -engine ID, where
// ID may be a library's path) and providers (-provider, -provider-path),
// and reads configuration (-config, OPENSSL_CONF) that can load them.
func opensslRuns(args []shWord) []runs {
	for i, w := range args {
		t := strings.TrimPrefix(w.text, "-")
		switch {
		case !w.literal():
			return []runs{hiddenRun("takes a word only known when the line runs, which may load an engine or a provider")}
		case i == 0 && w.text == "engine":
			return []runs{hiddenRun("loads engines, shared libraries it names")}
		case strings.HasPrefix(w.text, "-") && (t == "engine" || t == "provider" || t == "provider-path" || t == "config" ||
			t == "keyform" && i+1 < len(args) && strings.EqualFold(args[i+1].text, "engine") || t == "ssl_client_engine"):
			return []runs{hiddenRun("takes " + shown(w.src) + ", which loads a shared library or a configuration that names one")}
		}
	}
	return nil
}

// opensCommand says why a program that opens a file with whatever
// program the desktop's or the mail system's configuration names for its
// type (xdg-open, run-mailcap, see) is refused, or "".
func opensCommand(name string) string {
	switch name {
	case "xdg-open", "open", "gio", "gnome-open", "kde-open", "exo-open", "run-mailcap", "see", "edit", "compose", "print",
		"sensible-browser", "x-www-browser", "www-browser", "xdg-email":
		return "opens what it is given with the program the desktop's or the mail system's configuration names for it"
	}
	return ""
}

// socatRuns: socat's EXEC:CMD address runs CMD, and SYSTEM:CMD and
// SHELL:CMD run it through the shell, with socat's options for the
// address after a comma; OPEN:, CREATE: and GOPEN: name files it writes,
// and so do -L, -W and -lf. An address only known when the line runs may
// be EXEC.
func (c *checker) socatRuns(args []shWord) ([]runs, error) {
	var rs []runs
	for i := 0; i < len(args); i++ {
		w := args[i]
		t := w.text
		switch {
		case !w.literal():
			return []runs{{unknown: "takes an address only known when the line runs, which may be EXEC: or SYSTEM:"}}, nil
		case t == "-L" || t == "-W" || t == "-lf" || t == "-r" || t == "-R":
			if i+1 < len(args) {
				i++
				if err := c.writesNamed("socat "+t, args[i]); err != nil {
					return nil, err
				}
			}
			continue
		case t == "-b" || t == "-t" || t == "-T" || t == "-lp":
			i++
			continue
		case strings.HasPrefix(t, "-") && t != "-":
			continue
		}
		for _, addr := range strings.Split(t, "!!") {
			kind, rest, ok := strings.Cut(addr, ":")
			if !ok {
				continue
			}
			cmd := socatValue(rest)
			switch strings.ToLower(kind) {
			case "exec":
				rs = append(rs, runs{words: splitWords(shWord{text: cmd, src: cmd}), via: "its EXEC address"})
			case "system", "shell":
				rs = append(rs, runs{script: cmd, isScript: true, lang: langSh, via: "its " + strings.ToUpper(kind) + " address"})
			case "open", "create", "creat", "gopen", "pipe":
				if err := c.writesNamed("socat "+strings.ToUpper(kind)+":", shWord{text: cmd, src: w.src}); err != nil {
					return nil, err
				}
			}
		}
	}
	return rs, nil
}

// socatValue is the part of a socat address before its options (the
// first comma not escaped with a backslash), unescaped.
func socatValue(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		case s[i] == ',':
			return b.String()
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
