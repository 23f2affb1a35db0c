package policy

import (
	"path"
	"slices"
	"strings"
)

// Some programs run another program named by one of their options: sort
// --compress-program=PROG, tar --to-command=CMD, rsync -e CMD. Such an
// option makes the program a wrapper, and what it names is checked as a
// command; under any rules, a program only known when the line runs is
// refused. A word only known at run time, or a glob, where an option may
// be is refused as well: it may be that option. The options are read as
// the program reads them (abbreviations, clusters, options after
// operands), leniently: an option the checker does not know is taken for
// a flag, so that its value is examined as an option too.

// runKind says what an option names to run.
type runKind int

const (
	// runProgram: a program, run with the option's argument lists.
	runProgram runKind = iota
	// runShell: a command line, run by sh -c (or split into words the
	// way a shell would: checking it as a script finds at least as
	// much).
	runShell
	// runRemote: a command line the remote host's shell runs.
	runRemote
	// runHidden: what runs is out of the checker's sight (program
	// text in another language, a file of options or commands); only
	// an allow list refuses it.
	runHidden
	// runNamed: a program whose arguments are the caller's own (npm
	// --script-shell=PROG runs PROG -c SCRIPT, SCRIPT from package.json):
	// its name is matched against the rules, and it is not unwrapped.
	runNamed
	// runNever: what runs is out of sight, whatever the rules (a
	// configuration file that can name commands, as ssh's -F).
	runNever
)

// optRun is one option that runs something.
type optRun struct {
	names []string // "I" for -I, "use-compress-program" for --use-compress-program
	kind  runKind
	// args are the argument lists a runProgram program is run with,
	// dyn standing for what is only known when it runs; for runShell,
	// text appended to the command line (tar runs "PROG -d" too).
	args [][]string
	// prefix: only a value that starts with it runs something, and the
	// rest of the value is what runs (tar --checkpoint-action=exec=CMD).
	prefix string
	why    string // for runHidden and runNever: what it runs
	// flag is set for an option without a value that makes the program
	// run what the checker cannot see.
	flag bool
}

// optProgram is a program some of whose options run something.
type optProgram struct {
	spec optSpec
	runs []optRun
	// prepare rewrites the arguments before they are read (tar's
	// old-style first word), or refuses them.
	prepare func(c *checker, args []shWord) ([]shWord, error)
	// extra finds what else the options run.
	extra func(c *checker, p parsedOpts) ([]runs, error)
}

// optionProgram returns what is known of program name's options, or nil
// when none of them runs anything.
func optionProgram(name string) *optProgram {
	switch name {
	case "sort":
		return sortProgram()
	case "tar", "gtar":
		return tarProgram()
	case "rsync":
		return rsyncProgram()
	case "zip":
		return zipProgram()
	case "scp", "sftp":
		return scpProgram(name)
	case "cpio":
		return cpioProgram()
	case "mosh":
		return moshProgram()
	case "sshfs":
		return sshfsProgram()
	case "unison":
		return unisonProgram()
	case "borg", "borgbackup":
		return borgProgram()
	case "man":
		return manProgram()
	case "less":
		return lessProgram()
	case "sdiff", "diff3":
		return diffProgram(name)
	case "rg":
		return rgProgram()
	case "wget":
		return wgetProgram()
	case "apt", "apt-get", "apt-cache":
		return aptProgram()
	case "pytest", "py.test":
		return pytestProgram()
	case "journalctl":
		return journalctlProgram()
	}
	return toolProgram(name)
}

// knownOptions returns the options of command name, when the checker
// knows them, for reading abbreviations in deny rules the way the
// program does.
func knownOptions(name string) *optSpec {
	if p := optionProgram(path.Base(name)); p != nil {
		return &p.spec
	}
	return nil
}

