package policy

import (
	"errors"
	"strings"
	"testing"
)

// winEnv is a Windows host whose agent runs pwsh.
func winEnv() Env {
	return Env{OS: "windows", Cwd: `C:\srv\app`, Home: `C:\Users\agent`, Tools: testTools,
		Shell: `C:\Program Files\PowerShell\7\pwsh.exe`}
}

// TestWinPathPatterns checks the pattern language on Windows paths:
// either separator, no case, drive letters, UNC shares.
func TestWinPathPatterns(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		{`C:\srv\app`, []string{`C:\srv\app`, `c:\SRV\App\x`, `C:/srv/app/a/b`}, []string{`C:\srv\app_evil`, `D:\srv\app`, `C:\srv`}},
		{`c:/srv/app/`, []string{`C:\SRV\APP\x`}, []string{`C:\srv\appx`}},
		{`C:\`, []string{`C:\`, `c:\windows\system32`}, []string{`D:\x`, `\\srv\share\x`}},
		{`C:\Users\*\.ssh\**`, []string{`C:\Users\Bob\.ssh\id_rsa`, `c:\users\bob\.SSH`}, []string{`C:\Users\Bob\x\.ssh\id`, `D:\Users\Bob\.ssh\id`}},
		{`*.pem`, []string{`C:\a.PEM`, `D:\certs\key.pem`, `\\srv\share\k.pem`}, []string{`C:\key.pem.bak`}},
		{`**\.ssh\**`, []string{`C:\Users\u\.ssh\id`}, []string{`C:\Users\u\.sshx\id`}},
		{`~\.aws`, []string{`C:\Users\Agent\.aws\credentials`}, []string{`C:\Users\agent\.awsx`, `C:\Users\other\.aws`}},
		{`~`, []string{`c:\users\agent`}, []string{`C:\Users\agentx`}},
		{`src\**`, []string{`C:\srv\app\src\a.go`, `C:\SRV\APP\SRC`}, []string{`C:\srv\app\srcx\a.go`, `C:\src\a.go`}},
		{`..\shared`, []string{`C:\srv\shared\x`}, []string{`C:\srv\app\shared`}},
		{`\\FileSrv\Share\docs`, []string{`\\filesrv\share\docs\a.txt`, `//FILESRV/SHARE/DOCS`}, []string{`\\filesrv\share\docs2`, `\\other\share\docs`, `C:\docs`}},
	}
	for _, tt := range tests {
		pp, err := compilePathPattern(tt.pattern, winEnv())
		if err != nil {
			t.Errorf("compile %q: %v", tt.pattern, err)
			continue
		}
		for _, p := range tt.yes {
			w, err := parseWinPath(p)
			if err != nil {
				t.Errorf("parse %q: %v", p, err)
				continue
			}
			if !pp.match(w.key) {
				t.Errorf("%q does not match %q (%q)", tt.pattern, p, w.key)
			}
		}
		for _, p := range tt.no {
			w, err := parseWinPath(p)
			if err == nil && pp.match(w.key) {
				t.Errorf("%q matches %q (%q)", tt.pattern, p, w.key)
			}
		}
	}
}

// TestWinPathNames: names Windows reads as something else than their
// text are never matched, so none can slip past a deny rule.
func TestWinPathNames(t *testing.T) {
	for _, p := range []string{
		`C:\secrets\key.txt.`, `C:\secrets\key.txt `, `C:\secrets.\key.txt`, `C:\secrets\key.txt::$DATA`,
		`C:\secrets\key.txt:hidden`, `C:\tmp\NUL`, `C:\tmp\nul.txt`, `C:\tmp\COM1.log`, `C:\tmp\con`, `C:\tmp\CONOUT$`,
		`C:\tmp\lpt9.x`, `C:\tmp\a*b`, `C:\tmp\a?b`, `C:\tmp\a"b`, `C:\tmp\a<b`, `C:\tmp\a|b`, "C:\\tmp\\a\x01b",
		`relative\path`, `\rooted\no\drive`, `C:relative`, `\\server`, `\\server\`, "C:\\tmp\\\xff",
	} {
		if w, err := parseWinPath(p); err == nil {
			t.Errorf("parseWinPath(%q) = %q, want an error", p, w.key)
		}
	}
	for p, want := range map[string]string{
		`C:\Windows\..\..\Users`:      "c:/users",
		`c:/a/./b//c`:                 "c:/a/b/c",
		`\\?\C:\Windows`:              "//?/c:/windows",
		`\??\C:\Windows`:              "//?/c:/windows",
		`\\.\PhysicalDrive0`:          "//./physicaldrive0",
		`\\srv\share`:                 "//srv/share",
		`\\srv\share\..\..\x`:         "//srv/share/x",
		`C:\tmp\console.txt`:          "c:/tmp/console.txt",
		`C:\tmp\com10`:                "c:/tmp/com10",
		`C:\tmp\.hidden`:              "c:/tmp/.hidden",
		`C:\Program Files (x86)\ünï`:  "c:/program files (x86)/ünï",
		`C:\tmp\PROGRA~1\file~2.txt`:  "c:/tmp/progra~1/file~2.txt",
		`D:\Data\..\data\Report.DOCX`: "d:/data/report.docx",
	} {
		w, err := parseWinPath(p)
		if err != nil || w.key != want {
			t.Errorf("parseWinPath(%q) = %q, %v; want %q", p, w.key, err, want)
		}
	}
}

