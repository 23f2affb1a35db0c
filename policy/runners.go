package policy

import (
	"slices"
	"strings"
)

// Programs that set a process up (trace it, fake its clock or its root
// user, limit it, sandbox it, give it a session bus) and then run the
// command that follows their options. Their options are read strictly:
// an option the table does not know is refused, since where the command
// starts would be a guess. Options that make them run something else
// (fakeroot --faked, dbus-run-session --dbus-daemon), load a library
// (fakeroot --lib) or set variables from elsewhere (chpst -e) make what
// runs unknown; options naming a file they write are held to the write
// rules; variables they set for the command are held to the rules for
// assignments.

// prefixRunner is a program that runs the command after its options.
type prefixRunner struct {
	spec optSpec
	// operands are the words between the options and the command
	// (faketime's time, setlock's file).
	operands int
	// unknown are options after which what runs is unknown, and why.
	unknown map[string]string
	// writes are options whose value is a file the program writes.
	writes []string
	// env are options whose value is NAME=VALUE, set for the command.
	env []string
	// elsewhere are options that run the command under another root
	// directory.
	elsewhere []string
	// bare, when set, says what the program does without a command:
	// it starts a shell reading standard input.
	bare bool
}

// prefixRunners are the programs modelled as prefixRunner.
var prefixRunners = map[string]prefixRunner{
	"strace": {
		spec: optSpec{flags: "AcCdDfFhiknqrtTvVwxyYzZ", valued: "abeEIoOpPsSuUX",
			long: names(`follow-forks output-separately summary-only summary summary-wall-clock seccomp-bpf debug help
				version absolute-timestamps relative-timestamps syscall-times instruction-pointer stack-trace no-abbrev
				verbose quiet silent decode-fds decode-pids daemonize kill-on-exit successful-only failed-only
				always-show-pid secontext tips`),
			longVal: names(`trace signal status abbrev raw read write fault inject kvm output string-limit attach env user
				detach-on trace-path summary-sort summary-columns const-print-style interruptible argv0 timestamps
				syscall-limit columns trace-fds namespace`)},
		writes: []string{"o", "output"}, env: []string{"E", "env"},
	},
	"ltrace": {
		spec: optSpec{flags: "bcCfhiLrSTtV", valued: "aADeFlnopsuwx",
			long: names("demangle help version"), longVal: names("align debug indent library output where config")},
		writes: []string{"o", "output"},
	},
	"fakeroot": {
		spec: optSpec{flags: "uhv", valued: "lisb", long: names("unknown-is-real help version"), longVal: names("lib faked fd-base")},
		unknown: map[string]string{"l": "loads a library it is given", "lib": "loads a library it is given",
			"faked": "runs the faked program it is given"},
		writes: []string{"s"}, bare: true,
	},
	"faketime": {
		spec:     optSpec{flags: "mf", long: names("exclude-monotonic disable-shm help version"), longVal: names("date-prog")},
		operands: 1, unknown: map[string]string{"date-prog": "runs the program it is given to read dates"},
	},
	"unbuffer": {spec: optSpec{flags: "p"}},
	"prlimit": {
		spec: optSpec{flags: "hV", valued: "po", attached: "cdefilmnqrstuvxy",
			long: names(`noheadings raw verbose help version as core cpu data fsize locks memlock msgqueue nice nofile nproc
				rss rtprio rttime sigpending stack`), longVal: names("pid output")},
	},
	"numactl": {
		spec: optSpec{flags: "alsHhVbtTdD", valued: "ipmNCPwLSfo",
			long: names("all localalloc show hardware balancing touch strict dump dump-nodes huge help version"),
			longVal: names(`interleave preferred membind cpunodebind physcpubind preferred-many weighted-interleave length shm
				file offset shmmode shmid`)},
	},
	"cgexec":   {spec: optSpec{flags: "h", valued: "g", long: names("sticky help")}},
	"pkexec":   {spec: optSpec{flags: "h", valued: "u", long: names("disable-internal-agent keep-cwd help version"), longVal: names("user")}, bare: true},
	"xvfb-run": {spec: optSpec{flags: "alh", valued: "efnpsw", long: names("auto-servernum listen-tcp help auto-display"), longVal: names("error-file auth-file server-num xauth-protocol server-args wait")}, writes: []string{"e", "error-file", "f", "auth-file"}},
	"dbus-run-session": {
		spec:    optSpec{long: names("help version"), longVal: names("config-file dbus-daemon")},
		unknown: map[string]string{"config-file": "reads a bus configuration, which can start services", "dbus-daemon": "runs the dbus-daemon it is given"},
	},
	"dbus-launch": {
		spec:    optSpec{long: names("version sh-syntax csh-syntax auto-syntax binary-syntax close-stderr exit-with-session exit-with-x11"), longVal: names("autolaunch config-file")},
		unknown: map[string]string{"config-file": "reads a bus configuration, which can start services"},
	},
	"ssh-agent": {
		spec:    optSpec{flags: "csDdk", valued: "aEOPt"},
		unknown: map[string]string{"P": "lets keys load PKCS#11 libraries from the paths it allows"},
	},
	"catchsegv": {},
	"chpst": {
		spec:      optSpec{flags: "vP012", valued: "uUbe/nlLmdopfc"},
		unknown:   map[string]string{"e": "sets variables from the files of a directory (PATH, LD_PRELOAD, ...)"},
		elsewhere: []string{"/"},
	},
	"setuidgid": {operands: 1},
	"envuidgid": {operands: 1},
	"softlimit": {spec: optSpec{valued: "acdflmoprst"}},
	"setlock":   {spec: optSpec{flags: "nNxX"}, operands: 1},
	"cpulimit": {
		spec: optSpec{flags: "kfzvihrb", valued: "plecP", long: names("lazy background kill verbose help monitor-forks include-children"),
			longVal: names("limit pid exe path cpu signal")},
	},
	"trickle":      {spec: optSpec{flags: "hvVs", valued: "wtlndu"}},
	"proxychains":  {spec: optSpec{flags: "q", valued: "f"}},
	"proxychains4": {spec: optSpec{flags: "q", valued: "f"}},
	"torsocks": {
		spec:    optSpec{flags: "idqh", valued: "upaP", long: names("shell on off version help isolate quiet debug"), longVal: names("user pass address port")},
		unknown: map[string]string{"shell": "starts a shell that reads its commands from standard input"},
	},
	"tsocks": {},
	// Compiler caches run the compiler command that follows; ccache -o
	// sets its configuration, which can name commands (compiler_check).
	"ccache":  {spec: optSpec{flags: "cCsSzVhxX", valued: "dFMkpo", longVal: names("set-config get-config")}, unknown: map[string]string{"o": "sets its configuration, which can name commands to run", "set-config": "sets its configuration, which can name commands to run"}},
	"sccache": {},
	"distcc":  {},
}

