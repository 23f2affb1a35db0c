package policy

import (
	"slices"
	"strings"
)

// The git commands below run programs, or write what makes git run them
// later, through their arguments. The list was made from every command
// git 2.39 lists (git help -a) and its programs (git --exec-path): the
// commands that run what a word of their command line names, those that
// hand out stored passwords, those that start other programs whatever
// their arguments (a browser, a merge tool, a Tk window, another
// version-control system's tools), and those that schedule git to run
// outside the agent. Hooks, which many commands run (am, commit, merge,
// push, receive-pack, ...), never run under the guard (core.hooksPath).

// gitCommand describes one git command's options that run a program,
// write a file they name, or give configuration.
type gitCommand struct {
	refused string // the whole command is refused: why
	// operands says why the command is refused given its operands
	// (args: all its words; ops: those that are not options), or "".
	operands func(args, ops []shWord) string
	// runs are long options that run a program; their abbreviations
	// (which git accepts) too. runShort are short ones. runsWhy says
	// what they run, when it is not a program named on the line.
	runs     []string
	runShort string
	runsWhy  string
	// valued are the short options that take a value (so that a
	// cluster such as -xCMD is read right); attached those whose
	// optional value can only be attached (-S[KEYID]).
	valued, attached string
	// writes are long options whose value is a file written;
	// writeShort the short ones.
	writes     []string
	writeShort string
	// config are options whose value is a setting KEY=VALUE.
	config      []string
	configShort string
	resumable   bool
}

// firstOperand refuses a command whose first operand is a key of why.
func firstOperand(why map[string]string) func(args, ops []shWord) string {
	return func(_, ops []shWord) string {
		if len(ops) == 0 {
			return ""
		}
		return why[ops[0].text]
	}
}

