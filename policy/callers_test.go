package policy

import (
	"errors"
	"strings"
	"testing"
)

// callersPolicy is the example of the host policy docs: only group sre
// may use bash; the ci-deploy client may only read and patch under
// /srv/app; everyone else gets the host-wide rules without bash.
const callersPolicy = `
paths:
  deny: ["/etc/shadow"]
callers:
  - name: deploy
    match: {client_id: [ci-deploy]}
    tools: {allow: [read, patch]}
    paths: {allow: ["/srv/app/**"]}
  - name: sre
    match: {groups: [sre]}
  - name: others
    match: {sub: ["*"]}
    tools: {deny: [bash]}
    bash: {allow: ["ls *"]}
`

var (
	deployCaller = Caller{Issuer: "https://id.example", Subject: "svc-deploy", ClientID: "ci-deploy"}
	sreCaller    = Caller{Issuer: "https://id.example", Subject: "alice", Groups: []string{"dev", "sre"}}
	otherCaller  = Caller{Issuer: "https://id.example", Subject: "bob", Groups: []string{"dev"}}
)

// TestForCallerTools: per tool and caller, who may use what.
func TestForCallerTools(t *testing.T) {
	p := mustParse(t, callersPolicy)
	for _, tc := range []struct {
		caller Caller
		tool   string
		ok     bool
		rule   string
	}{
		{deployCaller, "read", true, ""},
		{deployCaller, "patch", true, ""},
		{deployCaller, "bash", false, "callers.deploy.tools.allow"},
		{deployCaller, "write", false, "callers.deploy.tools.allow"},
		{sreCaller, "bash", true, ""},
		{sreCaller, "write", true, ""},
		{otherCaller, "bash", false, "callers.others.tools.deny"},
		{otherCaller, "read", true, ""},
	} {
		cp, err := p.ForCaller(tc.caller)
		if err != nil {
			t.Fatalf("ForCaller(%s): %v", tc.caller, err)
		}
		err = cp.AllowTool(tc.tool)
		if tc.ok != (err == nil) {
			t.Errorf("%s may use %s: %v, want allowed=%v", tc.caller, tc.tool, err, tc.ok)
			continue
		}
		var d *Denial
		if !tc.ok && (!errors.As(err, &d) || d.Rule != tc.rule || !strings.Contains(err.Error(), "for this caller")) {
			t.Errorf("%s using %s: %v (rule %q), want rule %s", tc.caller, tc.tool, err, d.Rule, tc.rule)
		}
	}
	// The host-wide rules still apply to every caller.
	if err := p.AllowTool("bash"); err != nil {
		t.Errorf("the host-wide rules refuse bash: %v", err)
	}
}

// TestForCallerPaths: per path and caller; the caller's rules narrow the
// host's, never widen them.
func TestForCallerPaths(t *testing.T) {
	p := mustParse(t, callersPolicy)
	for _, tc := range []struct {
		caller Caller
		op     Op
		path   string
		ok     bool
	}{
		{deployCaller, Read, "/srv/app/main.go", true},
		{deployCaller, Write, "/srv/app/main.go", true},
		{deployCaller, Read, "/srv/other/x", false},
		{deployCaller, Read, "/etc/passwd", false},
		{deployCaller, Read, "/etc/shadow", false},
		{sreCaller, Read, "/srv/other/x", true},
		{sreCaller, Read, "/etc/shadow", false}, // host-wide deny
		{otherCaller, Read, "/etc/passwd", true},
	} {
		cp, err := p.ForCaller(tc.caller)
		if err != nil {
			t.Fatal(err)
		}
		err = cp.CheckPath(tc.op, tc.path, tc.path)
		if tc.ok != (err == nil) {
			t.Errorf("%s %s %s: %v, want allowed=%v", tc.caller, tc.op, tc.path, err, tc.ok)
		}
	}
	// A symbolic link out of the caller's tree is judged by where it
	// leads.
	cp, _ := p.ForCaller(deployCaller)
	if err := cp.CheckPath(Read, "/srv/app/link", "/etc/hosts"); err == nil {
		t.Error("a link out of /srv/app is followed for deploy")
	}
	only := mustParse(t, "callers:\n  - match: {sub: ['*']}\n    paths: {write: {allow: [/tmp/**]}}\n")
	oc, _ := only.ForCaller(otherCaller)
	if !oc.HasPathRules(Write) || only.HasPathRules(Write) || oc.HasPathRules(Read) {
		t.Errorf("HasPathRules: caller write %v read %v, host %v; want the caller's write rules to count for the caller only",
			oc.HasPathRules(Write), oc.HasPathRules(Read), only.HasPathRules(Write))
	}
}