// prefixRun returns what prefix runner pr, the program name, runs with
// args.
func (c *checker) prefixRun(name string, pr prefixRunner, args []shWord) ([]runs, error) {
	p, err := c.parseOpts(name, args, pr.spec)
	if err != nil {
		return nil, err
	}
	for n, why := range pr.unknown {
		if p.has(shortName(n), longName(n)) {
			return []runs{{unknown: why + " (" + optionSpelling(n) + ")"}}, nil
		}
	}
	elsewhere := false
	for _, v := range p.vals {
		switch {
		case name == "strace" && (v.name == "o" || v.name == "output") && (strings.HasPrefix(v.val.text, "|") || strings.HasPrefix(v.val.text, "!")):
			// strace -o '|CMD' pipes its output to CMD through the shell.
			return []runs{scriptWord(shWord{text: v.val.text[1:], src: v.val.src}, langSh)}, nil
		case slices.Contains(pr.writes, v.name):
			if err := c.writesNamed(name+" "+optionSpelling(v.name), v.val); err != nil {
				return nil, err
			}
		case slices.Contains(pr.env, v.name):
			if _, err := c.skipAssignments(name+" "+optionSpelling(v.name), []shWord{v.val}); err != nil {
				return nil, err
			}
		}
		if slices.Contains(pr.elsewhere, v.name) {
			elsewhere = true
		}
	}
	if len(p.rest) <= pr.operands {
		if pr.bare {
			return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
		}
		return nil, nil
	}
	if elsewhere {
		c.line.cd = true
	}
	rs := runsInheriting(p.rest[pr.operands:])
	rs[0].elsewhere = elsewhere
	return append(rs, denySuffixes(args)...), nil
}