var gitCommands = map[string]gitCommand{
	// Options that run a program: the remote's upload-pack or
	// receive-pack (run through a shell for local and ssh remotes), the
	// command of archive --remote, rebase's commands between steps,
	// grep's pager.
	"fetch":      {runs: []string{"upload-pack"}},
	"pull":       {runs: []string{"upload-pack"}},
	"ls-remote":  {runs: []string{"upload-pack", "exec"}},
	"fetch-pack": {runs: []string{"upload-pack", "exec"}},
	"push":       {runs: []string{"receive-pack", "exec"}},
	"send-pack":  {runs: []string{"receive-pack", "exec"}},
	"archive":    {runs: []string{"exec"}, writes: []string{"output"}, writeShort: "o", valued: "o"},
	"clone": {runs: []string{"upload-pack", "template"}, runShort: "u", valued: "obucj",
		config: []string{"config"}, configShort: "c"},
	"init":        {runs: []string{"template"}},
	"rebase":      {runs: []string{"exec"}, runShort: "x", valued: "xsXC", attached: "S", resumable: true},
	"cherry-pick": {resumable: true},
	"revert":      {resumable: true},
	"grep":        {runs: []string{"open-files-in-pager"}, runShort: "O", valued: "efABCm"},
	"help":        {runs: []string{"web"}, runShort: "w", runsWhy: "starts a web browser"},
	// Operands that run a program, or schedule git to run outside the
	// agent. git bisect is a script that hands its words to bisect--helper;
	// git submodule one that hands them to submodule--helper.
	"bisect":            {operands: bisectOperands},
	"bisect--helper":    {operands: bisectOperands, runs: []string{"bisect-run", "bisect-visualize"}, runsWhy: "runs the command it is given (or gitk)"},
	"submodule":         {operands: firstOperand(map[string]string{"foreach": "git submodule foreach runs the command it is given in every submodule"})},
	"submodule--helper": {operands: firstOperand(map[string]string{"foreach": "git submodule--helper foreach runs the command it is given in every submodule"})},
	"maintenance": {operands: firstOperand(map[string]string{"start": "git maintenance start schedules git to run outside the agent",
		"register": "git maintenance register schedules git to run outside the agent"})},
	// Options naming a file the command writes (like --output, which
	// every command that shows a diff takes).
	"format-patch":   {writes: []string{"output-directory"}, writeShort: "o", valued: "ov"},
	"config":         {writes: []string{"file"}, writeShort: "f", valued: "f"},
	"bugreport":      {writes: []string{"output-directory"}, writeShort: "o", valued: "os"},
	"diagnose":       {writes: []string{"output-directory"}, writeShort: "o", valued: "os"},
	"fast-import":    {writes: []string{"export-marks", "export-pack-edges"}},
	"fast-export":    {writes: []string{"export-marks"}},
	"checkout-index": {writes: []string{"prefix"}},
	// Commands that run programs whatever their arguments. difftool and
	// mergetool start a tool even when none is configured (vimdiff),
	// which reads its own configuration and environment (VIMINIT).
	"difftool":          {refused: "git difftool runs a program to show each diff (vimdiff when none is configured), which runs what its own configuration and environment say"},
	"difftool--helper":  {refused: "git difftool--helper runs the diff tool its environment and configuration name"},
	"mergetool":         {refused: "git mergetool runs a program to resolve each conflict (vimdiff when none is configured), which runs what its own configuration and environment say"},
	"merge-index":       {refused: "git merge-index runs the program it is given for each unmerged file"},
	"remote-ext":        {refused: "git remote-ext runs the command it is given as a remote"},
	"filter-branch":     {refused: "git filter-branch runs the shell commands it is given"},
	"send-email":        {refused: "git send-email runs mail programs and commands it is given"},
	"instaweb":          {refused: "git instaweb starts a web server and a browser"},
	"web--browse":       {refused: "git web--browse starts a browser"},
	"gui":               {refused: "git gui starts a Tk program, which runs the tools its configuration names"},
	"citool":            {refused: "git citool starts a Tk program, which runs the tools its configuration names"},
	"daemon":            {refused: "git daemon serves repositories and runs access hooks"},
	"shell":             {refused: "git shell runs the commands of ~/git-shell-commands"},
	"fsmonitor--daemon": {refused: "git fsmonitor--daemon starts a daemon that outlives the command line"},
	"scalar":            {refused: "scalar registers repositories with git maintenance, which runs outside the agent"},
	// Bridges to other version-control systems run their programs (svn,
	// p4, cvs, tla) and programs named by options (git svn --authors-prog).
	"svn":             {refused: "git svn runs svn and the programs its options name (--authors-prog)"},
	"p4":              {refused: "git p4 runs p4 and an editor for submissions"},
	"cvsimport":       {refused: "git cvsimport runs cvsps and cvs"},
	"cvsexportcommit": {refused: "git cvsexportcommit runs cvs"},
	"cvsserver":       {refused: "git cvsserver serves repositories to cvs clients"},
	"archimport":      {refused: "git archimport runs tla or baz"},
}

// gitCredentialRefusal is why git credential and the credential helpers
// (credential-store, credential-cache, credential-libsecret,
// credential-manager, ... any git-credential-* program) are refused:
// "get" and "fill" print stored passwords.
const gitCredentialRefusal = "git credential and the credential helpers (git credential-*) hand out stored passwords"

// gitCommandRule returns the rule for git command cmd.
func gitCommandRule(cmd string) gitCommand {
	if strings.HasPrefix(cmd, "credential") {
		return gitCommand{refused: strings.Replace(gitCredentialRefusal, "git credential and", "git "+cmd+": git credential and", 1)}
	}
	return gitCommands[cmd]
}

// bisectOperands refuses git bisect run, which runs the command it is
// given, and git bisect visualize (view) unless options for git log
// follow it: it runs the command it is given when that is tig or starts
// with "git", and gitk when there is none and a display.
func bisectOperands(args, ops []shWord) string {
	if len(ops) == 0 {
		return ""
	}
	switch ops[0].text {
	case "run":
		return "git bisect run runs the command it is given"
	case "visualize", "view":
		i := slices.IndexFunc(args, func(w shWord) bool { return w.text == ops[0].text })
		if i+1 < len(args) && strings.HasPrefix(args[i+1].text, "-") && args[i+1].literal() {
			return ""
		}
		return "git bisect " + ops[0].text + " runs the command it is given (gitk without one); give it git log options instead (git bisect view --stat)"
	}
	return ""
}

// gitConfigOptions are the long options of git config that take a value
// as the next word (those before "|"), and its actions.
var gitConfigOptions = []string{"file", "blob", "type", "default", "comment", "value", "|",
	"get", "get-all", "get-regexp", "get-urlmatch", "replace-all", "add", "unset", "unset-all",
	"rename-section", "remove-section", "list", "edit", "get-color", "get-colorbool"}

