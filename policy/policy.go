package policy

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
)

// Env is what a policy needs to know about its host. It is fixed when the
// policy is parsed.
type Env struct {
	// Cwd is the agent's working directory, an absolute path: relative path
	// patterns and relative redirection targets resolve against it.
	Cwd string
	// Home is what "~" expands to. Empty: patterns starting with "~" are
	// an error.
	Home string
	// Tools are the names of the tools the agent serves. A tools rule that
	// names another tool is an error, so a typo never goes unnoticed.
	Tools []string
	// Shell is the shell bash commands run with (a name or a path). It
	// chooses the syntax the command rules parse: bash's for bash; for sh,
	// dash, ash and posh both POSIX sh's and bash's, and a line must pass
	// in both (a POSIX shell reads some lines differently, and /bin/sh is
	// bash on some systems); mksh's for ksh and mksh. Command rules on any
	// other shell are an error: they could not be checked.
	Shell string
	// OS is the host's operating system as Go names it (runtime.GOOS).
	// "windows" selects Windows path semantics (see winpath.go): drive
	// letters, "\" separators, names compared without case, UNC and
	// device paths refused unless allowed. Anything else is POSIX.
	// Command rules cannot be checked on Windows (see CheckCommand).
	OS string
	// FoldCase is set where the file system compares names without
	// regard to case and Unicode normalization, as macOS's default file
	// system (APFS) does: /Users/u/.SSH is /Users/u/.ssh there. Path rules
	// then compare names the same way (see FoldName). The agent sets it
	// on macOS; Windows paths are always compared without case.
	FoldCase bool
	// GitGuarded is set when bash runs git through the agent's git
	// guard, which checks the configuration git would run with (see
	// GitRules). Without it, command rules refuse git: repository
	// configuration can make it run any program.
	GitGuarded bool
}

// Op is what a file tool does with a path.
type Op int

const (
	// Read opens a file to read it.
	Read Op = iota
	// Write creates, replaces or changes a file.
	Write
)

func (op Op) String() string {
	if op == Write {
		return "write"
	}
	return "read"
}

// Denial is a refusal by the host policy. Its message names what was
// refused and the rule that refused it.
type Denial struct {
	// Rule names the rule list that decided, such as "bash.deny" or
	// "paths.write.allow"; "bash" for a command line the rules cannot
	// check.
	Rule string
	// Reason says what was refused and why.
	Reason string
}

func (d *Denial) Error() string { return "denied by host policy: " + d.Reason }

// Policy is a parsed host policy. The zero value and nil are unrestricted;
// a Policy is safe for concurrent use.
type Policy struct {
	env    Env
	lang   shellLang
	rules  rules // as normalised, for the digest and the summary
	digest string

	tools  nameRules
	skills nameRules
	paths  pathRules
	bash   commandRules
	git    *GitRules
	// callers are the compiled callers section (callers.go).
	callers []*callerRule
	// narrow, in a policy ForCaller returned, are the rules of the
	// caller's entry, which every check applies too; narrowName names
	// the entry in denials.
	narrow     *Policy
	narrowName string
}

// Unrestricted reports whether the policy restricts nothing.
func (p *Policy) Unrestricted() bool { return p == nil || p.rules.empty() }

// Digest returns "sha256:" and the hex SHA-256 of the normalised policy:
// the same rules give the same digest whatever their order, formatting,
// comments or duplicates. It is "" for an unrestricted policy.
func (p *Policy) Digest() string {
	if p.Unrestricted() {
		return ""
	}
	return p.digest
}

// nameRules are allow and deny lists of names (tools, skills).
type nameRules struct {
	allow, deny []string
}

// decide returns the rule that refuses name ("deny", "allow") or "".
func (r *nameRules) decide(name string) string {
	match := func(pat string) bool {
		ok, err := doublestar.Match(pat, name)
		return ok && err == nil
	}
	if slices.ContainsFunc(r.deny, match) {
		return "deny"
	}
	if len(r.allow) > 0 && !slices.ContainsFunc(r.allow, match) {
		return "allow"
	}
	return ""
}

// AllowTool returns nil when the host serves tool name, or a *Denial. A
// policy narrowed for a caller (ForCaller) checks the caller's own rules
// too.
func (p *Policy) AllowTool(name string) error {
	if err := p.allowOwnTool(name); err != nil || p == nil || p.narrow == nil {
		return err
	}
	var d *Denial
	if err := p.narrow.allowOwnTool(name); errors.As(err, &d) {
		what := "lists it"
		if d.Rule == "tools.allow" {
			what = "lists only " + strings.Join(p.narrow.tools.allow, ", ")
		}
		return &Denial{Rule: p.narrowName + "." + d.Rule, Reason: fmt.Sprintf("tool %s is not allowed for this caller on this host (%s: %s %s)", name, p.narrowName, d.Rule, what)}
	}
	return nil
}

func (p *Policy) allowOwnTool(name string) error {
	if p == nil {
		return nil
	}
	switch p.tools.decide(name) {
	case "deny":
		return &Denial{"tools.deny", fmt.Sprintf("tool %s is not served on this host (tools.deny lists it)", name)}
	case "allow":
		return &Denial{"tools.allow", fmt.Sprintf("tool %s is not served on this host (tools.allow lists only %s)", name, strings.Join(p.tools.allow, ", "))}
	}
	return nil
}