// denySuffixes returns, for deny rules only, the command every word of
// args that is not an option would start: should the option table take
// a flag for an option with a value, or the other way round, the command
// the program runs is among them.
func denySuffixes(args []shWord) []runs {
	var rs []runs
	for i, w := range args {
		if w.literal() && w.text != "" && w.text[0] != '-' {
			rs = append(rs, runs{words: args[i:], denyOnly: true})
		}
	}
	return rs
}

// runnerRuns returns what the programs of this file run, and whether
// name is one of them.
func (c *checker) runnerRuns(name string, args []shWord) ([]runs, bool, error) {
	if pr, ok := prefixRunners[name]; ok {
		rs, err := c.prefixRun(name, pr, args)
		return rs, true, err
	}
	var rs []runs
	var err error
	switch {
	case name == "valgrind":
		rs, err = c.valgrind(args)
	case name == "perf":
		rs, err = c.perf(args)
	case name == "sg":
		rs = c.sg(args)
	case name == "capsh":
		rs, err = c.capsh(args, 0)
	case name == "bwrap":
		rs, err = c.bwrap(args)
	case name == "firejail":
		rs, err = c.firejail(args)
	case name == "start-stop-daemon":
		rs, err = c.startStopDaemon(args)
	case name == "run-parts":
		rs = runParts(args)
	case name == "entr":
		rs, err = c.entr(args)
	case name == "hyperfine":
		rs, err = c.hyperfine(args)
	case name == "coreutils":
		rs = coreutilsRuns(args)
	case name == "envdir":
		rs = []runs{{unknown: "sets variables from the files of a directory (PATH, LD_PRELOAD, ...)"}}
	case name == "ip":
		rs, err = c.ipRuns(args)
	case name == "fd" || name == "fdfind":
		rs = fdRuns(args)
	case dynamicLoader(name):
		rs, err = c.loaderRuns(name, args)
	default:
		return nil, false, nil
	}
	return rs, true, err
}

// valgrind [OPTIONS] PROG [ARGS]: every option is one word (--name=value);
// the tool's output files are held to the write rules.
func (c *checker) valgrind(args []shWord) ([]runs, error) {
	for i, w := range args {
		t := w.text
		switch {
		case !w.literal():
			return nil, c.refuse("valgrind %s: the word is only known when the line runs and may be an option or the program to run", shown(w.src))
		case t == "--":
			return runsInheriting(args[i+1:]), nil
		case !strings.HasPrefix(t, "-"):
			return runsInheriting(args[i:]), nil
		}
		name, v, eq := strings.Cut(strings.TrimLeft(t, "-"), "=")
		if eq && strings.HasSuffix(name, "-file") && name != "suppressions-file" {
			if err := c.writesNamed("valgrind --"+name, shWord{text: v, src: w.src}); err != nil {
				return nil, err
			}
		}
		if name == "db-command" || name == "db-attach" {
			return []runs{{unknown: "runs a debugger command it is given (--" + name + ")"}}, nil
		}
	}
	return nil, nil
}

// perfCommands are perf's commands that run a command after their
// options, with their options.
var perfCommands = map[string]optSpec{
	"record": {flags: "aAbBdgilnNPqRsTvWx", valued: "eptrcoFmCDGjuk", attached: "ISz",
		long: names(`all-cpus no-buffering no-inherit group phys-data data-page-size code-page-size sample-cpu
			sample-identifier period no-samples raw-samples branch-any weight namespaces all-cgroups transaction
			per-thread quiet verbose stat timestamp running-time switch-events buildid-all buildid-mmap no-buildid
			no-buildid-cache timestamp-filename timestamp-boundary dry-run tail-synthesize overwrite kcore
			no-bpf-event strict-freq debuginfod off-cpu snapshot aux-sample switch-output intr-regs user-regs
			call-graph`),
		longVal: names(`event filter exclude-perf pid tid realtime count output freq mmap-pages cpu cgroup
			branch-filter uid clockid delay proc-map-timeout vmlinux switch-max-files synth max-size
			num-thread-synthesize control threads setup-filter affinity mmap-flush compression-level`)},
	"stat": {flags: "aAcnvSBb", valued: "eptCGorIxMDdT",
		long: names(`all-cpus no-aggr scale null verbose sync big-num append no-merge no-inherit per-socket per-die
			per-cluster per-cache per-core per-thread per-node metric-only interval-clear quiet json percore-show-thread
			topdown smi-cost bpf-counters all-kernel all-user iostat table metric-no-group metric-no-merge`),
		longVal: names(`event pid tid cpu cgroup for-each-cgroup output repeat interval-print field-separator metrics delay
			detailed td-level log-fd pre post timeout interval-count control bpf-attr-map cputype`)},
	"trace": {flags: "afFlsSTv", valued: "eptuoCDmG",
		long: names(`all-cpus no-syscalls syscalls summary summary-only with-summary sched verbose time print-sample
			kernel-syscall-graph sort-events failure errno-summary libtraceevent_print comm`),
		longVal: names(`event expr pid tid uid output cpu delay mmap-pages cgroup duration filter-pids pf call-graph
			max-events max-stack min-stack switch-on switch-off proc-map-timeout map-dump`)},
}

