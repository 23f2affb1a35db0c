package policy

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// testTools are the tool names the tests' policies may name.
var testTools = []string{"bash", "delete", "edit", "list", "move", "patch", "read", "search", "write"}

// TestCommandArchives runs testdata/commands/*.txtar: each holds a policy
// and command lines that must be allowed ("ok") or refused ("no", with
// text the refusal must contain).
func TestCommandArchives(t *testing.T) {
	for _, file := range archives(t, "commands") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			a := readArchive(t, file)
			p, err := Parse([]byte(a.files["policy.yaml"]), archiveEnv(t, a))
			if err != nil {
				t.Fatalf("policy: %v", err)
			}
			cases := readCases(t, filepath.Base(file), a.files["cases"])
			if len(cases) == 0 {
				t.Fatal("no cases")
			}
			for _, tc := range cases {
				checkCase(t, p, tc)
			}
		})
	}
}

func checkCase(t *testing.T, p *Policy, tc testCase) {
	t.Helper()
	err := p.CheckCommand(tc.line, nil)
	var d *Denial
	switch {
	case tc.allow && err != nil:
		t.Errorf("%s: %q refused: %v", tc.pos, tc.line, err)
	case tc.allow:
	case err == nil:
		t.Errorf("%s: %q allowed, want it refused", tc.pos, tc.line)
	case !errors.As(err, &d):
		t.Errorf("%s: %q: error %v (%T) is not a *Denial", tc.pos, tc.line, err, err)
	case !strings.Contains(err.Error(), tc.want):
		t.Errorf("%s: %q refused with\n\t%v\nwant it to mention %q", tc.pos, tc.line, err, tc.want)
	case !strings.HasPrefix(err.Error(), "denied by host policy: "):
		t.Errorf("%s: %q: refusal %q does not start with \"denied by host policy: \"", tc.pos, tc.line, err)
	}
}

// Without bash or path rules nothing is parsed: any line passes, even one
// that does not parse.
func TestCommandUnrestricted(t *testing.T) {
	var nilPolicy *Policy
	p := mustParse(t, `tools: {deny: [write]}`)
	for _, line := range []string{"rm -rf /", "echo 'unterminated", "echo hi > /etc/passwd", "cat < /dev/tcp/h/80", "x\x00y"} {
		for _, pol := range []*Policy{nilPolicy, p, {}} {
			if err := pol.CheckCommand(line, nil); err != nil {
				t.Errorf("CheckCommand(%q) without bash or path rules = %v", line, err)
			}
		}
	}
}