// programRuns returns what a program runs through its options, its
// program text or its standard input, beyond the wrappers wrapped
// handles.
func (c *checker) programRuns(name string, args []shWord) ([]runs, error) {
	switch name {
	case "go":
		return c.goRuns(args)
	case "npm", "npx":
		return c.npmRuns(name, args)
	case "cargo":
		return c.cargoRuns(args)
	case "make", "gmake":
		return c.makeRuns(args)
	case "awk", "gawk", "mawk", "nawk", "original-awk":
		return c.awkRuns(name, args)
	case "sed", "gsed":
		return c.sedRuns(name, args)
	case "at", "batch", "atq", "atrm":
		return c.atRuns(name, args)
	case "crontab":
		return c.crontabRuns(args)
	case "tmux", "screen", "byobu":
		return []runs{{unknown: "runs commands given in its own syntax, in sessions that outlive the line"}}, nil
	case "hg":
		return c.hgRuns(args)
	case "cmake":
		return c.cmakeRuns(name, args)
	case "docker", "podman", "nerdctl", "kubectl", "oc":
		return containerRuns(name, args), nil
	case "openssl":
		return opensslRuns(args), nil
	case "socat":
		return c.socatRuns(args)
	}
	if why := opensCommand(name); why != "" {
		return []runs{{unknown: why}}, nil
	}
	if compilerName(name) {
		return c.compilerRuns(name, args)
	}
	if in := interpreter(name); in != nil {
		return c.interpreterRuns(name, in, args)
	}
	if why := commandShell(name); why != "" {
		return []runs{hiddenRun(why)}, nil
	}
	if prog := optionProgram(name); prog != nil {
		return c.tableRuns(name, args, prog)
	}
	return nil, nil
}

// tableRuns returns what program name runs through the options prog
// describes.
func (c *checker) tableRuns(name string, args []shWord, prog *optProgram) ([]runs, error) {
	if prog.prepare != nil {
		var err error
		if args, err = prog.prepare(c, args); err != nil {
			return nil, err
		}
	}
	p, err := c.parseOpts(name, args, prog.spec)
	if err != nil {
		return nil, err
	}
	var rs []runs
	for _, o := range prog.runs {
		if o.flag {
			for _, n := range o.names {
				if p.has(shortName(n), longName(n)) {
					rs = append(rs, runs{unknown: o.why, allowOnly: o.kind == runHidden})
				}
			}
			continue
		}
		for _, v := range p.vals {
			if slices.Contains(o.names, v.name) {
				rs = append(rs, o.runs(c, v)...)
			}
		}
	}
	if prog.extra != nil {
		more, err := prog.extra(c, p)
		if err != nil {
			return nil, err
		}
		rs = append(rs, more...)
	}
	return rs, nil
}

func shortName(n string) string {
	if len(n) == 1 {
		return n
	}
	return ""
}

func longName(n string) string {
	if len(n) > 1 {
		return n
	}
	return ""
}

// runs returns what option o, given value v, runs.
func (o optRun) runs(c *checker, v optVal) []runs {
	val := v.val
	opt := "-" + v.name
	if len(v.name) > 1 {
		opt = "-" + opt
	}
	if o.prefix != "" {
		known, _, _ := strings.Cut(val.text, string(dyn))
		switch {
		case strings.HasPrefix(val.text, o.prefix):
			val.text = val.text[len(o.prefix):]
		case !val.literal() && strings.HasPrefix(o.prefix, known):
			return []runs{{unknown: "takes option " + opt + " with a value only known when the line runs, which may run a command"}}
		default:
			return nil
		}
	}
	switch o.kind {
	case runHidden, runNever:
		return []runs{{unknown: o.why + " (" + opt + ")", allowOnly: o.kind == runHidden}}
	case runNamed:
		if !val.literal() || val.text == "" {
			return []runs{{unknown: "runs a program named by " + opt + " that is only known when the line runs"}}
		}
		return []runs{{words: []shWord{{text: val.text, src: val.text}}, nameOnly: true, via: opt}}
	case runProgram:
		if !val.literal() || val.text == "" {
			return []runs{{unknown: "runs a program named by " + opt + " that is only known when the line runs"}}
		}
		var rs []runs
		for _, args := range o.args {
			words := []shWord{{text: val.text, src: val.text}}
			for _, a := range args {
				w := shWord{text: a, src: a}
				if a == string(dyn) {
					w.src = "" // an argument only known when it runs
				}
				words = append(words, w)
			}
			rs = append(rs, runs{words: words, via: opt})
		}
		return rs
	}
	r := scriptWord(val, langSh)
	if r.unknown != "" {
		return []runs{{unknown: "runs a command named by " + opt + " that is only known when the line runs"}}
	}
	var rs []runs
	for _, suffix := range append([][]string{nil}, o.args...) {
		s := r
		s.script += strings.Join(suffix, "")
		s.elsewhere = o.kind == runRemote
		s.via = opt
		rs = append(rs, s)
	}
	return rs
}