// perf [GLOBAL OPTIONS] COMMAND [ARGS]: record, stat and trace run the
// command after their options (stat --pre and --post through the shell);
// the other commands that run a command or a script (sched, lock, mem,
// c2c, kmem, kvm, timechart, kwork, ftrace record; script) are unknown,
// and so are configuration changes and a program directory
// (--exec-path=DIR).
func (c *checker) perf(args []shWord) ([]runs, error) {
	for len(args) > 0 && strings.HasPrefix(args[0].text, "-") && args[0].literal() {
		switch t := args[0].text; {
		case strings.HasPrefix(t, "--exec-path="):
			return []runs{{unknown: "runs perf's programs from another directory (--exec-path)"}}, nil
		case t == "--debug" && len(args) > 1:
			args = args[1:]
		}
		args = args[1:]
	}
	if len(args) == 0 {
		return nil, nil
	}
	sub := args[0]
	if !sub.literal() {
		return []runs{{unknown: "runs a perf command only known when the line runs"}}, nil
	}
	spec, ok := perfCommands[sub.text]
	switch sub.text {
	case "report", "annotate", "top", "c2c", "mem", "sched", "lock", "kmem", "kvm", "timechart", "kwork", "ftrace", "script", "config", "probe":
		for _, w := range args[1:] {
			switch {
			case !w.literal():
				return []runs{{unknown: "takes a word only known when the line runs, which may make it run a command"}}, nil
			case w.text == "record" || w.text == "stat" || sub.text == "ftrace" && !strings.HasPrefix(w.text, "-"):
				return []runs{{unknown: "runs a command with perf " + sub.text + ", which the checker does not model (it does perf record, stat and trace)"}}, nil
			case strings.HasPrefix(w.text, "--objdump") || strings.HasPrefix(w.text, "--addr2line") || strings.HasPrefix(w.text, "--symfs"):
				return []runs{{unknown: "names a program or files for perf to use (" + shown(w.src) + ")"}}, nil
			case sub.text == "script" && (w.text == "-s" || strings.HasPrefix(w.text, "--script") || w.text == "report" || w.text == "-g"):
				return []runs{hiddenRun("runs a perf script, which the checker cannot read")}, nil
			case sub.text == "config" && strings.Contains(w.text, "="):
				return []runs{{unknown: "changes perf's configuration, which can name the programs perf runs"}}, nil
			}
		}
		return nil, nil
	}
	if !ok {
		return nil, nil
	}
	p, err := c.parseOpts("perf "+sub.text, args[1:], spec)
	if err != nil {
		return nil, err
	}
	var rs []runs
	for _, v := range p.vals {
		switch v.name {
		case "o", "output":
			if err := c.writesNamed("perf "+sub.text+" -o", v.val); err != nil {
				return nil, err
			}
		case "pre", "post":
			rs = append(rs, scriptWord(v.val, langSh))
		}
	}
	if len(p.rest) == 0 {
		return rs, nil
	}
	rs = append(rs, runsInheriting(p.rest)...)
	return append(rs, denySuffixes(args[1:])...), nil
}

// sg [-] GROUP [-c] COMMAND: sg runs COMMAND, joined into one line, with
// /bin/sh -c; without one it starts a shell reading standard input.
func (c *checker) sg(args []shWord) []runs {
	if len(args) > 0 && args[0].text == "-" {
		c.line.cd = true
		args = args[1:]
	}
	if len(args) > 0 {
		args = args[1:] // the group
	}
	if len(args) > 0 && args[0].text == "-c" {
		args = args[1:]
	}
	if len(args) == 0 {
		return []runs{{unknown: "starts a shell that reads its commands from standard input"}}
	}
	return []runs{c.joined(args, langSh)}
}