// AllowSkill reports whether the host shows and runs the skill called
// name. A skill the policy refuses is left out of the host's skill catalog
// altogether.
func (p *Policy) AllowSkill(name string) bool {
	return p.CheckSkill(name) == nil
}

// CheckSkill returns nil when the host shows and runs the skill called
// name, or a *Denial naming the rule that refuses it.
func (p *Policy) CheckSkill(name string) error {
	if p == nil {
		return nil
	}
	switch p.skills.decide(name) {
	case "deny":
		return &Denial{"skills.deny", fmt.Sprintf("skill %s is refused on this host (skills.deny lists it)", name)}
	case "allow":
		return &Denial{"skills.allow", fmt.Sprintf("skill %s is refused on this host (skills.allow lists only %s)", name, strings.Join(p.skills.allow, ", "))}
	}
	return nil
}

// Summary returns one line per dimension (tools, paths, bash, skills),
// saying "unrestricted" where that is the case.
func (p *Policy) Summary() []string {
	var r rules
	if p != nil {
		r = p.rules
	}
	return r.summary()
}

// Parse reads a policy file (YAML or JSON) for a host described by env. An
// empty file, or one with only comments, is unrestricted. Every problem is
// an error naming it: unknown keys, unknown tools, invalid patterns. A
// policy that parses has all its rules compiled; nothing is checked later
// that could widen access.
func Parse(data []byte, env Env) (*Policy, error) {
	r, err := decodeRules(data)
	if err != nil {
		return nil, err
	}
	return compile(r, env)
}

// compile validates normalised rules for env and builds the Policy.
func compile(r rules, env Env) (*Policy, error) {
	if r.empty() {
		return &Policy{env: env}, nil
	}
	switch {
	case env.OS == osWindows && !isWinAbs(env.Cwd):
		return nil, fmt.Errorf("policy: working directory %q is not an absolute Windows path", env.Cwd)
	case env.OS == osWindows:
	case !filepath.IsAbs(env.Cwd):
		return nil, fmt.Errorf("policy: working directory %q is not an absolute path", env.Cwd)
	default:
		env.Cwd = filepath.Clean(env.Cwd)
	}
	p := &Policy{env: env, rules: r, digest: r.digest()}
	var errs []error
	errs = append(errs, p.compileTools()...)
	errs = append(errs, p.compileSkills()...)
	errs = append(errs, p.compilePaths()...)
	errs = append(errs, p.compileBash()...)
	errs = append(errs, p.compileGit()...)
	errs = append(errs, p.compileCallers()...)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Policy) compileTools() []error {
	var errs []error
	for _, list := range []struct {
		name  string
		names []string
	}{{"tools.allow", p.rules.Tools.Allow}, {"tools.deny", p.rules.Tools.Deny}} {
		for _, n := range list.names {
			if !slices.Contains(p.env.Tools, n) {
				errs = append(errs, fmt.Errorf("%s: unknown tool %q; this agent's tools are %s", list.name, n, strings.Join(p.env.Tools, ", ")))
			}
		}
	}
	p.tools = nameRules{allow: p.rules.Tools.Allow, deny: p.rules.Tools.Deny}
	return errs
}

func (p *Policy) compileSkills() []error {
	var errs []error
	for _, list := range []struct {
		name string
		pats []string
	}{{"skills.allow", p.rules.Skills.Allow}, {"skills.deny", p.rules.Skills.Deny}} {
		for _, pat := range list.pats {
			switch {
			case strings.ContainsAny(pat, "/ \t\r\n"):
				errs = append(errs, fmt.Errorf("%s: %q: a skill name or glob has no slashes or spaces", list.name, pat))
			case !doublestar.ValidatePattern(pat):
				errs = append(errs, fmt.Errorf("%s: %q is not a valid glob (check its [ ] and { } pairs)", list.name, pat))
			}
		}
	}
	p.skills = nameRules{allow: p.rules.Skills.Allow, deny: p.rules.Skills.Deny}
	return errs
}

// shellLang is the syntax the command rules parse.
type shellLang int

const (
	langBash shellLang = iota
	langSh             // a POSIX shell, or bash as sh: checked as both
	langMksh
	langPowerShell // never parsed: command rules refuse every line
	langUnsupported
)

// shellLanguage maps a shell's name or path to the syntax it speaks.
func shellLanguage(shell string) shellLang {
	base := path.Base(strings.ReplaceAll(shell, `\`, "/"))
	if b := strings.ToLower(base); strings.HasSuffix(b, ".exe") {
		base = strings.TrimSuffix(b, ".exe")
	}
	switch base {
	case "pwsh", "powershell":
		return langPowerShell
	}
	switch base {
	case ".", "/", "bash", "rbash":
		return langBash
	case "sh", "dash", "ash", "posh":
		return langSh
	case "ksh", "mksh", "ksh93", "oksh":
		return langMksh
	}
	return langUnsupported
}