// lenient returns a spec for programs whose options are read leniently.
func lenient(flags, valued string, long, longVal []string) optSpec {
	return optSpec{flags: flags, valued: valued, long: long, longVal: longVal, permute: true, lenient: true}
}

// words of long option lists, split on white space, for the tables.
func names(s string) []string { return strings.Fields(s) }

func sortProgram() *optProgram {
	return &optProgram{
		spec: lenient("bdfgiMhnRrVcCmsuz", "koSTt",
			names(`ignore-leading-blanks dictionary-order ignore-case general-numeric-sort ignore-nonprinting
				month-sort human-numeric-sort numeric-sort random-sort reverse version-sort check debug merge
				stable unique zero-terminated help version`),
			names(`random-source sort batch-size compress-program files0-from key output buffer-size
				field-separator temporary-directory parallel`)),
		runs: []optRun{{names: []string{"compress-program"}, kind: runProgram, args: [][]string{{}, {"-d"}}}},
	}
}

func tarProgram() *optProgram {
	return &optProgram{
		spec: lenient("AcdrtuxGnSkUWOmpsajJzZhPlRvwoBiMHL?", "gCTXfFbVIKN",
			names(`catenate concatenate create delete diff compare append test-label list update extract get
				check-device incremental ignore-failed-read no-check-device no-seek seek occurrence sparse
				exclude-backups exclude-caches exclude-caches-all exclude-caches-under exclude-vcs
				exclude-vcs-ignores no-null no-recursion no-unquote no-verbatim-files-from null recursion
				unquote verbatim-files-from anchored ignore-case no-anchored no-ignore-case no-wildcards
				no-wildcards-match-slash wildcards wildcards-match-slash keep-directory-symlink
				keep-newer-files keep-old-files no-overwrite-dir one-top-level overwrite overwrite-dir
				recursive-unlink remove-files skip-old-files unlink-first verify ignore-command-error
				no-ignore-command-error to-stdout atime-preserve clamp-mtime delay-directory-restore touch
				no-delay-directory-restore no-same-owner no-same-permissions numeric-owner
				preserve-permissions same-permissions same-owner preserve-order same-order acls no-acls
				no-selinux no-xattrs selinux xattrs force-local multi-volume read-full-records
				ignore-zeros old-archive portability posix auto-compress bzip2 xz lzip lzma lzop
				no-auto-compress zstd gzip gunzip ungzip compress uncompress backup hard-dereference
				dereference one-file-system absolute-names checkpoint full-time check-links block-number
				show-defaults show-omitted-dirs show-snapshot-field-ranges show-transformed-names
				show-stored-names totals utc verbose interactive confirmation help restrict usage version`),
			names(`listed-incremental hole-detection level sparse-version add-file directory exclude
				exclude-ignore exclude-ignore-recursive exclude-tag exclude-tag-all exclude-tag-under
				files-from exclude-from to-command group group-map mode mtime owner owner-map sort
				xattrs-exclude xattrs-include file info-script new-volume-script tape-length rmt-command
				rsh-command volno-file blocking-factor record-size format pax-option label
				use-compress-program starting-file newer-mtime newer after-date suffix strip-components
				transform xform checkpoint-action index-file no-quote-chars quote-chars quoting-style
				warning`)),
		runs: []optRun{
			{names: []string{"I", "use-compress-program"}, kind: runShell, args: [][]string{{" -d"}}},
			{names: []string{"to-command"}, kind: runShell},
			{names: []string{"F", "info-script", "new-volume-script"}, kind: runShell},
			{names: []string{"checkpoint-action"}, kind: runShell, prefix: "exec="},
			{names: []string{"rsh-command"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"rmt-command"}, kind: runRemote},
		},
		prepare: tarOldStyle,
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			// tar reads a line starting with "-" in a -T file as an option.
			if (p.has("T", "files-from") || len(p.values("", "add-file")) > 0) &&
				!p.has("", "verbatim-files-from") && !p.has("", "null") {
				return []runs{{unknown: "reads file names from a file, where a line starting with - is an option (--to-command, ...); add --verbatim-files-from", allowOnly: true}}, nil
			}
			return nil, nil
		},
	}
}