// TestWinCheckPath: decisions on a Windows host, with deny rules matching
// whatever the case or separator, and UNC and device paths refused
// unless an allow rule written that way covers them.
func TestWinCheckPath(t *testing.T) {
	p := mustParseEnv(t, `
paths:
  deny: ['C:\secrets', '**\.ssh\**', '*.pem']
`, winEnv())
	allowed := mustParseEnv(t, `
paths:
  allow: ['C:\', '\\filesrv\public']
  deny: ['C:\secrets']
`, winEnv())
	empty := mustParseEnv(t, ``, winEnv())
	tests := []struct {
		pol             *Policy
		given, resolved string
		rule            string // "" allowed
	}{
		{p, `C:\srv\app\main.go`, `C:\srv\app\main.go`, ""},
		{p, `C:\secrets\key`, `C:\secrets\key`, "paths.deny"},
		{p, `c:\SECRETS\key`, `c:\SECRETS\key`, "paths.deny"},
		{p, `C:/Secrets/key`, `C:/Secrets/key`, "paths.deny"},
		{p, `C:\link`, `C:\Secrets\x`, "paths.deny"},
		{p, `C:\Secrets\x`, `C:\elsewhere`, "paths.deny"},
		{p, `C:\Users\Bob\.SSH\id`, `C:\Users\Bob\.SSH\id`, "paths.deny"},
		{p, `D:\certs\SERVER.PEM`, `D:\certs\SERVER.PEM`, "paths.deny"},
		{p, `C:\secrets\key.`, `C:\secrets\key.`, "paths"},
		{p, `C:\secrets\key::$DATA`, `C:\secrets\key::$DATA`, "paths"},
		{p, `C:\srv\..\secrets\key`, `C:\srv\..\secrets\key`, "paths.deny"},
		{p, `srv\app`, `srv\app`, "paths"},
		{p, `/srv/app`, `/srv/app`, "paths"},
		// UNC and device paths.
		{p, `\\filesrv\public\a.txt`, `\\filesrv\public\a.txt`, "paths"},
		{p, `\\?\C:\srv\app\x`, `\\?\C:\srv\app\x`, "paths"},
		{p, `\\.\PhysicalDrive0`, `\\.\PhysicalDrive0`, "paths"},
		{p, `C:\srv\link`, `\\filesrv\public\a.txt`, "paths"},
		{empty, `\\filesrv\public\a.txt`, `\\filesrv\public\a.txt`, "paths"},
		{empty, `C:\anything`, `C:\anything`, ""},
		{allowed, `\\filesrv\public\a.txt`, `\\filesrv\public\a.txt`, ""},
		{allowed, `\\FILESRV\Public\sub\b`, `\\FILESRV\Public\sub\b`, ""},
		{allowed, `\\filesrv\private\a.txt`, `\\filesrv\private\a.txt`, "paths.allow"},
		{allowed, `D:\x`, `D:\x`, "paths.allow"},
		{allowed, `C:\x`, `C:\x`, ""},
		{allowed, `C:\SECRETS`, `C:\SECRETS`, "paths.deny"},
	}
	for _, tt := range tests {
		err := tt.pol.CheckPath(Read, tt.given, tt.resolved)
		var d *Denial
		switch {
		case tt.rule == "" && err != nil:
			t.Errorf("CheckPath(%q, %q) = %v, want allowed", tt.given, tt.resolved, err)
		case tt.rule != "" && !errors.As(err, &d):
			t.Errorf("CheckPath(%q, %q) = %v, want a denial by %s", tt.given, tt.resolved, err, tt.rule)
		case tt.rule != "" && d.Rule != tt.rule:
			t.Errorf("CheckPath(%q, %q) denied by %s (%v), want %s", tt.given, tt.resolved, d.Rule, err, tt.rule)
		}
	}
}