func TestForCallerCommands(t *testing.T) {
	p := mustParse(t, callersPolicy)
	others, _ := p.ForCaller(otherCaller)
	sre, _ := p.ForCaller(sreCaller)
	if err := others.CheckCommand("rm -rf /tmp/x", nil); err == nil {
		t.Error("others' bash.allow does not refuse rm")
	}
	if err := others.CheckCommand("ls /tmp", nil); err != nil {
		t.Errorf("others may not ls: %v", err)
	}
	if err := sre.CheckCommand("rm -rf /tmp/x", nil); err != nil {
		t.Errorf("sre may not rm: %v", err)
	}
	// A redirection into a path the host denies is refused for every
	// caller.
	if err := sre.CheckCommand("echo x > /etc/shadow", nil); err == nil {
		t.Error("sre may write /etc/shadow by a redirection")
	}
	deploy, _ := p.ForCaller(deployCaller)
	if err := deploy.CheckCommand("echo x > /tmp/out", nil); err == nil {
		t.Error("deploy may write outside /srv/app by a redirection")
	}
	// Git under a caller's command rules on a host without host-wide
	// command rules: the agent would not run it through its git guard,
	// so it is refused.
	gp := mustParse(t, "callers:\n  - match: {sub: ['*']}\n    bash: {allow: ['git *']}\n")
	c, _ := gp.ForCaller(otherCaller)
	if err := c.CheckCommand("git status", nil); err == nil || !strings.Contains(err.Error(), "git guard") {
		t.Errorf("git under a caller's rules alone: %v", err)
	}
	gp = mustParse(t, "bash: {allow: ['*']}\ncallers:\n  - match: {sub: ['*']}\n    bash: {allow: ['git *']}\n")
	c, _ = gp.ForCaller(otherCaller)
	if err := c.CheckCommand("git status", nil); err != nil {
		t.Errorf("git under host-wide and caller command rules: %v", err)
	}
}

// TestForCallerMatching: the first entry that matches decides; every
// claim of an entry must match; no match means nothing is allowed.
func TestForCallerMatching(t *testing.T) {
	p := mustParse(t, `
callers:
  - name: both
    match: {iss: ["https://id.example"], groups: [ops]}
    tools: {allow: [read]}
  - name: ops-any-issuer
    match: {groups: [ops]}
    tools: {allow: [list]}
  - name: tokens
    match: {sub: ["token:*"]}
`)
	for _, tc := range []struct {
		c     Caller
		entry string // "" no match
	}{
		{Caller{Issuer: "https://id.example", Subject: "a", Groups: []string{"ops"}}, "callers.both"},
		{Caller{Issuer: "https://other.example", Subject: "a", Groups: []string{"ops"}}, "callers.ops-any-issuer"},
		{Caller{Issuer: "fleetmcp:api-token", Subject: "token:ci"}, "unrestricted"},
		{Caller{Issuer: "https://id.example", Subject: "a", Groups: []string{"dev"}}, ""},
		{Caller{Issuer: "https://id.example", Subject: "a", Groups: []string{"ops-admin"}}, ""},
	} {
		cp, err := p.ForCaller(tc.c)
		switch {
		case tc.entry == "":
			var d *Denial
			if !errors.As(err, &d) || d.Rule != "callers" || !strings.Contains(err.Error(), "matches no entry") {
				t.Errorf("%+v: %v, want a refusal (no entry matches)", tc.c, err)
			}
		case err != nil:
			t.Errorf("%+v: %v", tc.c, err)
		case tc.entry == "unrestricted" && cp.narrow != nil:
			t.Errorf("%+v: narrowed by %s, want the host-wide rules", tc.c, cp.narrowName)
		case tc.entry != "unrestricted" && cp.narrowName != tc.entry:
			t.Errorf("%+v: entry %q, want %s", tc.c, cp.narrowName, tc.entry)
		}
	}
	// Without a callers section the policy is every caller's.
	plain := mustParse(t, "tools: {deny: [write]}")
	if cp, err := plain.ForCaller(Caller{}); err != nil || cp != plain {
		t.Errorf("no callers section: %v, %v", cp, err)
	}
	var none *Policy
	if cp, err := none.ForCaller(Caller{}); err != nil || cp != nil {
		t.Errorf("nil policy: %v, %v", cp, err)
	}
}

func TestCallersParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"empty match", "callers:\n  - name: x\n    match: {}\n", "match names no claim"},
		{"no match", "callers:\n  - tools: {deny: [bash]}\n", "match names no claim"},
		{"unknown match key", "callers:\n  - match: {email: [a]}\n", `unknown key "email"`},
		{"unknown entry key", "callers:\n  - match: {sub: [a]}\n    skills: {deny: [x]}\n", `unknown key "skills"`},
		{"git in an entry", "callers:\n  - match: {sub: [a]}\n    bash: {git: {allow_config: [x]}}\n", `unknown key "git"`},
		{"unknown tool", "callers:\n  - match: {sub: [a]}\n    tools: {allow: [reed]}\n", `callers[0] (callers[0]): tools.allow: unknown tool "reed"`},
		{"bad glob", "callers:\n  - name: d\n    match: {sub: [a]}\n    paths: {allow: [\"/srv/[x\"]}\n", "callers[0] (d): paths.allow"},
		{"same name", "callers:\n  - {name: a, match: {sub: [x]}}\n  - {name: a, match: {sub: [y]}}\n", "same name"},
		{"empty pattern", "callers:\n  - match: {sub: [\"\"]}\n", "empty pattern"},
		{"string not list", "callers:\n  - match: {sub: alice}\n", "must be a list"},
	} {
		_, err := Parse([]byte(tc.text), testEnv())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestCallersDigestAndSummary(t *testing.T) {
	p := mustParse(t, callersPolicy)
	// Order decides, so it is part of the digest.
	swapped := strings.Replace(strings.Replace(callersPolicy, "name: deploy", "name: TMP", 1), "name: sre", "name: deploy", 1)
	if q := mustParse(t, swapped); q.Digest() == p.Digest() {
		t.Error("renaming entries does not change the digest")
	}
	base := mustParse(t, "paths:\n  deny: [\"/etc/shadow\"]\n")
	if base.Digest() == p.Digest() {
		t.Error("the callers section is not in the digest")
	}
	s := strings.Join(p.Summary(), "\n")
	for _, want := range []string{"callers: deploy (client_id ci-deploy): the host-wide rules and tools: allow patch, read",
		"callers: sre (groups sre): the host-wide rules\n", "a caller no entry matches may use nothing"} {
		if !strings.Contains(s+"\n", want) {
			t.Errorf("summary %q lacks %q", s, want)
		}
	}
}

// FuzzForCaller: whatever the callers section and the caller, a policy
// narrowed for a caller never allows what the host-wide rules refuse.
func FuzzForCaller(f *testing.F) {
	f.Add(callersPolicy, "bob", "cli", "sre", "bash", "/srv/app/x", "ls /tmp")
	f.Add("tools: {deny: [write]}\ncallers:\n  - match: {groups: ['*']}\n    tools: {allow: [write]}\n", "a", "", "g", "write", "/x", "rm x")
	f.Fuzz(func(t *testing.T, text, sub, client, group, tool, path, line string) {
		p, err := Parse([]byte(text), testEnv())
		if err != nil {
			return
		}
		cp, err := p.ForCaller(Caller{Subject: sub, ClientID: client, Groups: []string{group}})
		if err != nil {
			return
		}
		if p.AllowTool(tool) != nil && cp.AllowTool(tool) == nil {
			t.Fatalf("the caller may use %q, which the host refuses", tool)
		}
		if strings.HasPrefix(path, "/") && p.CheckPath(Read, path, path) != nil && cp.CheckPath(Read, path, path) == nil {
			t.Fatalf("the caller may read %q, which the host refuses", path)
		}
		if p.CheckCommand(line, nil) != nil && cp.CheckCommand(line, nil) == nil {
			t.Fatalf("the caller may run %q, which the host refuses", line)
		}
	})
}
