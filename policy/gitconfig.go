package policy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Git runs programs named in its configuration: core.fsmonitor on every
// git status, filter drivers chosen by .gitattributes, diff drivers, "!"
// aliases, ... Whoever can write a .git directory (or a bare repository,
// or the home directory's .gitconfig) can choose them. Under command
// rules the agent therefore runs git through a guard that asks git for
// the configuration the command would use and refuses to run it when any
// setting, at any scope, is outside the list below of settings known to
// run nothing; and it gives every git process settings that take
// precedence over every file and turn off what git runs from
// configuration under fixed names.

// GitConfigEntry is one setting as git config --list --show-scope
// --show-origin -z reports it.
type GitConfigEntry struct {
	Scope  string // system, global, local, worktree or command
	Origin string // where it is set: file:PATH, command line:, ...
	// Key is section[.subsection].name with the section and the name in
	// lower case, as git prints it.
	Key   string
	Value string
	// NoValue is set for a key written without "=", a boolean true.
	NoValue bool
}

// ParseGitConfigList parses the output of git config --list --show-scope
// --show-origin -z: per setting, the scope, the origin, then the key and
// (after a newline) the value, each ended by a NUL byte.
func ParseGitConfigList(data []byte) ([]GitConfigEntry, error) {
	if len(data) == 0 {
		return nil, nil
	}
	if data[len(data)-1] != 0 {
		return nil, errors.New("git config output does not end with a NUL byte; is this git config --list -z?")
	}
	fields := strings.Split(string(data[:len(data)-1]), "\x00")
	if len(fields)%3 != 0 {
		return nil, fmt.Errorf("git config output has %d fields, not scope, origin and setting for each; run git config --list --show-scope --show-origin -z", len(fields))
	}
	entries := make([]GitConfigEntry, 0, len(fields)/3)
	for i := 0; i < len(fields); i += 3 {
		e := GitConfigEntry{Scope: fields[i], Origin: fields[i+1]}
		var hasValue bool
		e.Key, e.Value, hasValue = strings.Cut(fields[i+2], "\n")
		e.NoValue = !hasValue
		switch {
		case e.Scope == "" || strings.ContainsAny(e.Scope, "\n\t "):
			return nil, fmt.Errorf("git config output: setting %d has scope %q", i/3+1, e.Scope)
		case !strings.Contains(e.Key, ".") || strings.HasPrefix(e.Key, ".") || strings.HasSuffix(e.Key, "."):
			return nil, fmt.Errorf("git config output: setting %d has key %q, not section.name", i/3+1, e.Key)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// GitSetting is a configuration setting given to git in its environment
// (GIT_CONFIG_KEY_n and GIT_CONFIG_VALUE_n), which takes precedence over
// every configuration file.
type GitSetting struct{ Key, Value string }

// gitOverride is a setting the agent gives every git process.
type gitOverride struct {
	GitSetting
	// also are further keys the setting turns off (credential.helper
	// set to "" empties the whole list of helpers).
	also string
	// quiet: files may set the key; the setting overrides them without
	// a word. Otherwise a file that sets another value is refused, so
	// that it shows.
	quiet bool
}

// gitOverrides turn off what git runs from configuration under fixed
// names. A -c option comes after them and would win: on the command line
// only their own values are accepted.
var gitOverrides = []gitOverride{
	{GitSetting: GitSetting{"core.fsmonitor", "false"}},                  // a hook program, run by git status
	{GitSetting: GitSetting{"core.hookspath", "/dev/null"}, quiet: true}, // hooks never run (hook managers set it)
	{GitSetting: GitSetting{"core.pager", "cat"}, quiet: true},           // GIT_PAGER=cat is set too
	{GitSetting: GitSetting{"core.editor", ":"}, quiet: true},            // ":" keeps the text as it is
	{GitSetting: GitSetting{"sequence.editor", ":"}, quiet: true},        // git rebase -i keeps its plan
	{GitSetting: GitSetting{"core.sshcommand", "ssh"}, quiet: true},      // GIT_SSH_COMMAND still wins
	{GitSetting: GitSetting{"core.askpass", ""}, quiet: true},            // no password prompts
	{GitSetting: GitSetting{"credential.helper", ""}, also: "credential.*.helper", quiet: true},
	{GitSetting: GitSetting{"gpg.program", "gpg"}, quiet: true},
	{GitSetting: GitSetting{"gpg.openpgp.program", "gpg"}, quiet: true},
	{GitSetting: GitSetting{"gpg.x509.program", "gpgsm"}, quiet: true},
	{GitSetting: GitSetting{"gpg.ssh.program", "ssh-keygen"}, quiet: true},
	{GitSetting: GitSetting{"help.autocorrect", "0"}, quiet: true},           // a typo never runs another command
	{GitSetting: GitSetting{"safe.barerepository", "explicit"}, quiet: true}, // a bare repository is only used when named
	{GitSetting: GitSetting{"protocol.ext.allow", "never"}, quiet: true},     // ext:: URLs run commands
	// git diff leaves the index as it is (GIT_OPTIONAL_LOCKS=0 does that
	// for git status): commands that only look write nothing.
	{GitSetting: GitSetting{"diff.autorefreshindex", "false"}, quiet: true},
}

// gitHarmless are the configuration keys known to make git run no
// program and write no file it is not asked to (patterns: "*" matches
// any text, dots included). Whatever is not here, or allowed by the
// operator, is refused.
var gitHarmless = []string{
	"user.*", "author.name", "author.email", "committer.name", "committer.email",
	"core.repositoryformatversion", "core.bare", "core.worktree", "core.filemode", "core.logallrefupdates",
	"core.ignorecase", "core.precomposeunicode", "core.symlinks", "core.autocrlf", "core.eol", "core.safecrlf",
	"core.checkroundtripencoding", "core.checkstat", "core.trustctime", "core.untrackedcache", "core.splitindex",
	"core.preloadindex", "core.fsmonitorhookversion", "core.sharedrepository", "core.quotepath", "core.abbrev",
	"core.commentchar", "core.whitespace", "core.excludesfile", "core.attributesfile", "core.compression",
	"core.loosecompression", "core.bigfilethreshold", "core.deltabasecachelimit", "core.packedgitlimit",
	"core.packedgitwindowsize", "core.packedrefstimeout", "core.filesreflocktimeout", "core.multipackindex",
	"core.commitgraph", "core.sparsecheckout", "core.sparsecheckoutcone", "core.protecthfs", "core.protectntfs",
	"core.warnambiguousrefs", "core.fsync", "core.fsyncmethod", "core.notesref", "core.longpaths", "core.hidedotfiles",
	"extensions.*", "init.defaultbranch", "safe.directory",
	"include.path", "includeif.*.path", // what they include is listed and checked too
	"remote.*.url", "remote.*.pushurl", "remote.*.fetch", "remote.*.push", "remote.*.tagopt", "remote.*.prune",
	"remote.*.prunetags", "remote.*.mirror", "remote.*.skipdefaultupdate", "remote.*.skipfetchall",
	"remote.*.promisor", "remote.*.partialclonefilter", "remote.*.proxy", "remote.*.serveroption", "remote.pushdefault",
	"branch.*", // remote, merge, rebase, description, ... (mergeoptions names installed strategies only)
	"submodule.*.url", "submodule.*.active", "submodule.*.branch", "submodule.*.ignore",
	"submodule.*.fetchrecursesubmodules", "submodule.active", "submodule.recurse", "submodule.fetchjobs",
	"submodule.alternatelocation", "submodule.alternateerrorstrategy",
	"pull.rebase", "pull.ff", "push.default", "push.autosetupremote", "push.followtags", "push.recursesubmodules",
	"fetch.prune", "fetch.prunetags", "fetch.parallel", "fetch.writecommitgraph", "fetch.recursesubmodules",
	"fetch.fsckobjects", "fetch.showforcedupdates", "transfer.*", "receive.fsckobjects", "protocol.version",
	"protocol.allow", "protocol.*.allow", // protocol.ext.allow stays never: its override comes first
	"merge.ff", "merge.conflictstyle", "merge.log", "merge.stat", "merge.renames", "merge.renamelimit",
	"merge.directoryrenames", "merge.autostash", "merge.*.name", "merge.*.recursive",
	"diff.renames", "diff.renamelimit", "diff.algorithm", "diff.colormoved", "diff.colormovedws", "diff.context",
	"diff.interhunkcontext", "diff.indentheuristic", "diff.mnemonicprefix", "diff.noprefix", "diff.relative",
	"diff.statgraphwidth", "diff.submodule", "diff.ignoresubmodules", "diff.wserrorhighlight",
	"diff.suppressblankempty", "diff.dirstat", "diff.autorefreshindex", "diff.orderfile",
	"diff.*.xfuncname", "diff.*.funcname", "diff.*.wordregex", "diff.*.binary", "diff.*.cachetextconv",
	"commit.verbose", "commit.cleanup", "commit.status", "commit.template", "commit.gpgsign",
	"tag.sort", "tag.gpgsign", "tag.forcesignannotated", "gpg.format", "gpg.mintrustlevel", "gpg.ssh.allowedsignersfile",
	"rerere.enabled", "rerere.autoupdate", "am.*", "apply.*", "stash.*", "notes.*", "format.pretty",
	"i18n.commitencoding", "i18n.logoutputencoding", "versionsort.suffix", "versionsort.prereleasesuffix",
	"checkout.defaultremote", "checkout.workers", "checkout.thresholdforparallelism", "clean.requireforce",
	"worktree.guessremote", "maintenance.auto", "maintenance.strategy", "interactive.singlekey",
	"mergetool.prompt", "mergetool.keepbackup", "mergetool.keeptemporaries", "difftool.prompt",
	"http.postbuffer", "http.version", "http.sslverify", "http.*.sslverify", "http.sslcainfo", "http.sslcapath",
	"http.proxy", "http.*.proxy", "http.extraheader", "http.*.extraheader", "http.lowspeedlimit", "http.lowspeedtime",
	"http.followredirects", "http.emptyauth", "lfs.repositoryformatversion",
	"credential.usehttppath", "credential.username", "credential.*.usehttppath", "credential.*.username",
	"pager.*", // GIT_PAGER=cat wins over any of them
	"status.*", "log.*", "color.*", "advice.*", "column.*", "blame.*", "grep.*", "pretty.*", "rebase.*",
	"pack.*", "index.*", "feature.*",
	// gc, which git runs by itself (gc.auto), one by one: newer gits
	// have gc.recentObjectsHook, a shell command, and gc.repackFilterTo,
	// a path the filtered-out objects are written to.
	"gc.aggressivedepth", "gc.aggressivewindow", "gc.auto", "gc.autopacklimit", "gc.autodetach",
	"gc.bigpackthreshold", "gc.writecommitgraph", "gc.logexpiry", "gc.packrefs", "gc.cruftpacks", "gc.maxcruftsize",
	"gc.pruneexpire", "gc.worktreepruneexpire", "gc.reflogexpire", "gc.*.reflogexpire", "gc.reflogexpireunreachable",
	"gc.*.reflogexpireunreachable", "gc.rerereresolved", "gc.rerereunresolved", "gc.repackfilter",
}

// gitURLKeys hold a URL git fetches from: "helper::address" runs the
// program git-remote-helper.
var gitURLKeys = []string{"remote.*.url", "remote.*.pushurl", "submodule.*.url"}

// gitScopes are the scopes git reports.
var gitScopes = []string{"system", "global", "local", "worktree", "command"}

// gitKeyPattern is one bash.git.allow_config entry: a key pattern,
// perhaps for one scope only ("global:alias.*").
type gitKeyPattern struct {
	text  string // as written
	scope string // "" for any
	key   string // section and name in lower case
}

func compileGitKeyPattern(text string) (gitKeyPattern, error) {
	kp := gitKeyPattern{text: text}
	key := text
	if scope, rest, ok := strings.Cut(text, ":"); ok && !strings.Contains(scope, ".") {
		if !slices.Contains(gitScopes, scope) {
			return kp, fmt.Errorf("%q: unknown scope %q; the scopes are %s", text, scope, strings.Join(gitScopes, ", "))
		}
		kp.scope, key = scope, rest
	}
	switch {
	case key == "":
		return kp, fmt.Errorf("%q: no configuration key; write one such as filter.lfs.* or global:alias.*", text)
	case strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return kp, fmt.Errorf("%q: a configuration key has no white space or control characters", text)
	case key != "*" && (!strings.Contains(key, ".") || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".")):
		return kp, fmt.Errorf("%q is not a configuration key such as section.name, section.*.name or section.*", text)
	}
	kp.key = normaliseGitKey(key)
	return kp, nil
}

// normaliseGitKey puts the section and the name of key in lower case, as
// git does; a subsection keeps its case.
func normaliseGitKey(key string) string {
	i, j := strings.IndexByte(key, '.'), strings.LastIndexByte(key, '.')
	if i < 0 {
		return strings.ToLower(key)
	}
	return strings.ToLower(key[:i]) + key[i:j] + strings.ToLower(key[j:])
}

// normaliseGitPattern is the normalised text of an allow_config entry.
func normaliseGitPattern(text string) string {
	text = strings.TrimSpace(text)
	if scope, rest, ok := strings.Cut(text, ":"); ok && !strings.Contains(scope, ".") {
		return scope + ":" + normaliseGitKey(rest)
	}
	return normaliseGitKey(text)
}

// matches reports whether the pattern allows key at scope. A pattern
// without a scope covers the configuration files; settings on git's
// command line (and in GIT_CONFIG_*) are whoever runs git's, and only a
// pattern for the command scope covers them.
func (kp gitKeyPattern) matches(scope, key string) bool {
	return (kp.scope == "" && scope != "command" || kp.scope == scope) && starMatch(kp.key, key)
}

// GitRules decide which configuration git may run with under a policy's
// command rules, and which git command lines are refused.
type GitRules struct {
	allow     []gitKeyPattern // the operator's bash.git.allow_config
	overrides []gitOverride   // those the operator's patterns leave
	deny      []cmdPattern    // the policy's bash.deny
}

// NewGitRules returns the rules for the operator's bash.git.allow_config
// patterns and the policy's bash.deny patterns. Policies compile them
// themselves (Policy.GitRules); the agent's git guard, which gets the
// patterns from the agent, uses this.
func NewGitRules(allowConfig, deny []string) (*GitRules, error) {
	var patterns []cmdPattern
	var errs []error
	for _, text := range deny {
		cp, err := compileCmdPattern(text, true)
		if err != nil {
			errs = append(errs, fmt.Errorf("bash.deny: %w", err))
			continue
		}
		patterns = append(patterns, cp)
	}
	g, err := newGitRules(allowConfig, patterns)
	return g, errors.Join(append(errs, err)...)
}

// newGitRules is NewGitRules with the deny patterns compiled.
func newGitRules(allowConfig []string, deny []cmdPattern) (*GitRules, error) {
	g := &GitRules{deny: deny}
	var errs []error
	for _, text := range allowConfig {
		kp, err := compileGitKeyPattern(normaliseGitPattern(text))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		g.allow = append(g.allow, kp)
	}
	// A key the operator allows keeps the value files give it: the
	// override is left out when a pattern covers a key it turns off.
	for _, o := range gitOverrides {
		covers := func(kp gitKeyPattern) bool {
			some := strings.ReplaceAll(kp.key, "*", string(dyn)) // some key kp allows
			return overlap(o.Key, some) || o.also != "" && overlap(o.also, some)
		}
		if !slices.ContainsFunc(g.allow, covers) {
			g.overrides = append(g.overrides, o)
		}
	}
	return g, errors.Join(errs...)
}

// Deny returns the deny patterns git command lines are checked against.
func (g *GitRules) Deny() []string {
	out := make([]string, len(g.deny))
	for i, cp := range g.deny {
		out[i] = cp.text
	}
	return out
}

// AllowConfig returns the operator's patterns, normalised.
func (g *GitRules) AllowConfig() []string {
	out := make([]string, len(g.allow))
	for i, kp := range g.allow {
		out[i] = kp.text
	}
	return out
}

// Overrides returns the settings every git process gets.
func (g *GitRules) Overrides() []GitSetting {
	out := make([]GitSetting, len(g.overrides))
	for i, o := range g.overrides {
		out[i] = o.GitSetting
	}
	return out
}

// Environ returns env with the overrides given to git: after the
// settings env already gives it in GIT_CONFIG_COUNT (less copies of the
// overrides), with GIT_PAGER=cat, which wins over every pager setting,
// and GIT_OPTIONAL_LOCKS=0: commands that only look (git status) then
// leave the index as it is instead of refreshing it on disk.
func (g *GitRules) Environ(env []string) []string {
	vars := map[string]string{}
	out := make([]string, 0, len(env)+2*len(g.overrides)+2)
	for _, kv := range env {
		name, value, _ := strings.Cut(kv, "=")
		switch {
		case name == "GIT_CONFIG_COUNT" || name == "GIT_PAGER" || name == "GIT_OPTIONAL_LOCKS" ||
			strings.HasPrefix(name, "GIT_CONFIG_KEY_") || strings.HasPrefix(name, "GIT_CONFIG_VALUE_"):
			vars[name] = value
		default:
			out = append(out, kv)
		}
	}
	var settings []GitSetting
	if n, err := strconv.Atoi(vars["GIT_CONFIG_COUNT"]); err == nil {
		for i := range max(n, 0) {
			k, ok := vars["GIT_CONFIG_KEY_"+strconv.Itoa(i)]
			s := GitSetting{k, vars["GIT_CONFIG_VALUE_"+strconv.Itoa(i)]}
			if ok && !slices.ContainsFunc(g.overrides, func(o gitOverride) bool { return o.GitSetting == s }) {
				settings = append(settings, s)
			}
		}
	}
	settings = append(settings, g.Overrides()...)
	for i, s := range settings {
		out = append(out, "GIT_CONFIG_KEY_"+strconv.Itoa(i)+"="+s.Key, "GIT_CONFIG_VALUE_"+strconv.Itoa(i)+"="+s.Value)
	}
	return append(out, "GIT_CONFIG_COUNT="+strconv.Itoa(len(settings)), "GIT_PAGER=cat", "GIT_OPTIONAL_LOCKS=0")
}

// CheckConfig returns nil when git may run with the settings entries, or
// a *Denial naming the first setting that is refused.
func (g *GitRules) CheckConfig(entries []GitConfigEntry) error {
	var bad []GitConfigEntry
	for _, e := range entries {
		if !g.allowed(e) {
			bad = append(bad, e)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	e := bad[0]
	value := "set"
	if !e.NoValue {
		value = "= " + shown(e.Value)
	}
	more := ""
	if len(bad) > 1 {
		more = fmt.Sprintf(" (and %d more setting%s)", len(bad)-1, plural(len(bad)-1))
	}
	return &Denial{"bash.git.allow_config", fmt.Sprintf(
		"git would run with %s %s, from its %s configuration (%s)%s, and under this host policy git runs only with settings known not to run programs: "+
			"remove the setting, or have the host's operator allow it with bash.git.allow_config: [%q]",
		e.Key, value, e.Scope, gitOrigin(e.Origin), more, e.Scope+":"+e.Key)}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// gitOrigin says where a setting comes from, for a message.
func gitOrigin(origin string) string {
	switch {
	case strings.HasPrefix(origin, "file:"):
		return origin[len("file:"):]
	case strings.HasPrefix(origin, "command line:"):
		return "the command line or GIT_CONFIG_* in the environment"
	}
	return origin
}

// allowed reports whether git may run with setting e.
func (g *GitRules) allowed(e GitConfigEntry) bool {
	if slices.ContainsFunc(g.allow, func(kp gitKeyPattern) bool { return kp.matches(e.Scope, e.Key) }) {
		return true
	}
	for _, o := range g.overrides {
		if e.Key == o.Key || o.also != "" && starMatch(o.also, e.Key) {
			// The override comes last on git's command line; -c and
			// GIT_CONFIG_PARAMETERS come after it.
			return !e.NoValue && e.Value == o.Value || o.quiet && e.Scope != "command"
		}
	}
	if !slices.ContainsFunc(gitHarmless, func(p string) bool { return starMatch(p, e.Key) }) {
		return false
	}
	if slices.ContainsFunc(gitURLKeys, func(p string) bool { return starMatch(p, e.Key) }) {
		return !remoteHelperURL(e.Value)
	}
	return true
}

// remoteHelperURL reports whether url makes git run a remote helper,
// the program git-remote-NAME: it has the form NAME::address, or
// NAME://address with a NAME git does not speak itself.
func remoteHelperURL(url string) bool {
	scheme, _, ok := strings.Cut(url, "::")
	if ok && scheme != "" && strings.Trim(strings.ToLower(scheme), "abcdefghijklmnopqrstuvwxyz0123456789+.-") == "" {
		return true
	}
	scheme, _, ok = strings.Cut(url, "://")
	if !ok || scheme == "" || strings.Trim(strings.ToLower(scheme), "abcdefghijklmnopqrstuvwxyz0123456789+.-") != "" {
		return false // a path or scp-like host:path
	}
	switch strings.ToLower(scheme) {
	case "http", "https", "ftp", "ftps", "git", "ssh", "git+ssh", "ssh+git", "file":
		return false // git's own transports, and its own helpers for them
	}
	return true
}

// CheckGitTodo returns nil when the list of steps a paused rebase,
// cherry-pick or revert carries on with (git-rebase-todo, sequencer/todo)
// runs no command, or a *Denial naming the first exec step.
func CheckGitTodo(name string, todo []byte) error {
	for i, line := range strings.Split(string(todo), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 0 && (fields[0] == "x" || fields[0] == "exec") {
			return &Denial{"bash", fmt.Sprintf("git would carry on with %s, whose line %d runs a command (%s); the rules cannot check it. "+
				"Abort it (git rebase --abort, git cherry-pick --abort) or remove the line", name, i+1, shown(line))}
		}
	}
	return nil
}