// gitConfigWrites says why a git config command line is refused, or "":
// it may set only keys known to run no program (see gitWritable), since
// a setting it writes is one the guard would then let git run with. A
// key the operator allows with bash.git.allow_config is trusted as files
// have it, not as a caller would set it. Words are read as pairs of key
// and value wherever they may be (an option this table does not know may
// take a value); renaming a section, which can make any key of a
// harmless section one that runs a program, is refused.
func gitConfigWrites(args []shWord) string {
	var ops []shWord
	reads := false
	for i := 0; i < len(args); i++ {
		w := args[i]
		t := w.text
		switch {
		case t == "--":
			ops = append(ops, args[i+1:]...)
			i = len(args)
		case len(ops) > 0 || !strings.HasPrefix(t, "-") || t == "-":
			// git config stops reading options at its first operand.
			ops = append(ops, args[i:]...)
			i = len(args)
		case strings.HasPrefix(t, "--"):
			name, _, eq := strings.Cut(t[2:], "=")
			full := gitConfigOption(name)
			switch {
			case full == "rename-section":
				return "git config --rename-section can give the keys of a section another section's meaning; under this host policy it is refused"
			case slices.Index(gitConfigOptions, full) > slices.Index(gitConfigOptions, "|") && full != "replace-all" && full != "add":
				reads = true
			case slices.Index(gitConfigOptions, full) >= 0 && slices.Index(gitConfigOptions, full) < slices.Index(gitConfigOptions, "|") && !eq:
				i++ // its value
			}
		default:
			// Short options: -f FILE takes a value; -l and -e read or edit.
			if strings.ContainsAny(t[1:], "le") {
				reads = true
			}
			if strings.HasSuffix(t, "f") {
				i++
			}
		}
	}
	if len(ops) > 0 && ops[0].text == "rename-section" {
		return "git config rename-section can give the keys of a section another section's meaning; under this host policy it is refused"
	}
	if reads {
		return ""
	}
	for i := 0; i+1 < len(ops); i++ {
		key, value := ops[i], ops[i+1]
		if !key.literal() || !strings.Contains(key.text, ".") || strings.HasPrefix(key.text, "-") {
			continue // not a key; one only known when the line runs is the guard's
		}
		// A value only known when the line runs is the guard's to check.
		if known, _, _ := strings.Cut(value.text, string(dyn)); !gitWritable(key.text, known) {
			return "git config " + shown(key.src) + ": under this host policy git config sets only keys known not to run programs (user.*, branch.*, color.*, ...); " +
				normaliseGitKey(key.text) + " is not one of them"
		}
	}
	return ""
}

// gitConfigOption resolves an abbreviation of a long option of git config
// (git takes any unambiguous one), or returns name.
func gitConfigOption(name string) string {
	var cands []string
	for _, o := range gitConfigOptions {
		if o == name {
			return o
		}
		if o != "|" && strings.HasPrefix(o, name) {
			cands = append(cands, o)
		}
	}
	if len(cands) == 1 {
		return cands[0]
	}
	return name
}

// gitWritable reports whether a git command may set key to value: the key
// is known to make git run no program (gitHarmless), and a URL value does
// not name a remote helper (a value's known start, when the rest is only
// known when the line runs: the guard sees all of it).
func gitWritable(key, value string) bool {
	key = normaliseGitKey(key)
	if !slices.ContainsFunc(gitHarmless, func(p string) bool { return starMatch(p, key) }) {
		return false
	}
	if slices.ContainsFunc(gitURLKeys, func(p string) bool { return starMatch(p, key) }) {
		return !remoteHelperURL(value)
	}
	return true
}

// gitForEachRepo returns the git command line git for-each-repo runs in
// each repository (its words after its options), or nil.
func gitForEachRepo(args []shWord) []shWord {
	for i := 0; i < len(args); i++ {
		t := args[i].text
		switch {
		case t == "--":
			return args[i+1:]
		case t == "--config" || t == "--conf" || t == "--con" || t == "--co" || t == "--c":
			i++
		case strings.HasPrefix(t, "-"):
		default:
			return args[i:]
		}
	}
	return nil
}