// tarOldStyle rewrites tar's old-style first word ("czf x.tgz": letters
// without a dash, whose values follow in order) into options.
func tarOldStyle(c *checker, args []shWord) ([]shWord, error) {
	if len(args) == 0 || args[0].text == "" || args[0].text[0] == '-' {
		return args, nil
	}
	first := args[0]
	if !first.literal() {
		return nil, c.refuse("tar %s: the word is only known when the line runs and may be options, so what tar runs cannot be found", shown(first.src))
	}
	var out []shWord
	next := 1
	for i := 0; i < len(first.text); i++ {
		ch := first.text[i]
		out = append(out, shWord{text: "-" + string(ch), src: first.src})
		if strings.IndexByte("gCTXfFLbHVIKN", ch) >= 0 && next < len(args) {
			out = append(out, args[next])
			next++
		}
	}
	return append(out, args[next:]...), nil
}

// zipProgram: zip -TT CMD (or --unzip-command CMD) tests the archive with
// CMD through the shell, {} standing for the archive's name. zip's own
// parser takes "-TT" as one option.
func zipProgram() *optProgram {
	return &optProgram{
		spec: lenient("", "", nil, nil),
		prepare: func(c *checker, args []shWord) ([]shWord, error) {
			var out []shWord
			for i := 0; i < len(args); i++ {
				w := args[i]
				t := w.text
				switch {
				case t == "--" || t == "-@":
					out = append(out, args[i:]...)
					return out, nil
				case strings.HasPrefix(t, "--"):
					name, v, eq := strings.Cut(t[2:], "=")
					if len(name) >= 2 && strings.HasPrefix("unzip-command", name) {
						t = "-TT"
						if eq {
							t += v
						}
					}
				}
				if len(t) > 1 && t[0] == '-' && t[1] != '-' && strings.Contains(t, "TT") {
					_, v, _ := strings.Cut(t, "TT")
					v = strings.TrimPrefix(v, "=")
					val := shWord{text: v, src: w.src}
					if v == "" && i+1 < len(args) {
						i++
						val = args[i]
					}
					val.text = strings.ReplaceAll(val.text, "{}", "zi-archive")
					out = append(out, shWord{text: "--unzip-command=" + val.text, src: w.src, splits: val.splits})
					continue
				}
				out = append(out, shWord{text: t, src: w.src, splits: w.splits})
			}
			return out, nil
		},
		runs: []optRun{{names: []string{"unzip-command"}, kind: runShell}},
	}
}