// With path rules but no bash rules, only the line's own redirections are
// checked: commands are not, nor the scripts they are handed.
func TestCommandRedirectsOnly(t *testing.T) {
	p := mustParse(t, `paths: {deny: ["/etc/**"], write: {allow: ["/srv/app/**"]}}`)
	for _, line := range []string{"rm -rf /", "PATH=/tmp make", "cat /etc/shadow", "sudo -Z x", "bash -c 'echo hi > /etc/x'",
		"echo hi > x", "cd /srv/app/sub; cat < /srv/app/in > /srv/app/out", "echo '$(' > /srv/app/q", "tee >(cat) > /srv/app/x", "echo \"$x\" > out", "make -C sub > build.log"} {
		if err := p.CheckCommand(line, nil); err != nil {
			t.Errorf("CheckCommand(%q) without bash rules = %v", line, err)
		}
	}
	for _, tc := range []struct{ line, want string }{
		{"echo hi > /etc/passwd", "matches paths.deny"},
		{"cat < /etc/shadow", "read /etc/shadow: matches paths.deny"},
		{"echo hi > /tmp/x", "outside paths.write.allow"},
		{"cat < /dev/tcp/h/80", "network"},
		{"exec 3<>/dev/udp/h/53", "network"},
		{"(echo hi > /etc/x)", "paths.deny"},
		{"echo $(echo hi > /etc/x)", "paths.deny"},
		{"echo 'unterminated", "does not parse"},
		{"cd /tmp; echo hi > x", "changes directory"},
		{"builtin cd /tmp; echo hi > x", "changes directory"},
		{"trap 'cd /tmp' DEBUG; echo hi > x", "changes directory"},
		{"$X /tmp; echo hi > x", "changes directory"},
		{"'cd' /tmp; echo hi > x", "changes directory"},
		{". ./env; echo hi > x", "changes directory"},
		{"c\\d /tmp; echo hi > x", "changes directory"},
		{"builtin 'c'd /tmp; echo hi > x", "changes directory"},
		{"builtin $'\\x63d' /tmp; echo hi > x", "changes directory"},
		{"command $c /tmp; echo hi > x", "changes directory"},
		{"echo hi > \"$F\"", "only known when the line runs"},
	} {
		err := p.CheckCommand(tc.line, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckCommand(%q) = %v, want a refusal mentioning %q", tc.line, err, tc.want)
		}
	}
	// A shell whose lines cannot be parsed: without bash rules, they are
	// not checked.
	// mksh may open a file named by the word of <&: one only known when
	// the line runs is refused there.
	mksh, err := Parse([]byte(`paths: {deny: ["/etc/**"]}`), Env{Cwd: "/srv/app", Shell: "mksh", Tools: testTools})
	if err != nil {
		t.Fatal(err)
	}
	if err := mksh.CheckCommand(`cat <&$fd`, nil); err == nil || !strings.Contains(err.Error(), "only known when the line runs") {
		t.Errorf("mksh, <&$fd: %v", err)
	}
	if err := p.CheckCommand(`cat <&$fd`, nil); err != nil {
		t.Errorf("bash, <&$fd: %v", err)
	}
	zsh, err := Parse([]byte(`paths: {deny: ["/etc/**"]}`), Env{Cwd: "/srv/app", Shell: "zsh", Tools: testTools})
	if err != nil {
		t.Fatal(err)
	}
	if err := zsh.CheckCommand("echo hi > /etc/x", nil); err != nil {
		t.Errorf("zsh without bash rules: %v", err)
	}
}

func TestCommandNUL(t *testing.T) {
	p := mustParse(t, `bash: {deny: ["rm *"]}`)
	if err := p.CheckCommand("ls\x00; rm x", nil); err == nil || !strings.Contains(err.Error(), "NUL") {
		t.Errorf("line with NUL: %v", err)
	}
}

// The files callback sees every redirection target exactly as the shell
// opens it (relative ones joined to the working directory, nothing
// cleaned), with what the redirection does, and its refusal is the line's.
func TestCommandFilesCallback(t *testing.T) {
	p := mustParse(t, `bash: {allow: ["echo *", "cat *", "exec *"]}`)
	var seen []string
	refuse := errors.New("no")
	files := func(path string, ops ...Op) error {
		seen = append(seen, fmt.Sprint(path, ops))
		if strings.HasPrefix(path, "/secret") {
			return refuse
		}
		return nil
	}
	line := "echo a > x; echo b >> /tmp/./y 2>/dev/null; echo c &> ~/z; cat < a/l/../../in <> //dev/../rw; exec {fd}<./f 3>&1 4<&-"
	if err := p.CheckCommand(line, files); err != nil {
		t.Fatal(err)
	}
	want := "/tmp/./y[write] /home/agent/z[write] //dev/../rw[read write] /srv/app/x[write] /srv/app/a/l/../../in[read] /srv/app/./f[read]"
	if got := strings.Join(seen, " "); got != want {
		t.Errorf("files saw\n\t%s\nwant\n\t%s", got, want)
	}
	if err := p.CheckCommand("echo a > /secret/k", files); !errors.Is(err, refuse) {
		t.Errorf("refusal of the files callback = %v, want it returned", err)
	}
	if err := p.CheckCommand("cat < /secret/k", files); !errors.Is(err, refuse) {
		t.Errorf("refusal of the files callback for a read = %v, want it returned", err)
	}
	// Without path rules, a target only known at run time is not the
	// rules' business, unless it could name /dev/tcp or /dev/udp.
	for _, line := range []string{`echo a > "/tmp/$F"`, `cat < ./$F`, `echo a > out-$F`} {
		if err := p.CheckCommand(line, files); err != nil {
			t.Errorf("%s without path rules: %v", line, err)
		}
	}
	for _, line := range []string{`echo a > "$F"`, `cat < /dev/$P/h/80`, `cat < /dev/t$P`, `echo a >& $F`} {
		if err := p.CheckCommand(line, files); err == nil || !strings.Contains(err.Error(), "/dev/tcp or /dev/udp") {
			t.Errorf("%s: %v, want a refusal naming /dev/tcp", line, err)
		}
	}
}