// capsh [OPTIONS] [-- ARGS]: after "--" the shell (/bin/bash, or the
// program --shell= names) runs with ARGS; "==" runs capsh again with the
// words after it; --chroot= runs the rest under another root directory.
func (c *checker) capsh(args []shWord, depth int) ([]runs, error) {
	shell := shWord{text: "/bin/bash", src: "/bin/bash"}
	elsewhere := false
	for i, w := range args {
		t := w.text
		switch {
		case !w.literal():
			return []runs{{unknown: "takes a word only known when the line runs, which may be an option that runs a program"}}, nil
		case t == "==":
			if depth > maxDepth {
				return nil, c.refuse("capsh: nested too deeply to check")
			}
			rs, err := c.capsh(args[i+1:], depth+1)
			for j := range rs {
				rs[j].elsewhere = rs[j].elsewhere || elsewhere
			}
			return rs, err
		case t == "--":
			words := append([]shWord{shell}, args[i+1:]...)
			return []runs{{words: words, elsewhere: elsewhere, inherit: true}}, nil
		case strings.HasPrefix(t, "--shell="):
			shell = shWord{text: t[len("--shell="):], src: t[len("--shell="):]}
		case strings.HasPrefix(t, "--chroot="):
			elsewhere = true
			c.line.cd = true
		}
	}
	return nil, nil
}

// bwrapArity gives how many words each bwrap option takes.
var bwrapArity = map[string]int{
	"--args": 1, "--argv0": 1, "--uid": 1, "--gid": 1, "--hostname": 1, "--chdir": 1, "--setenv": 2, "--unsetenv": 1,
	"--lock-file": 1, "--sync-fd": 1, "--bind": 2, "--bind-try": 2, "--dev-bind": 2, "--dev-bind-try": 2, "--ro-bind": 2,
	"--ro-bind-try": 2, "--bind-fd": 2, "--ro-bind-fd": 2, "--remount-ro": 1, "--exec-label": 1, "--file-label": 1,
	"--proc": 1, "--dev": 1, "--tmpfs": 1, "--mqueue": 1, "--dir": 1, "--file": 2, "--bind-data": 2, "--ro-bind-data": 2,
	"--symlink": 2, "--seccomp": 1, "--add-seccomp-fd": 1, "--block-fd": 1, "--userns-block-fd": 1, "--info-fd": 1,
	"--json-status-fd": 1, "--cap-add": 1, "--cap-drop": 1, "--perms": 1, "--size": 1, "--chmod": 2, "--overlay-src": 1,
	"--overlay": 3, "--tmp-overlay": 1, "--ro-overlay": 1, "--level-prefix": 0, "--userns": 1, "--userns2": 1,
	"--pidns": 1, "--unshare-all": 0, "--share-net": 0, "--unshare-user": 0, "--unshare-user-try": 0,
	"--unshare-ipc": 0, "--unshare-pid": 0, "--unshare-net": 0, "--unshare-uts": 0, "--unshare-cgroup": 0,
	"--unshare-cgroup-try": 0, "--clearenv": 0, "--new-session": 0, "--die-with-parent": 0, "--as-pid-1": 0,
	"--disable-userns": 0, "--assert-userns-disabled": 0, "--help": 0, "--version": 0,
}

// bwrap [OPTIONS] [--] COMMAND: the command runs in a sandbox of its own
// mounts (where the files it writes cannot be placed); --setenv sets a
// variable for it, --args reads more options from a descriptor.
func (c *checker) bwrap(args []shWord) ([]runs, error) {
	for i := 0; i < len(args); i++ {
		w := args[i]
		t := w.text
		switch {
		case !w.literal():
			return nil, c.refuse("bwrap %s: the word is only known when the line runs and may be an option or the command to run", shown(w.src))
		case t == "--":
			return append(c.sandboxed(args[i+1:]), denySuffixes(args)...), nil
		case !strings.HasPrefix(t, "--"):
			return append(c.sandboxed(args[i:]), denySuffixes(args)...), nil
		case t == "--args":
			return []runs{{unknown: "reads more options from a descriptor (--args)"}}, nil
		case t == "--setenv" && i+2 < len(args):
			if _, err := c.skipAssignments("bwrap --setenv", []shWord{{text: args[i+1].text + "=" + args[i+2].text, src: args[i+1].src}}); err != nil {
				return nil, err
			}
		}
		n, ok := bwrapArity[t]
		if !ok {
			return nil, c.refuse("bwrap option %s is not one the checker knows, so where the command it runs starts cannot be told", shown(w.src))
		}
		i += n
	}
	return nil, nil
}