func manProgram() *optProgram {
	spec := lenient("dDfkKlwWcaiIu7tZ?V", "CRLmMSsePrpE",
		names(`debug default warnings whatis apropos global-apropos local-file where path location
			where-cat location-cat catman regex wildcard names-only all update no-subpages ascii
			no-hyphenation nh no-justification nj troff troff-device html gxditview ditroff help usage
			version ignore-case match-case`),
		names(`config-file recode locale systems manpath sections extension pager prompt encoding
			preprocessor`))
	spec.attached = "HTX" // -H[BROWSER], -T[DEVICE], -X[DPI]
	return &optProgram{
		spec: spec,
		runs: []optRun{
			{names: []string{"P", "pager"}, kind: runShell},
			{names: []string{"H", "html"}, kind: runShell},
			{names: []string{"C", "config-file"}, kind: runHidden, why: "reads a configuration file, which can name the programs man runs"},
		},
	}
}

// lessProgram: less runs the commands of "+cmd" words ("!" runs a shell),
// reads key bindings and environment settings (LESSOPEN) from lesskey
// files, and writes its input to a log file with -o.
func lessProgram() *optProgram {
	return &optProgram{
		spec: lenient("?aABcdeEfFgGiIJKLmMnNqQrRsSuUVwWX~", "bDhjkoOpPtTxyz\"#",
			names(`help search-skip-screen SEARCH-SKIP-SCREEN auto-buffers clear-screen dumb quit-at-eof
				QUIT-AT-EOF force quit-if-one-screen hilite-search HILITE-SEARCH ignore-case IGNORE-CASE
				status-column quit-on-intr no-lessopen long-prompt LONG-PROMPT line-numbers LINE-NUMBERS
				quiet QUIET silent SILENT raw-control-chars RAW-CONTROL-CHARS squeeze-blank-lines
				chop-long-lines underline-special UNDERLINE-SPECIAL version hilite-unread HILITE-UNREAD
				no-init tilde file-size follow-name incsearch mouse no-keypad no-histdups save-marks
				use-backslash use-color`),
			names(`buffers color max-back-scroll jump-target lesskey-file lesskey-src lesskey-content
				log-file LOG-FILE pattern prompt tag tag-file tabs max-forw-scroll window quotes shift
				line-num-width rscroll status-col-width wheel-lines `+lessCommand)),
		runs: []optRun{
			{names: []string{"k", "lesskey-file", "lesskey-src", "lesskey-content"}, kind: runHidden,
				why: "reads key bindings and settings (LESSOPEN among them) that can run commands"},
		},
		prepare: func(c *checker, args []shWord) ([]shWord, error) {
			// "+cmd" is an initial command; less reads it anywhere
			// before "--".
			out := append([]shWord(nil), args...)
			for i, w := range out {
				if w.text == "--" {
					break
				}
				if strings.HasPrefix(w.text, "+") {
					out[i].text = "--" + lessCommand + "=" + w.text[1:]
				}
			}
			return out, nil
		},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			var rs []runs
			for _, v := range p.vals {
				switch v.name {
				case "o", "O", "log-file", "LOG-FILE":
					if err := c.writesNamed("less "+shown(v.val.src), v.val); err != nil {
						return nil, err
					}
				case lessCommand:
					if !lessSafeCommand(v.val) {
						rs = append(rs, runs{unknown: "runs initial command " + shown(v.val.src) + ", which can run shell commands (!) or write files; only +NUMBER and +/PATTERN are checked", allowOnly: true})
					}
				}
			}
			return rs, nil
		},
	}
}

// lessCommand stands, among less's options, for an initial command.
const lessCommand = "+"

