package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// gitList formats settings as git config --list --show-scope
// --show-origin -z prints them.
func gitList(entries ...GitConfigEntry) []byte {
	var b strings.Builder
	for _, e := range entries {
		b.WriteString(e.Scope + "\x00" + e.Origin + "\x00" + e.Key)
		if !e.NoValue {
			b.WriteString("\n" + e.Value)
		}
		b.WriteByte(0)
	}
	return []byte(b.String())
}

func TestParseGitConfigList(t *testing.T) {
	// What git 2.39 prints for a setting without "=", a subsection with
	// dots and upper case, a value with a newline, and -c.
	raw := "system\x00file:/etc/gitconfig\x00credential.https://example.com.helper\ngcloud.sh\x00" +
		"local\x00file:.git/config\x00x.flag\x00" +
		"local\x00file:.git/config\x00y.Sub.Sec.val\nline 1\nline 2\x00" +
		"command\x00command line:\x00c.d\ne\x00"
	got, err := ParseGitConfigList([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	want := []GitConfigEntry{
		{Scope: "system", Origin: "file:/etc/gitconfig", Key: "credential.https://example.com.helper", Value: "gcloud.sh"},
		{Scope: "local", Origin: "file:.git/config", Key: "x.flag", NoValue: true},
		{Scope: "local", Origin: "file:.git/config", Key: "y.Sub.Sec.val", Value: "line 1\nline 2"},
		{Scope: "command", Origin: "command line:", Key: "c.d", Value: "e"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if string(gitList(got...)) != raw {
		t.Errorf("round trip = %q", gitList(got...))
	}
	for _, bad := range []string{"local\x00file:x\x00a.b\nc", "local\x00a.b\nc\x00", "\x00o\x00a.b\x00", "local\x00o\x00nodot\x00", "local\x00o\x00.a\x00"} {
		if _, err := ParseGitConfigList([]byte(bad)); err == nil {
			t.Errorf("ParseGitConfigList(%q) succeeded", bad)
		}
	}
	if e, err := ParseGitConfigList(nil); err != nil || e != nil {
		t.Errorf("empty output: %v, %v", e, err)
	}
}

func TestGitCheckConfig(t *testing.T) {
	g, err := NewGitRules([]string{"filter.lfs.*", "global:alias.*", "system:diff.*"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(scope, key, value string) GitConfigEntry {
		return GitConfigEntry{Scope: scope, Origin: "file:x", Key: key, Value: value}
	}
	tests := []struct {
		e    GitConfigEntry
		want string // "" when allowed
	}{
		{entry("local", "user.name", "a"), ""},
		{entry("local", "core.repositoryformatversion", "0"), ""},
		{entry("local", "remote.origin.url", "https://example.com/x.git"), ""},
		{entry("local", "remote.Origin.url", "git@host:x.git"), ""},
		{entry("local", "branch.main.merge", "refs/heads/main"), ""},
		{entry("local", "color.diff.meta", "blue"), ""},
		{entry("local", "core.worktree", "../x"), ""},
		{entry("local", "includeif.onbranch:main.path", "x.cfg"), ""},
		// Programs git runs under names the repository chooses.
		{entry("local", "core.fsmonitor", "/tmp/x"), "core.fsmonitor = `/tmp/x`, from its local configuration (x)"},
		{GitConfigEntry{Scope: "local", Key: "core.fsmonitor", NoValue: true}, "core.fsmonitor set"},
		{entry("local", "filter.evil.clean", "id"), "filter.evil.clean"},
		{entry("local", "filter.LFS.clean", "id"), "filter.LFS.clean"},
		{entry("local", "diff.x.textconv", "id"), "diff.x.textconv"},
		{entry("local", "diff.external", "id"), "diff.external"},
		{entry("local", "merge.x.driver", "id"), "merge.x.driver"},
		{entry("local", "alias.st", "!id"), `bash.git.allow_config: ["local:alias.st"]`},
		{entry("local", "remote.origin.uploadpack", "id"), "remote.origin.uploadpack"},
		{entry("local", "remote.origin.vcs", "x"), "remote.origin.vcs"},
		{entry("local", "remote.origin.url", "ext::sh -c id"), "remote.origin.url"},
		{entry("local", "remote.origin.url", "evil+x::addr"), "remote.origin.url"},
		{entry("local", "submodule.s.update", "!id"), "submodule.s.update"},
		{entry("local", "url.x.insteadof", "y"), "url.x.insteadof"},
		{entry("local", "core.gitproxy", "id"), "core.gitproxy"},
		{entry("local", "core.alternaterefscommand", "id"), "core.alternaterefscommand"},
		{entry("local", "uploadpack.packobjectshook", "id"), "uploadpack.packobjectshook"},
		{entry("local", "trace2.normaltarget", "/tmp/x"), "trace2.normaltarget"},
		{entry("local", "sendemail.smtpserver", "/tmp/x"), "sendemail.smtpserver"},
		{entry("local", "difftool.x.cmd", "id"), "difftool.x.cmd"},
		{entry("local", "tar.tgz.command", "id"), "tar.tgz.command"},
		// gc, which git runs by itself: a shell command, and a path it
		// writes to, in newer gits.
		{entry("local", "gc.recentobjectshook", "touch /tmp/m"), "gc.recentobjectshook"},
		{entry("local", "gc.repackfilterto", "/tmp/x"), "gc.repackfilterto"},
		{entry("local", "gc.auto", "1"), ""},
		{entry("local", "gc.refs/remotes/*.reflogexpire", "never"), ""},
		// A URL whose scheme git does not speak runs git-remote-SCHEME.
		{entry("local", "remote.origin.url", "evil://host/x"), "remote.origin.url"},
		{entry("local", "remote.origin.pushurl", "Foo+bar://x"), "remote.origin.pushurl"},
		{entry("local", "submodule.s.url", "testgit://x"), "submodule.s.url"},
		{entry("local", "remote.origin.url", "ssh://git@host/x.git"), ""},
		{entry("local", "remote.origin.url", "git+ssh://host/x"), ""},
		{entry("local", "remote.origin.url", "file:///srv/x.git"), ""},
		{entry("local", "remote.origin.url", "HTTPS://host/x"), ""},
		{entry("local", "remote.origin.url", "/srv/x.git"), ""},
		{entry("local", "remote.origin.url", "../x"), ""},
		// Settings the agent overrides: files are overridden quietly,
		// the command line only with the override's own value.
		{entry("global", "core.pager", "less"), ""},
		{entry("local", "core.hookspath", ".husky"), ""},
		{entry("local", "credential.helper", "store"), ""},
		{entry("local", "credential.https://x.helper", "store"), ""},
		{entry("local", "core.fsmonitor", "false"), ""},
		{entry("command", "core.pager", "cat"), ""},
		{entry("command", "core.pager", "less"), "core.pager"},
		{entry("command", "credential.https://x.helper", "id"), "credential.https://x.helper"},
		{entry("command", "core.hookspath", "/tmp/h"), "core.hookspath"},
		{entry("command", "pager.log", "id"), ""}, // GIT_PAGER wins
		{entry("command", "protocol.file.allow", "always"), ""},
		{entry("command", "protocol.ext.allow", "always"), "protocol.ext.allow"},
		{entry("local", "protocol.ext.allow", "always"), ""}, // overridden
		// The operator's patterns, with their scopes.
		{entry("local", "filter.lfs.clean", "git-lfs clean -- %f"), ""},
		{entry("global", "alias.co", "checkout"), ""},
		{entry("local", "alias.co", "checkout"), "alias.co"},
		{entry("system", "diff.x.textconv", "id"), ""},
		// A pattern without a scope covers the files, not the command
		// line (-c, --config-env, GIT_CONFIG_*), which is the caller's.
		{entry("command", "filter.lfs.clean", "id"), `bash.git.allow_config: ["command:filter.lfs.clean"]`},
		{entry("worktree", "filter.lfs.clean", "git-lfs clean -- %f"), ""},
		{entry("command", "alias.co", "checkout"), "alias.co"},
	}
	for _, tt := range tests {
		err := g.CheckConfig([]GitConfigEntry{{Scope: "local", Key: "user.email", Value: "x"}, tt.e})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v refused: %v", tt.e, err)
		case tt.want == "":
		case err == nil:
			t.Errorf("%+v allowed", tt.e)
		case !strings.Contains(err.Error(), tt.want):
			t.Errorf("%+v: %v\nwant it to mention %q", tt.e, err, tt.want)
		}
		var d *Denial
		if err != nil && (!errors.As(err, &d) || d.Rule != "bash.git.allow_config") {
			t.Errorf("%+v: %v is not a bash.git.allow_config denial", tt.e, err)
		}
	}
	// An override the operator allows is not given: credential.helper=
	// would empty the list of helpers, the one allowed too.
	cred, _ := NewGitRules([]string{"Credential.https://Example.com.Helper"}, nil)
	if slices.ContainsFunc(cred.Overrides(), func(s GitSetting) bool { return strings.HasPrefix(s.Key, "credential.") }) {
		t.Errorf("overrides %v reset credential.helper, which the operator allows", cred.Overrides())
	}
	if cred.CheckConfig([]GitConfigEntry{entry("global", "credential.https://Example.com.helper", "x")}) != nil ||
		cred.CheckConfig([]GitConfigEntry{entry("command", "credential.https://Example.com.helper", "x")}) == nil ||
		cred.CheckConfig([]GitConfigEntry{entry("local", "credential.https://example.com.helper", "x")}) == nil ||
		cred.CheckConfig([]GitConfigEntry{entry("global", "credential.helper", "store")}) == nil {
		t.Error("an allowed credential helper: other helpers are not refused")
	}
	cmd, _ := NewGitRules([]string{"command:filter.lfs.*"}, nil)
	if cmd.CheckConfig([]GitConfigEntry{entry("command", "filter.lfs.clean", "x")}) != nil ||
		cmd.CheckConfig([]GitConfigEntry{entry("local", "filter.lfs.clean", "x")}) == nil {
		t.Error("command:filter.lfs.* does not allow exactly the command line's filter.lfs.*")
	}
	err = g.CheckConfig([]GitConfigEntry{entry("local", "alias.a", "x"), entry("local", "alias.b", "y")})
	if err == nil || !strings.Contains(err.Error(), "(and 1 more setting)") {
		t.Errorf("two bad settings: %v", err)
	}
	// Allowing a key the agent overrides stops the override, for every
	// scope: the key is then allowed where the operator says only.
	sys, _ := NewGitRules([]string{"system:*"}, nil)
	if len(sys.Overrides()) != 0 {
		t.Errorf("system:* leaves overrides %v", sys.Overrides())
	}
	if sys.CheckConfig([]GitConfigEntry{entry("system", "core.pager", "less"), entry("system", "alias.x", "!id")}) != nil ||
		sys.CheckConfig([]GitConfigEntry{entry("local", "core.pager", "less")}) == nil {
		t.Error("system:* does not allow exactly the system configuration")
	}
}

func TestGitRulesErrors(t *testing.T) {
	for _, tt := range []struct{ pattern, want string }{
		{"core", "not a configuration key"},
		{"home:alias.*", `unknown scope "home"`},
		{"local:", "no configuration key"},
		{"alias .x", "no white space"},
		{".x", "not a configuration key"},
	} {
		if _, err := NewGitRules([]string{tt.pattern}, nil); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewGitRules(%q) = %v, want it to mention %q", tt.pattern, err, tt.want)
		}
	}
	for _, tt := range []struct{ text, want string }{
		{"bash: {git: {allow_config: [alias.*]}}", "has no effect without bash.allow or bash.deny"},
		{"bash: {allow: [ls], git: {allow_config: [core]}}", "bash.git.allow_config"},
		{"bash: {allow: [ls], git: {allow_config: [\"x:y.z\"]}}", `unknown scope "x"`},
	} {
		if _, err := Parse([]byte(tt.text), testEnv()); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want it to mention %q", tt.text, err, tt.want)
		}
	}
}

// The git rules are part of the digest and the summary; policies without
// them keep the digest they had.
func TestGitRulesDigest(t *testing.T) {
	plain := mustParse(t, `bash: {allow: ["git *"]}`)
	sum := sha256.Sum256([]byte(`{"bash":{"allow":["git *"]}}`))
	if plain.Digest() != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("digest of a policy without git rules changed: %s", plain.Digest())
	}
	a := mustParse(t, "bash:\n  allow: [\"git *\"]\n  git: {allow_config: [\"Filter.lfs.*\", \"global:Alias.*\", \"filter.lfs.*\"]}\n")
	b := mustParse(t, "bash: {allow: [\"git *\"], git: {allow_config: [\"global:alias.*\", \"filter.lfs.*\"]}}")
	if a.Digest() != b.Digest() || a.Digest() == plain.Digest() {
		t.Errorf("digests %s, %s, %s", a.Digest(), b.Digest(), plain.Digest())
	}
	if got := a.Summary()[2]; got != "bash: allow git *; git may also run with filter.lfs.*, global:alias.*" {
		t.Errorf("summary line %q", got)
	}
	if !slices.Equal(a.GitRules().AllowConfig(), []string{"filter.lfs.*", "global:alias.*"}) {
		t.Errorf("allow_config %v", a.GitRules().AllowConfig())
	}
	if mustParse(t, `paths: {deny: ["/x"]}`).GitRules() != nil || (*Policy)(nil).GitRules() != nil {
		t.Error("a policy without command rules has git rules")
	}
}

func TestGitEnviron(t *testing.T) {
	g, _ := NewGitRules(nil, nil)
	env := []string{"HOME=/h", "GIT_PAGER=less", "GIT_OPTIONAL_LOCKS=1", "GIT_CONFIG_COUNT=2", "GIT_CONFIG_KEY_0=user.name", "GIT_CONFIG_VALUE_0=x",
		"GIT_CONFIG_KEY_1=core.pager", "GIT_CONFIG_VALUE_1=cat", "GIT_CONFIG_KEY_7=stray.key", "GIT_CONFIG_VALUE_7=y"}
	once := g.Environ(env)
	twice := g.Environ(once)
	if !slices.Equal(once, twice) {
		t.Errorf("Environ is not idempotent:\n%v\n%v", once, twice)
	}
	vars := map[string]string{}
	for _, kv := range once {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := vars[k]; dup {
			t.Errorf("%s set twice", k)
		}
		vars[k] = v
	}
	n := len(g.Overrides()) + 1
	if vars["GIT_CONFIG_COUNT"] != itoa(n) || vars["GIT_CONFIG_KEY_0"] != "user.name" || vars["GIT_PAGER"] != "cat" || vars["HOME"] != "/h" ||
		vars["GIT_OPTIONAL_LOCKS"] != "0" {
		t.Errorf("environment %v", once)
	}
	if _, ok := vars["GIT_CONFIG_KEY_7"]; ok && n <= 7 {
		t.Errorf("a stray GIT_CONFIG_KEY_7 is kept: %v", once)
	}
	last := g.Overrides()[len(g.Overrides())-1]
	if vars["GIT_CONFIG_KEY_"+itoa(n-1)] != last.Key || vars["GIT_CONFIG_VALUE_"+itoa(n-1)] != last.Value {
		t.Errorf("the overrides do not come last: %v", once)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// CheckArgs sees the words a git command runs with, all known: what the
// checker leaves to the guard.
func TestGitCheckArgs(t *testing.T) {
	g, err := NewGitRules([]string{"global:alias.*"}, []string{"git push *", "git send-pack *", "journalctl *--rotate*"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args    []string
		want    string // "" when allowed
		repo    []string
		resumes bool
	}{
		{args: []string{"status"}},
		{args: []string{"-C", "sub", "--no-pager", "-c", "color.ui=never", "--git-dir=x", "--work-tree", "w", "--bare", "log"},
			repo: []string{"-C", "sub", "-c", "color.ui=never", "--git-dir=x", "--work-tree", "w", "--bare"}},
		{args: []string{"--config-env", "user.name=N", "commit"}, repo: []string{"--config-env", "user.name=N"}},
		{args: []string{"rebase", "--continue"}, resumes: true},
		{args: []string{"cherry-pick", "--sk"}, resumes: true},
		{args: []string{"rebase", "--", "--continue"}},
		{args: []string{"log", "--output=/etc/x"}}, // the checker's to place
		{args: []string{"-c", "alias.x=!id", "x"}, want: "alias.x"},
		{args: []string{"--config-env=core.fsmonitor=E", "status"}, want: "core.fsmonitor"},
		{args: []string{"rebase", "-x", "id"}, want: "runs a program"},
		{args: []string{"fetch", "--upload-pack=id"}, want: "runs a program"},
		{args: []string{"clone", "-c", "filter.x.smudge=id", "a", "b"}, want: "filter.x.smudge"},
		{args: []string{"--exec-path=/tmp", "status"}, want: "another directory"},
		{args: []string{"--attr-source=HEAD", "status"}, want: "not one git has"},
		{args: []string{"submodule", "foreach", "id"}, want: "foreach"},
		// What git's scripts run, and what git runs for itself, comes
		// through the guard too: the submodule and bisect helpers.
		{args: []string{"submodule--helper", "foreach", "--recursive", "--", "id"}, want: "foreach"},
		{args: []string{"bisect--helper", "run", "make"}, want: "bisect run"},
		{args: []string{"bisect--helper", "visualize", "git-x"}, want: "runs the command"},
		{args: []string{"credential-libsecret", "get"}, want: "stored passwords"},
		{args: []string{"config", "--global", "alias.x", "!id"}, want: "alias.x"},
		{args: []string{"config", "filter.lfs.process", "id"}, want: "filter.lfs.process"},
		{args: []string{"config", "user.name", "x"}},
		{args: []string{"-c", "filter.lfs.clean=id", "status"}, want: "command:filter.lfs.clean"},
		// The deny rules hold for every git process, whoever runs it,
		// with or without git's global options.
		{args: []string{"push", "origin", "main"}, want: `bash.deny "git push *"`},
		{args: []string{"-C", "sub", "--no-pager", "push"}, want: `bash.deny "git push *"`},
		{args: []string{"--git-dir=x", "-c", "color.ui=never", "send-pack", "x"}, want: "bash.deny"},
		{args: []string{"for-each-repo", "--config=maintenance.repo", "push"}, want: "bash.deny"},
		{args: []string{"for-each-repo", "--config", "x", "status"}},
		{args: []string{"pull"}},
		{args: []string{"log", "a\x00b"}, want: "NUL"},
	}
	for _, tt := range tests {
		inv, err := g.CheckArgs(tt.args)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q refused: %v", tt.args, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q = %v, want a refusal mentioning %q", tt.args, err, tt.want)
		case tt.want == "" && (!slices.Equal(inv.Repo, tt.repo) || inv.Resumes != tt.resumes):
			t.Errorf("%q = %+v, want repo %q, resumes %v", tt.args, inv, tt.repo, tt.resumes)
		}
	}
}

// An alias the operator allows runs the git command line it stands for,
// which is checked as the guard checks any: git push by another name is
// git push.
func TestGitCheckAlias(t *testing.T) {
	g, err := NewGitRules([]string{"global:alias.*"}, []string{"git push *"})
	if err != nil {
		t.Fatal(err)
	}
	aliases := []GitConfigEntry{
		{Scope: "global", Key: "alias.p", Value: "push"},
		{Scope: "global", Key: "alias.pp", Value: "p --force"},
		{Scope: "global", Key: "alias.up", Value: `-c "color.ui=never" push origin`},
		{Scope: "global", Key: "alias.rx", Value: "rebase -x 'make test'"},
		{Scope: "global", Key: "alias.loop", Value: "loop"},
		{Scope: "global", Key: "alias.st", Value: "status -s"},
		{Scope: "global", Key: "alias.sh", Value: "!git push"},
		{Scope: "global", Key: "alias.status", Value: "push"}, // git ignores it
	}
	commands := map[string]bool{"push": true, "status": true, "rebase": true}
	isCommand := func(name string) bool { return commands[name] }
	for _, tt := range []struct {
		args []string
		want string // "" when allowed
	}{
		{[]string{"st"}, ""},
		{[]string{"status"}, ""},
		{[]string{"p"}, `bash.deny "git push *"`},
		{[]string{"P", "origin"}, "git alias P runs `push`"},
		{[]string{"-C", "x", "pp"}, "bash.deny"},
		{[]string{"up", "main"}, "bash.deny"},
		{[]string{"rx", "main"}, "runs a program"},
		{[]string{"loop"}, "nested too deeply"},
		{[]string{"sh"}, ""}, // a shell alias is the operator's
		{[]string{"unknown"}, ""},
	} {
		err := g.CheckAlias(tt.args, aliases, isCommand)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%q refused: %v", tt.args, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q = %v, want a refusal mentioning %q", tt.args, err, tt.want)
		}
	}
	for _, tt := range []struct {
		in   string
		want []string
	}{
		{`log --format="%h %s" -n 1`, []string{"log", "--format=%h %s", "-n", "1"}},
		{`a 'b c' d\ e`, []string{"a", "b c", "d e"}},
		{`  x  `, []string{"x"}},
		{`a "b`, nil},
	} {
		if got, _ := splitGitCmdline(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("splitGitCmdline(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCheckGitTodo(t *testing.T) {
	ok := "pick 1234 first\n# exec in a comment\nreword 5678 second\nbreak\n"
	if err := CheckGitTodo("git-rebase-todo", []byte(ok)); err != nil {
		t.Errorf("plain todo refused: %v", err)
	}
	for _, bad := range []string{"pick 1 a\nexec id\n", "  x make test", "pick 1 a\r\nx\tid\r\n"} {
		err := CheckGitTodo("git-rebase-todo", []byte(bad))
		if err == nil || !strings.Contains(err.Error(), "runs a command") {
			t.Errorf("%q = %v", bad, err)
		}
	}
}