// sandboxed returns the command a sandbox runs: under its own mounts,
// where the files it writes cannot be placed.
func (c *checker) sandboxed(cmd []shWord) []runs {
	c.line.cd = true
	if len(cmd) == 0 {
		return nil
	}
	return []runs{{words: cmd, elsewhere: true, inherit: true}}
}

// firejail [OPTIONS] [PROGRAM [ARGS]]: every option is one word; the
// program runs in a sandbox. A profile can set variables and programs,
// --shell= names the shell the program runs through, --join runs it in
// another sandbox.
func (c *checker) firejail(args []shWord) ([]runs, error) {
	for i, w := range args {
		t := w.text
		name, v, _ := strings.Cut(strings.TrimPrefix(t, "--"), "=")
		switch {
		case !w.literal():
			return nil, c.refuse("firejail %s: the word is only known when the line runs and may be an option or the program to run", shown(w.src))
		case t == "--":
			return c.sandboxed(args[i+1:]), nil
		case !strings.HasPrefix(t, "-"):
			return c.sandboxed(args[i:]), nil
		case name == "profile" || name == "include" || strings.HasPrefix(name, "join") || name == "appimage" ||
			name == "shell" && v != "none" || name == "build":
			return []runs{{unknown: "takes option " + shown(w.src) + ", which can name programs and variables, or run in another sandbox"}}, nil
		case name == "env":
			if _, err := c.skipAssignments("firejail --env", []shWord{{text: v, src: w.src}}); err != nil {
				return nil, err
			}
		case name == "output" || name == "output-stderr" || name == "trace" && v != "":
			if err := c.writesNamed("firejail --"+name, shWord{text: v, src: w.src}); err != nil {
				return nil, err
			}
		}
	}
	return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
}

// startStopDaemon: start-stop-daemon --start runs --startas PATH (or
// --exec PROGRAM) with the words after "--"; --chroot runs it under
// another root directory. --stop and --status run nothing.
func (c *checker) startStopDaemon(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("start-stop-daemon", args, optSpec{flags: "SKTHVtoqbCmv", valued: "xpnugsRacrdONPIk", permute: true,
		long: names("start stop status help version test oknodo quiet background no-close make-pidfile remove-pidfile notify-await verbose"),
		longVal: names(`exec pidfile name user group signal retry startas chuid chroot chdir output nicelevel procsched iosched
			umask notify-timeout ppid`)})
	if err != nil || !p.has("S", "start") {
		return nil, err
	}
	var prog []shWord
	elsewhere := false
	for _, v := range p.vals {
		switch v.name {
		case "x", "exec":
			if prog == nil {
				prog = []shWord{v.val}
			}
		case "a", "startas":
			prog = []shWord{v.val}
		case "r", "chroot":
			elsewhere = true
			c.line.cd = true
		case "O", "output", "p", "pidfile":
			if v.name == "O" || v.name == "output" || p.has("m", "make-pidfile") {
				if err := c.writesNamed("start-stop-daemon "+optionSpelling(v.name), v.val); err != nil {
					return nil, err
				}
			}
		case "d", "chdir":
			c.line.cd = true
		}
	}
	if prog == nil {
		return nil, nil
	}
	return []runs{{words: append(prog, p.rest...), elsewhere: elsewhere}}, nil
}

// runParts runs every program in a directory, unless it only lists them.
func runParts(args []shWord) []runs {
	for _, w := range args {
		if w.text == "--test" || w.text == "--list" || w.text == "--help" || w.text == "--version" {
			return nil
		}
	}
	return []runs{{unknown: "runs every program in a directory"}}
}

// entr [-acdnprsz] UTILITY [ARGS]: entr runs the utility (with -s, a
// shell command line) each time a file changes; "/_" stands for the file.
func (c *checker) entr(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("entr", args, optSpec{flags: "acdnprsz"})
	if err != nil || len(p.rest) == 0 {
		return nil, err
	}
	if p.has("s", "") {
		return []runs{scriptWord(p.rest[0], langSh)}, nil
	}
	cmd := slices.Clone(p.rest)
	for i, w := range cmd {
		cmd[i].text = strings.ReplaceAll(w.text, "/_", string(dyn))
	}
	return []runs{{words: cmd}}, nil
}