// lessSafeCommand reports whether an initial command of less only moves:
// a line number, or a search with nothing after the pattern.
func lessSafeCommand(w shWord) bool {
	t := w.text
	switch {
	case !w.literal():
		return false
	case t == "" || strings.Trim(t, "0123456789") == "" || t == "G" || t == "g":
		return true
	case (t[0] == '/' || t[0] == '?') && !strings.ContainsFunc(t, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return true
	}
	return false
}

func diffProgram(name string) *optProgram {
	prog := &optProgram{
		spec: lenient("iEZbWBalstdHv", "oIw",
			names(`ignore-case ignore-tab-expansion ignore-trailing-space ignore-space-change ignore-all-space
				ignore-blank-lines strip-trailing-cr text left-column suppress-common-lines expand-tabs
				minimal speed-large-files help version`),
			names(`output ignore-matching-lines width tabsize diff-program`)),
		runs: []optRun{
			{names: []string{"diff-program"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"o", "output"}, kind: runHidden, why: "merges interactively, reading commands from standard input that can start an editor"},
		},
	}
	if name == "diff3" {
		prog.spec = lenient("AeE3xXimaTv", "L",
			names(`show-all ed show-overlap easy-only overlap-only merge text strip-trailing-cr initial-tab
				help version`),
			names(`diff-program label`))
		prog.runs = prog.runs[:1]
	}
	return prog
}

func rgProgram() *optProgram {
	return &optProgram{
		spec: lenient("", "ABCEefgjMmrTtd", names(`pre-glob search-zip no-pre`),
			names(`pre hostname-bin after-context before-context context encoding regexp file glob iglob
				max-columns max-count replace type-not type type-add type-clear max-depth path-separator
				hyperlink-format`)),
		runs: []optRun{
			{names: []string{"pre"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"hostname-bin"}, kind: runProgram, args: [][]string{{}}},
		},
	}
}

func wgetProgram() *optProgram {
	return &optProgram{
		spec: lenient("", "eOoaiPUTtwQlAIXRD", nil, names(`use-askpass execute config output-document`)),
		runs: []optRun{
			{names: []string{"use-askpass"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"e", "execute", "config"}, kind: runHidden, why: "runs wgetrc commands, which can name a program (use_askpass)"},
		},
	}
}

// writesNamed checks a file that an option or program text names for a
// command to write, as an output redirection's target is checked: a
// literal path against the write rules; one only known when the line
// runs is refused where there are write rules.
func (c *checker) writesNamed(what string, w shWord) error {
	switch {
	case !w.literal() || w.text == "" || w.tilde:
		// "~" is where $HOME points when the line runs.
		if c.p.hasOwnPathRules(Write) {
			return c.refuse("%s writes to a file only known when the line runs, so the path rules cannot check it", what)
		}
		return nil
	case c.specialFile(w.text) != notSpecial:
		return nil // a device, or the program's own standard output
	case c.elsewhere:
		return c.refuse("%s writes a file under another root directory or on another host, where the path rules cannot place it", what)
	}
	return c.target(shWord{text: w.text, src: w.src}, []Op{Write}, what)
}

// pytestProgram: pytest runs the project's tests by design; these options
// make it run more: text files as doctests, configuration that adds
// options, plugins by module name, a debugger reading standard input. It
// removes the directory --basetemp names.
func pytestProgram() *optProgram {
	return &optProgram{
		spec: lenient("hvqsxlV", "cokmprWn",
			names(`pdb trace pyargs strict-markers strict-config continue-on-collection-errors cache-clear
				last-failed failed-first new-first lf ff nf exitfirst verbose quiet capture showlocals help
				version debug collect-only co`),
			names(`doctest-glob config-file override-ini pdbcls basetemp rootdir confcutdir junitxml
				junit-xml log-file result-log report-log import-mode maxfail durations tb tx px dist
				numprocesses maxprocesses rsyncdir`)),
		runs: []optRun{
			{names: []string{"doctest-glob"}, kind: runHidden, why: "runs the Python in text files as doctests"},
			{names: []string{"c", "config-file", "o", "override-ini"}, kind: runHidden, why: "reads configuration that can add options and plugins"},
			{names: []string{"pdb", "trace"}, kind: runHidden, flag: true, why: "starts a debugger that runs Python read from standard input"},
			{names: []string{"pdbcls"}, kind: runHidden, why: "imports a debugger class named by an option"},
		},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			var rs []runs
			for _, v := range p.vals {
				switch v.name {
				case "p":
					if !strings.HasPrefix(v.val.text, "no:") {
						rs = append(rs, hiddenRun("loads plugin module "+shown(v.val.src)))
					}
				case "basetemp", "junitxml", "junit-xml", "log-file", "result-log", "report-log":
					if err := c.writesNamed("pytest --"+v.name, v.val); err != nil {
						return nil, err
					}
				case "tx", "px":
					r, err := c.xdistSpec(v.val)
					if err != nil {
						return nil, err
					}
					rs = append(rs, r...)
				case "rsyncdir":
					rs = append(rs, runs{unknown: "copies directories to the hosts of its --tx gateways (--rsyncdir)"})
				}
			}
			return rs, nil
		},
	}
}