// Scripts nested beyond the limit are refused rather than followed.
func TestCommandDepth(t *testing.T) {
	p := mustParse(t, `bash: {deny: ["rm *"]}`)
	line := strings.Repeat("eval ", maxDepth+2) + "ls"
	if err := p.CheckCommand(line, nil); err == nil || !strings.Contains(err.Error(), "too deeply") {
		t.Errorf("deeply nested line: %v", err)
	}
	line = strings.Repeat("sudo ", maxDepth+2) + "ls"
	if err := p.CheckCommand(line, nil); err == nil || !strings.Contains(err.Error(), "too deeply") {
		t.Errorf("deeply wrapped line: %v", err)
	}
}

func TestCommandPatterns(t *testing.T) {
	tests := []struct {
		pattern, subject string
		forDeny, must    bool
	}{
		{"git *", "git", false, true},
		{"git *", "git status", false, true},
		{"git *", "gitk", false, false},
		{"git push *", "git push origin main", false, true},
		{"git push *", "git pull", false, false},
		{"git * --force", "git push --force", false, true},
		{"/usr/bin/git *", "git log", false, true},
		{"./build.sh *", "./build.sh x", false, true},
		{"./build.sh *", "build.sh x", false, false},
		{"*", "anything at all", false, true},
		{"ls", "ls -l", false, false},
		{"ls", "ls", false, true},
		{"rm *", "rm -rf /", true, true},
		{"/bin/rm *", "rm x", true, true},
	}
	for _, tt := range tests {
		cp, err := compileCmdPattern(tt.pattern, tt.forDeny)
		if err != nil {
			t.Fatal(err)
		}
		name, rest, _ := strings.Cut(tt.subject, " ")
		s := commandName(name, tt.forDeny)
		if rest != "" {
			s += " " + rest
		}
		if got := cp.must(s); got != tt.must {
			t.Errorf("pattern %q on %q = %v, want %v", tt.pattern, tt.subject, got, tt.must)
		}
	}
}

// may and must agree on subjects without unknown parts; with them, may is
// true exactly when some value makes the pattern match.
func TestCommandOverlap(t *testing.T) {
	d := string(dyn)
	tests := []struct {
		pattern, subject string
		may, must        bool
	}{
		{"rm *", d, true, false},
		{"rm *", d + " -rf /", true, false},
		{"rm -rf /", d + " x", false, false},
		{"git push *", "git " + d + " origin", true, false},
		{"git push *", "git " + d, true, false},
		{"git push *", "git pull " + d, false, false},
		{"git *", "git " + d, true, true},
		{"git *", "g" + d, true, false},
		{"a*b*c", "a" + d + "c", true, false},
		{"abc", "a" + d + "c", true, false},
		{"abc", "a" + d + "d", false, false},
		{"x", "", false, false},
		{"*", "", true, true},
	}
	for _, tt := range tests {
		cp := cmdPattern{text: tt.pattern, alts: []string{tt.pattern}}
		if got := cp.may(tt.subject); got != tt.may {
			t.Errorf("may(%q, %q) = %v, want %v", tt.pattern, strings.ReplaceAll(tt.subject, d, "<dyn>"), got, tt.may)
		}
		if got := cp.must(tt.subject); got != tt.must {
			t.Errorf("must(%q, %q) = %v, want %v", tt.pattern, strings.ReplaceAll(tt.subject, d, "<dyn>"), got, tt.must)
		}
	}
}