// hyperfine [OPTIONS] COMMAND...: each command, and those of --setup,
// --prepare, --cleanup and --reference, is a shell command line (sh -c,
// or the --shell given; split into words with -N). Commands built from
// parameters (-P, -L) are unknown; exported results are written files.
func (c *checker) hyperfine(args []shWord) ([]runs, error) {
	for _, a := range args {
		if a.text == "-P" || a.text == "-L" || strings.HasPrefix(a.text, "--parameter-scan") || strings.HasPrefix(a.text, "--parameter-list") {
			return []runs{{unknown: "builds the commands it runs from parameters (-P, -L)"}}, nil
		}
	}
	p, err := c.parseOpts("hyperfine", args, optSpec{flags: "iNhV", valued: "wmMrspcDnSu", permute: true,
		long: names("ignore-failure show-output help version"),
		longVal: names(`warmup min-runs max-runs runs setup prepare conclude cleanup parameter-step-size command-name shell
			time-unit style sort export-asciidoc export-csv export-json export-markdown export-orgmode output input reference
			min-benchmarking-time`)})
	if err != nil {
		return nil, err
	}
	lang, split := langSh, p.has("N", "")
	commands := slices.Clone(p.rest)
	for _, v := range p.vals {
		switch v.name {
		case "S", "shell":
			switch l := shellLanguage(v.val.text); {
			case v.val.text == "none":
				split = true
			case !v.val.literal() || l == langUnsupported || l == langPowerShell:
				return []runs{{unknown: "runs its commands with the shell " + shown(v.val.src) + ", whose command lines the checker cannot parse"}}, nil
			default:
				lang = l
			}
		case "s", "setup", "p", "prepare", "c", "cleanup", "conclude", "reference":
			commands = append(commands, v.val)
		case "export-asciidoc", "export-csv", "export-json", "export-markdown", "export-orgmode":
			if err := c.writesNamed("hyperfine --"+v.name, v.val); err != nil {
				return nil, err
			}
		case "output":
			if t := v.val.text; t != "null" && t != "pipe" && t != "inherit" {
				if err := c.writesNamed("hyperfine --output", v.val); err != nil {
					return nil, err
				}
			}
		}
	}
	var rs []runs
	for _, w := range commands {
		if split {
			rs = append(rs, runs{words: splitWords(w)})
			continue
		}
		rs = append(rs, scriptWord(w, lang))
	}
	return rs, nil
}

// splitWords splits a literal command line into words at white space
// (for programs that run one without a shell); one only known when the
// line runs is unknown.
func splitWords(w shWord) []shWord {
	if !w.literal() {
		return []shWord{dynWord(w.src)}
	}
	var out []shWord
	for _, f := range strings.Fields(w.text) {
		out = append(out, shWord{text: f, src: f})
	}
	if len(out) == 0 {
		return []shWord{{text: "", src: w.src}}
	}
	return out
}

// coreutilsRuns: the multi-call coreutils runs the program its first word
// (or --coreutils-prog=NAME) names.
func coreutilsRuns(args []shWord) []runs {
	if len(args) == 0 {
		return nil
	}
	first := args[0]
	for _, opt := range []string{"--coreutils-prog=", "--coreutils-prog-shebang="} {
		if name, ok := strings.CutPrefix(first.text, opt); ok {
			return runsInheriting(append([]shWord{{text: name, src: name}}, args[1:]...))
		}
	}
	if strings.HasPrefix(first.text, "-") && first.literal() {
		return nil // --help, --version
	}
	return runsInheriting(args)
}