// TestWinPatternErrors: patterns a Windows policy cannot use are errors at
// parse time.
func TestWinPatternErrors(t *testing.T) {
	for _, pat := range []string{`C:\tmp\nul`, `C:\tmp\x.`, `C:\a:b`, `\\server`, `C:\[abc`, `~bob\x`} {
		if _, err := Parse([]byte("paths:\n  deny: ['"+pat+"']\n"), winEnv()); err == nil {
			t.Errorf("pattern %q parsed, want an error", pat)
		}
	}
	if _, err := Parse([]byte("paths:\n  deny: [x]\n"), Env{OS: "windows", Cwd: "/srv", Tools: testTools}); err == nil {
		t.Error("a POSIX working directory on a Windows host parsed")
	}
}

// TestPowerShellCommandRules: command rules cannot check PowerShell, so
// on a PowerShell host (or any Windows host) they refuse every line with
// the reason, instead of stopping the agent; without command rules lines
// are not checked at all.
func TestPowerShellCommandRules(t *testing.T) {
	rules := "bash:\n  allow: [ls, cat]\n"
	for _, env := range []Env{
		winEnv(),
		{OS: "windows", Cwd: `C:\srv`, Tools: testTools, Shell: `C:\Program Files\Git\bin\bash.exe`},
		{Cwd: "/srv/app", Tools: testTools, Shell: "/usr/bin/pwsh"},
		{Cwd: "/srv/app", Tools: testTools, Shell: "powershell.EXE"},
	} {
		p := mustParseEnv(t, rules, env)
		for _, line := range []string{"ls", "Get-ChildItem", "cat x", ""} {
			err := p.CheckCommand(line, nil)
			var d *Denial
			if !errors.As(err, &d) || d.Rule != "bash" || !strings.Contains(err.Error(), "cannot check") {
				t.Errorf("shell %s on %q: CheckCommand(%q) = %v, want a denial saying the rules cannot check it", env.Shell, env.OS, line, err)
			}
		}
		deny := mustParseEnv(t, "bash:\n  deny: [rm]\n", env)
		if err := deny.CheckCommand("Get-ChildItem", nil); err == nil {
			t.Errorf("shell %s: deny-only command rules let an unchecked line through", env.Shell)
		}
		paths := mustParseEnv(t, "paths:\n  deny: [secrets]\n", env)
		if err := paths.CheckCommand("Get-Content secrets > out.txt", nil); err != nil {
			t.Errorf("shell %s: path rules alone refused a line: %v", env.Shell, err)
		}
	}
	// POSIX shells keep their checker, and unknown ones still stop the agent.
	if _, err := Parse([]byte(rules), Env{Cwd: "/srv", Tools: testTools, Shell: "zsh"}); err == nil {
		t.Error("command rules for zsh parsed")
	}
	if err := mustParseEnv(t, rules, Env{Cwd: "/srv", Tools: testTools, Shell: "bash"}).CheckCommand("ls", nil); err != nil {
		t.Errorf("bash: %v", err)
	}
}

// TestCheckCommandIn: relative redirection targets resolve against the
// directory the line runs in, not the agent's.
func TestCheckCommandIn(t *testing.T) {
	p := mustParse(t, "paths:\n  write:\n    deny: [/etc]\n")
	if err := p.CheckCommand("echo x > passwd", nil); err != nil {
		t.Fatalf("in the agent's directory: %v", err)
	}
	err := p.CheckCommandIn("echo x > passwd", "/etc", nil)
	var d *Denial
	if !errors.As(err, &d) || !strings.Contains(err.Error(), "/etc/passwd") {
		t.Errorf("CheckCommandIn in /etc = %v, want a denial naming /etc/passwd", err)
	}
	if err := p.CheckCommandIn("echo x > passwd", "/srv", nil); err != nil {
		t.Errorf("CheckCommandIn in /srv: %v", err)
	}
	if err := p.CheckCommandIn("echo x > passwd", "srv", nil); err == nil {
		t.Error("a relative working directory was accepted")
	}
}

// FuzzWinPath: parsing never panics, a canonical key parses to itself,
// and a path that parses has no name Windows would read differently.
func FuzzWinPath(f *testing.F) {
	for _, s := range []string{`C:\a\b`, `\\srv\share\x`, `\\?\C:\x`, `c:/A/../b`, `C:\x.`, `C:\nul`, `\\.\pipe\x`, `\??\UNC\s\h`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		w, err := parseWinPath(p)
		if err != nil {
			return
		}
		again, err := parseWinPath(w.key)
		if err != nil || again.key != w.key {
			t.Fatalf("key %q of %q parses to %q, %v", w.key, p, again.key, err)
		}
		if w.key != foldCase(w.key) || strings.Contains(w.key, `\`) {
			t.Fatalf("key %q of %q is not canonical", w.key, p)
		}
		if !strings.HasPrefix(w.key, w.root) {
			t.Fatalf("key %q of %q lacks its root %q", w.key, p, w.root)
		}
	})
}
