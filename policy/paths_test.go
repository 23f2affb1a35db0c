package policy

import (
	"errors"
	"strings"
	"testing"
)

// TestPathPatterns checks the pattern language on resolved paths.
func TestPathPatterns(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		// No wildcard: the path and everything under it, never a prefix
		// sibling.
		{"/srv/app", []string{"/srv/app", "/srv/app/x", "/srv/app/a/b/c"}, []string{"/srv/app_evil", "/srv/app_evil/x", "/srv/ap", "/srv", "/srv/appx/y"}},
		{"/srv/app/", []string{"/srv/app", "/srv/app/x"}, []string{"/srv/app_evil"}},
		{"/", []string{"/", "/etc/passwd"}, nil},
		// * and ? stop at /, ** crosses it.
		{"/srv/app/*", []string{"/srv/app/x", "/srv/app/.hidden"}, []string{"/srv/app/x/y", "/srv/app_evil/x"}},
		{"/srv/app/?.txt", []string{"/srv/app/a.txt"}, []string{"/srv/app/ab.txt", "/srv/app/a/b.txt"}},
		{"/srv/app/**", []string{"/srv/app", "/srv/app/x/y/z"}, []string{"/srv/app_evil", "/srv/app_evil/x"}},
		{"/srv/*/logs/**", []string{"/srv/a/logs/x"}, []string{"/srv/a/b/logs/x"}},
		{"/srv/{a,b}/**", []string{"/srv/a/x", "/srv/b"}, []string{"/srv/c/x"}},
		// Starting with a wildcard: unanchored.
		{"*.pem", []string{"/a.pem", "/etc/ssl/private/key.pem"}, []string{"/etc/ssl/key.pem.bak", "/etc/pem"}},
		{"**/.ssh/**", []string{"/home/u/.ssh", "/home/u/.ssh/id_rsa", "/root/.ssh/a/b"}, []string{"/home/u/.sshx/id", "/home/u/ssh/id"}},
		{"**/.env", []string{"/srv/app/.env", "/.env"}, []string{"/srv/app/.env.example", "/srv/app/x.env"}},
		// ~ and relative patterns.
		{"~/.aws", []string{"/home/agent/.aws", "/home/agent/.aws/credentials"}, []string{"/home/agent/.awsx", "/root/.aws"}},
		{"~", []string{"/home/agent", "/home/agent/x"}, []string{"/home/agentx"}},
		{"src/**", []string{"/srv/app/src/a.go"}, []string{"/srv/app/srcx/a.go", "/src/a.go"}},
		{"../shared", []string{"/srv/shared/x"}, []string{"/srv/app/shared"}},
		{"/srv/app/../etc", []string{"/srv/etc/x"}, []string{"/srv/app/etc"}},
		// Names that are not UTF-8.
		{"/srv/app/**", []string{"/srv/app/\xff\xfe/x"}, []string{"/srv/\xffapp/x"}},
		{"*.pem", []string{"/srv/k\xff.pem"}, nil},
		{"/srv/\xff", []string{"/srv/\xff/x"}, []string{"/srv/\xfe"}},
	}
	for _, tt := range tests {
		pp, err := compilePathPattern(tt.pattern, testEnv())
		if err != nil {
			t.Errorf("compile %q: %v", tt.pattern, err)
			continue
		}
		for _, p := range tt.yes {
			if !pp.match(p) {
				t.Errorf("%q does not match %q", tt.pattern, p)
			}
		}
		for _, p := range tt.no {
			if pp.match(p) {
				t.Errorf("%q matches %q", tt.pattern, p)
			}
		}
	}
}

