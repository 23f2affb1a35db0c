package policy

import (
	"fmt"
	"path"
	"strings"
)

// dyn marks, in the text of a command, a part that is only known when the
// line runs: a variable, a substitution, a glob. Command lines holding a
// NUL byte are refused, so it never stands for itself.
const dyn = '\x00'

// cmdPattern is one compiled bash rule. It matches a command's words joined
// by single spaces, whole; "*" matches any text, spaces and slashes
// included. A pattern ending in " *" also matches without it: "git *"
// covers a bare "git". The first word is a command name, compared as
// commandName leaves it.
type cmdPattern struct {
	text string   // as written (spaces normalised)
	alts []string // the pattern, and the pattern without its " *" tail
	// opts are the options a deny pattern names, which it also matches
	// when abbreviated or clustered (see optionReadings).
	opts patternOpts
}

func compileCmdPattern(text string, forDeny bool) (cmdPattern, error) {
	cp := cmdPattern{text: text}
	if text == "" {
		return cp, fmt.Errorf("empty pattern")
	}
	if strings.ContainsFunc(text, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return cp, fmt.Errorf("%q contains a control character", text)
	}
	name, rest, _ := strings.Cut(text, " ")
	p := commandName(name, forDeny)
	if rest != "" {
		p += " " + rest
	}
	cp.alts = []string{p}
	if bare, ok := strings.CutSuffix(p, " *"); ok {
		cp.alts = append(cp.alts, bare)
	}
	if forDeny {
		cp.opts = patternOptions(p)
	}
	return cp, nil
}

// sysBinDir reports whether dir holds the system's own commands:
// "/usr/bin/git" is "git".
func sysBinDir(dir string) bool {
	switch dir {
	case "/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/opt/homebrew/bin":
		return true
	}
	return false
}

// commandName normalises a command name for matching. For deny rules a
// name with a directory counts as its last element, wherever it is:
// "/tmp/x/rm" is "rm". For allow rules only the system's own directories
// are dropped ("/usr/bin/git" is "git"), so that "./git", a program a
// caller may have written, is not taken for the git an allow rule means.
func commandName(name string, forDeny bool) string {
	dir, base := path.Split(name)
	if dir == "" || base == "" {
		return name
	}
	if forDeny {
		return base
	}
	if sysBinDir(path.Clean(dir)) {
		return base
	}
	return name
}

// must reports whether the pattern matches s for every value its unknown
// parts may take. Pattern text never holds dyn, so only a "*" can absorb
// one, and a "*" absorbs anything.
func (cp *cmdPattern) must(s string) bool {
	for _, a := range cp.alts {
		if starMatch(a, s) {
			return true
		}
	}
	return false
}

// may reports whether the pattern matches s for some value of its unknown
// parts.
func (cp *cmdPattern) may(s string) bool {
	if strings.IndexByte(s, dyn) < 0 {
		return cp.must(s)
	}
	for _, a := range cp.alts {
		if overlap(a, s) {
			return true
		}
	}
	return false
}

// denies reports whether the deny pattern may match the command whose
// words (the first normalised by commandName) are texts, with the options
// it names read in every spelling the command may take them in (see
// optionReadings). reading is the words as they matched, when that took
// another spelling.
func (cp *cmdPattern) denies(texts []string, known *optSpec) (matched bool, reading string) {
	if cp.may(strings.Join(texts, " ")) {
		return true, ""
	}
	if cp.opts.empty() {
		return false, ""
	}
	readings, all := cp.opts.optionReadings(texts, known)
	if all {
		return true, "with more spellings of its options than can be tried"
	}
	for _, r := range readings {
		if s := strings.Join(r, " "); cp.may(s) {
			return true, s
		}
	}
	return false, ""
}

// starMatch reports whether s matches pattern p, where "*" matches any
// sequence of bytes and every other byte itself. It runs in linear time
// for the common case: a greedy scan that backtracks only to the last
// star.
func starMatch(p, s string) bool {
	pi, si := 0, 0
	starP, starS := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			starP, starS = pi, si
			pi++
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case starP >= 0:
			starS++
			pi, si = starP+1, starS
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// overlap reports whether some string matches both p, where "*" matches
// any text, and s, where dyn matches any text. It fills one row of a
// table at a time: row[j] says whether p[i:] and s[j:] can match.
func overlap(p, s string) bool {
	m := len(s)
	next := make([]bool, m+1) // for p[i+1:]
	cur := make([]bool, m+1)  // for p[i:]
	next[m] = true
	for j := m - 1; j >= 0; j-- {
		next[j] = s[j] == dyn && next[j+1]
	}
	for i := len(p) - 1; i >= 0; i-- {
		star := p[i] == '*'
		cur[m] = star && next[m]
		for j := m - 1; j >= 0; j-- {
			switch {
			case star && (next[j] || cur[j+1]):
				// The star matches nothing, or swallows s[j].
				cur[j] = true
			case s[j] == dyn:
				// The unknown part is empty, or swallows p[i].
				cur[j] = cur[j+1] || next[j]
			default:
				cur[j] = !star && p[i] == s[j] && next[j+1]
			}
		}
		next, cur = cur, next
	}
	return next[0]
}

// commandRules are the compiled bash rules. Deny patterns compare command
// names by their last element, allow patterns only drop system
// directories (see commandName).
type commandRules struct {
	allow, deny []cmdPattern
}

func (p *Policy) compileBash() []error {
	r := p.rules.Bash
	var errs []error
	if !r.empty() {
		p.lang = shellLanguage(p.env.Shell)
		if p.env.OS == osWindows || p.lang == langPowerShell {
			// Accepted, so that one policy file serves a mixed fleet:
			// CheckCommand refuses every line here and says why.
			p.lang = langPowerShell
		} else if p.lang == langUnsupported {
			errs = append(errs, fmt.Errorf("bash: the agent's shell %s is not bash, sh, dash, ash, ksh or mksh, so its command lines cannot be checked; run the agent with --shell bash, or drop the bash rules", p.env.Shell))
		}
	}
	for _, l := range []struct {
		name    string
		texts   []string
		forDeny bool
		out     *[]cmdPattern
	}{{"bash.allow", r.Allow, false, &p.bash.allow}, {"bash.deny", r.Deny, true, &p.bash.deny}} {
		for _, t := range l.texts {
			cp, err := compileCmdPattern(t, l.forDeny)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", l.name, err))
				continue
			}
			*l.out = append(*l.out, cp)
		}
	}
	return errs
}