// xdistSpec returns what a pytest-xdist gateway spec (--tx, --px) runs:
// "[N*]popen[//key=value...]" starts python processes on this host, with
// "python=EXE" the program EXE (whose name is checked, as npm's
// --script-shell is) and "env:NAME=VALUE" a variable set for them;
// "ssh=HOST", "socket=ADDRESS", "vagrant_ssh=..." and "via=ID" run the
// tests elsewhere, through ssh with options (ssh_config=FILE) the checker
// cannot see. A key the checker does not know is refused.
func (c *checker) xdistSpec(w shWord) ([]runs, error) {
	if !w.literal() {
		return []runs{{unknown: "takes a gateway spec " + shown(w.src) + " only known when the line runs, which can name programs to run (python=, ssh=)"}}, nil
	}
	parts := strings.Split(w.text, "//")
	kind := parts[0]
	if n, rest, ok := strings.Cut(kind, "*"); ok && isNumber(shWord{text: n}) {
		kind = rest
	}
	if kind != "popen" {
		return []runs{{unknown: "runs tests through gateway " + shown(kind) + " (--tx), over ssh or a socket, with options the checker cannot see"}}, nil
	}
	var rs []runs
	for _, kv := range parts[1:] {
		key, value, _ := strings.Cut(kv, "=")
		switch {
		case key == "python":
			if value == "" {
				return []runs{{unknown: "names an empty python for its gateway"}}, nil
			}
			rs = append(rs, runs{words: []shWord{{text: value, src: value}}, nameOnly: true, via: "--tx python="})
		case strings.HasPrefix(key, "env:"):
			if name := strings.TrimPrefix(key, "env:"); c.steers(name) {
				return nil, c.refuse("pytest --tx %s: setting %s changes what commands run, which the rules cannot follow", shown(w.src), name)
			}
		case key == "chdir":
			c.line.cd = true
		case key == "id", key == "nice", key == "dont_write_bytecode", key == "execmodel", key == "":
		default:
			return []runs{{unknown: "takes gateway option " + shown(kv) + " (--tx), which the checker does not know"}}, nil
		}
	}
	return rs, nil
}

// journalctlProgram runs nothing through its options; its option table
// lets deny rules tell an abbreviation from another option
// (--cursor is not --cursor-file).
func journalctlProgram() *optProgram {
	spec := lenient("hefalqmkNxr", "oDpgcSUtuFM",
		names(`all boot case-sensitive catalog disk-usage dmesg dump-catalog fields flush follow force header
				help lines list-boots list-catalog merge no-full no-hostname no-pager no-tail pager-end quiet
				relinquish-var reverse rotate setup-keys show-cursor smart-relinquish-var sync system
				update-catalog user utc verify version`),
		names(`after-cursor cursor-file cursor directory facility field file grep identifier image interval
				machine namespace output-fields output priority root since unit until user-unit vacuum-files
				vacuum-size vacuum-time verify-key`))
	spec.attached = "nb" // -n[N], -b[ID]
	return &optProgram{spec: spec}
}