// ipRuns: ip netns exec NAME CMD and ip vrf exec NAME CMD run CMD (ip
// takes any prefix of an object or a command it knows, "ip net e");
// -all runs it in every namespace; a batch file (-b, -batch) holds ip
// commands, exec among them.
func (c *checker) ipRuns(args []shWord) ([]runs, error) {
	all := false
	for len(args) > 0 && (strings.HasPrefix(args[0].text, "-") || !args[0].literal()) {
		w := args[0]
		opt := strings.TrimLeft(w.text, "-")
		switch {
		case !w.literal():
			return nil, c.refuse("ip %s: the word is only known when the line runs and may be an option (-batch) or an object", shown(w.src))
		case opt == "b" || len(opt) > 1 && strings.HasPrefix("batch", opt):
			return []runs{{unknown: "runs the ip commands of a batch file (" + shown(w.src) + "), netns exec among them"}}, nil
		case opt != "" && strings.HasPrefix("all", opt):
			all = true
		case opt == "f" || opt == "family" || opt == "n" || opt == "netns" || opt == "l" || opt == "loops" || opt == "rc" || opt == "rcvbuf":
			if len(args) > 1 {
				args = args[1:]
			}
		}
		args = args[1:]
	}
	if len(args) < 2 {
		return nil, nil
	}
	obj, cmd := args[0], args[1]
	if !obj.literal() || !cmd.literal() {
		return []runs{{unknown: "takes an object or a command only known when the line runs, which may be netns exec"}}, nil
	}
	isNetns := len(obj.text) >= 3 && strings.HasPrefix("netns", obj.text)
	isVrf := obj.text == "vrf" || obj.text == "vr"
	if !isNetns && !isVrf || !strings.HasPrefix("exec", cmd.text) {
		return nil, nil
	}
	rest := args[2:]
	if len(rest) > 0 && !(all && isNetns) {
		rest = rest[1:] // the namespace's or the VRF's name
	}
	return runsInheriting(rest), nil
}

// fdRuns: fd -x CMD... (--exec) and -X CMD... (--exec-batch) run CMD,
// the words after it up to ";", with placeholders ({}, {/}, {.}, ...) for
// the files it finds: in a command's name they are code.
func fdRuns(args []shWord) []runs {
	var rs []runs
	for i := 0; i < len(args); i++ {
		w := args[i]
		t := w.text
		var first []shWord // the command's first word, when attached
		switch {
		case !w.literal() && (t == "" || t[0] == dyn || w.splits):
			return []runs{{unknown: "has a word (" + shown(w.src) + ") only known when the line runs, which may be -x or -X"}}
		case t == "--":
			return rs
		case t == "--exec" || t == "--exec-batch":
		case strings.HasPrefix(t, "--exec=") || strings.HasPrefix(t, "--exec-batch="):
			_, v, _ := strings.Cut(t, "=")
			first = []shWord{{text: v, src: v}}
		case len(t) > 1 && t[0] == '-' && t[1] != '-' && strings.ContainsAny(t, "xX"):
			if j := strings.IndexAny(t, "xX"); j < len(t)-1 {
				first = []shWord{{text: t[j+1:], src: t[j+1:]}}
			}
		default:
			continue
		}
		end := i + 1
		for end < len(args) && args[end].text != ";" {
			end++
		}
		cmd := append(first, args[i+1:end]...)
		i = end
		if len(cmd) == 0 {
			rs = append(rs, runs{unknown: "has an -x or -X action whose command is missing"})
			continue
		}
		for k, cw := range cmd {
			cmd[k].text = fdPlaceholders(cw.text)
		}
		rs = append(rs, runs{words: cmd})
	}
	return rs
}

// fdPlaceholders puts dyn in place of fd's placeholders in t.
func fdPlaceholders(t string) string {
	for _, ph := range []string{"{//}", "{/.}", "{/}", "{.}", "{}"} {
		t = strings.ReplaceAll(t, ph, string(dyn))
	}
	return t
}

// dynamicLoader reports whether name is the dynamic loader, which runs
// the program it is given (ld-linux-x86-64.so.2 /bin/prog).
func dynamicLoader(name string) bool {
	return name == "ld.so" || strings.HasPrefix(name, "ld-linux") && strings.Contains(name, ".so") ||
		strings.HasPrefix(name, "ld-musl-") || strings.HasPrefix(name, "ld64.so")
}

// loaderRuns: the dynamic loader runs PROGRAM [ARGS] after its options;
// --preload and --audit load libraries it is given.
func (c *checker) loaderRuns(name string, args []shWord) ([]runs, error) {
	p, err := c.parseOpts(name, args, optSpec{long: names("list verify inhibit-cache help version list-tunables list-diagnostics"),
		longVal: names("library-path inhibit-rpath audit preload argv0 glibc-hwcaps-prepend glibc-hwcaps-mask")})
	if err != nil {
		return nil, err
	}
	if p.has("", "audit") || p.has("", "preload") {
		return []runs{{unknown: "loads libraries it is given (--preload, --audit)"}}, nil
	}
	return runsInheriting(p.rest), nil
}