// TestCheckPath checks decisions on pairs of given and resolved paths.
func TestCheckPath(t *testing.T) {
	p := mustParse(t, `
paths:
  allow: ["/srv/app/**", "/tmp/**"]
  deny: ["**/.ssh/**", "*.pem", "**/.env", "/srv/app/secrets"]
  read: {deny: ["/tmp/private"]}
  write: {allow: ["/srv/app/src/**", "/tmp/**"], deny: ["/srv/app/src/vendor/**"]}
`)
	tests := []struct {
		op              Op
		given, resolved string
		rule            string // "" for allowed
	}{
		{Read, "/srv/app/README", "/srv/app/README", ""},
		{Read, "/srv/app/src/a.go", "/srv/app/src/a.go", ""},
		{Write, "/srv/app/src/a.go", "/srv/app/src/a.go", ""},
		{Write, "/srv/app/README", "/srv/app/README", "paths.write.allow"},
		{Read, "/etc/passwd", "/etc/passwd", "paths.allow"},
		{Read, "/srv/app_evil/x", "/srv/app_evil/x", "paths.allow"},
		// A link out of the allowed tree: the resolved path decides.
		{Read, "/srv/app/link", "/etc/shadow", "paths.allow"},
		{Write, "/srv/app/src/link", "/etc/cron.d/x", "paths.allow"},
		{Write, "/srv/app/link", "/srv/app/README", "paths.write.allow"},
		// A link into the allowed tree from outside is fine.
		{Read, "/home/u/notes", "/srv/app/notes", ""},
		// Deny matches the path as given (a link's own name) and resolved.
		{Read, "/srv/app/id.pem", "/srv/app/harmless", "paths.deny"},
		{Read, "/srv/app/harmless", "/home/u/.ssh/id_rsa", "paths.deny"},
		{Read, "/srv/app/.env", "/srv/app/.env", "paths.deny"},
		// A denied directory denies what is in it.
		{Read, "/srv/app/secrets/db.yaml", "/srv/app/secrets/db.yaml", "paths.deny"},
		{Write, "/srv/app/secrets", "/srv/app/secrets", "paths.deny"},
		{Read, "/srv/app/secretsx", "/srv/app/secretsx", ""},
		// Operation lists.
		{Read, "/tmp/private/x", "/tmp/private/x", "paths.read.deny"},
		{Write, "/tmp/private/x", "/tmp/private/x", ""},
		{Write, "/srv/app/src/vendor/m/x.go", "/srv/app/src/vendor/m/x.go", "paths.write.deny"},
		{Read, "/srv/app/src/vendor/m/x.go", "/srv/app/src/vendor/m/x.go", ""},
		// Unclean input is cleaned first; relative input is refused.
		{Read, "/srv/app/src/../../../etc/passwd", "/srv/app/src/../../../etc/passwd", "paths.allow"},
		{Read, "srv/app/x", "srv/app/x", "paths"},
	}
	for _, tt := range tests {
		err := p.CheckPath(tt.op, tt.given, tt.resolved)
		var d *Denial
		switch {
		case tt.rule == "" && err != nil:
			t.Errorf("%s %s -> %s: %v", tt.op, tt.given, tt.resolved, err)
		case tt.rule == "":
		case !errors.As(err, &d):
			t.Errorf("%s %s -> %s = %v, want a denial by %s", tt.op, tt.given, tt.resolved, err, tt.rule)
		case d.Rule != tt.rule:
			t.Errorf("%s %s -> %s denied by %s (%v), want %s", tt.op, tt.given, tt.resolved, d.Rule, err, tt.rule)
		}
	}
}

func TestCheckPathMessages(t *testing.T) {
	p := mustParse(t, `paths: {allow: ["/srv/app/**"], deny: ["**/.ssh/**"]}`)
	tests := []struct {
		op              Op
		given, resolved string
		want            string
	}{
		{Read, "/srv/app/k", "/root/.ssh/id", `denied by host policy: read /srv/app/k (resolves to /root/.ssh/id): matches paths.deny "**/.ssh/**"`},
		{Write, "/etc/x", "/etc/x", "denied by host policy: write /etc/x: outside paths.allow (/srv/app/**)"},
	}
	for _, tt := range tests {
		if err := p.CheckPath(tt.op, tt.given, tt.resolved); err == nil || err.Error() != tt.want {
			t.Errorf("CheckPath(%s, %s, %s) = %v\nwant %s", tt.op, tt.given, tt.resolved, err, tt.want)
		}
	}
	p = mustParse(t, `paths: {deny: ["/srv/app/sec*"]}`)
	err := p.CheckPath(Read, "/srv/app/secrets/a/b", "/srv/app/secrets/a/b")
	if err == nil || !strings.Contains(err.Error(), `/srv/app/secrets matches paths.deny "/srv/app/sec*"`) {
		t.Errorf("denial through a directory: %v", err)
	}
}

// CheckPathDeny ignores the allow lists.
func TestCheckPathDeny(t *testing.T) {
	p := mustParse(t, `paths: {allow: ["/srv/app/**"], deny: ["*.key"]}`)
	if err := p.CheckPathDeny(Read, "/var/lib/agent/output/c1.log", "/var/lib/agent/output/c1.log"); err != nil {
		t.Errorf("CheckPathDeny outside the allow list: %v", err)
	}
	if err := p.CheckPathDeny(Read, "/var/x.key", "/var/x.key"); err == nil {
		t.Error("CheckPathDeny allowed a denied path")
	}
	var nilPolicy *Policy
	if err := nilPolicy.CheckPath(Write, "/etc/passwd", "/etc/passwd"); err != nil {
		t.Errorf("nil policy: %v", err)
	}
	if !p.HasPathRules(Read) || nilPolicy.HasPathRules(Write) || mustParse(t, `paths: {read: {deny: [/x]}}`).HasPathRules(Write) {
		t.Error("HasPathRules is wrong")
	}
}
