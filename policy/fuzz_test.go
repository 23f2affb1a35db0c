package policy

import (
	"path"
	"path/filepath"
	"strings"
	"testing"

	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

// fuzzAllowed are the only commands fuzzAllowPolicy allows; none of them
// runs another command.
var fuzzAllowed = []string{"ls", "echo", "cat", "git", "grep", "true"}

const fuzzAllowPolicy = `bash: {allow: ["ls *", "echo *", "cat *", "git *", "grep *", "true"]}`

// FuzzCheckCommand: the checker never panics, and never allows a line
// holding a command outside the allow list (or a denied one), judged by a
// simpler reading of the same syntax tree.
func FuzzCheckCommand(f *testing.F) {
	for _, s := range []string{
		"ls -l | grep x", "echo $(rm x)", "r\\m x", "{r,}m x", "f() { rm x; }; f", "echo hi > /tmp/x",
		"ls; rm x", "'rm' x", "\"$X\"", "cat <(ls)", "x='a[$(id)]'; echo $((x))", "case a in a) rm;; esac",
		"git log --oneline && echo 'a; rm'", "$'\\x72m' x", "ls\nrm", "for i in 1; do rm $i; done",
	} {
		f.Add(s)
	}
	allow := mustParse(f, fuzzAllowPolicy)
	deny := mustParse(f, `bash: {deny: ["rm *"]}`)
	f.Fuzz(func(t *testing.T, line string) {
		if allow.CheckCommand(line, nil) == nil {
			names, substs := commandNames(t, line)
			if substs {
				t.Fatalf("allow list passed %q, which has a substitution", line)
			}
			for _, name := range names {
				if name != unknownName && (path.Dir(name) == "." || sysBinDir(path.Dir(name))) && contains(fuzzAllowed, path.Base(name)) {
					continue
				}
				t.Fatalf("allow list passed %q, which runs %q", line, name)
			}
		}
		if deny.CheckCommand(line, nil) == nil {
			names, _ := commandNames(t, line)
			for _, name := range names {
				if path.Base(name) == "rm" || name == unknownName {
					t.Fatalf("deny rules passed %q, which runs %q", line, name)
				}
			}
		}
	})
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// unknownName stands for a command name only known at run time.
const unknownName = "<unknown>"

// commandNames returns the name of every simple command in a line the
// checker allowed, unknownName for one it cannot know, and whether the
// line has command or process substitutions.
func commandNames(t *testing.T, line string) (names []string, substs bool) {
	file, err := syntax.NewParser().Parse(strings.NewReader(line), "")
	if err != nil {
		t.Fatalf("checker passed %q, which does not parse: %v", line, err)
	}
	syntax.Walk(file, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.CallExpr:
			if len(n.Args) == 0 {
				return true
			}
			fields, err := expand.Fields(&expand.Config{}, n.Args[0])
			if err != nil || len(fields) == 0 || !plainWord(n.Args[0]) {
				names = append(names, unknownName)
			} else {
				names = append(names, fields[0])
			}
		case *syntax.CmdSubst, *syntax.ProcSubst:
			substs = true
		}
		return true
	})
	return names, substs
}

// plainWord reports whether w is made of quoted and unquoted literals
// only, without glob characters.
func plainWord(w *syntax.Word) bool {
	for _, p := range w.Parts {
		switch p := p.(type) {
		case *syntax.Lit:
			for i := 0; i < len(p.Value); i++ {
				switch c := p.Value[i]; {
				case c == '\\':
					i++
				case c == '*' || c == '?' || c == '[' && strings.Contains(p.Value[i:], "]"):
					return false
				}
			}
		case *syntax.SglQuoted:
		case *syntax.DblQuoted:
			for _, q := range p.Parts {
				if _, ok := q.(*syntax.Lit); !ok {
					return false
				}
			}
		default:
			return false
		}
	}
	return true
}

// hiddenSpellings spell the refused command.
var hiddenSpellings = []string{"rm -rf /tmp/x", "/bin/rm x", `r\m x`, "'rm' x", `"r"m x`, `$'\x72m' x`, "{r,}m x", "/usr/bin/rm x", "rm"}

// hider puts a command somewhere in a line: %s as it is, %q single-quoted,
// %Q double-quoted. None adds words after it, which would change what a
// wrapper inside runs, and "$(" and "(" are followed by a space, so "$(("
// and "((" never turn into arithmetic.
type hider struct {
	template string
	// wraps is set for wrappers such as sudo: what they run must be a
	// simple command, or the line means something else.
	wraps bool
	// simple is set when the result is a simple command.
	simple bool
}

var hiders = []hider{
	{"ls; %s", false, false}, {"ls && %s", false, false}, {"ls || %s", false, false},
	{"ls | %s", false, false}, {"ls & %s", false, false}, {"ls\n%s", false, false}, {"( %s )", false, false},
	{"{ %s; }", false, false}, {"if true; then %s; fi", false, false}, {"if %s; then ls; fi", false, false},
	{"while true; do %s; done", false, false}, {"until ls; do %s; done", false, false},
	{"for i in 1; do %s; done", false, false}, {"case x in x) %s;; esac", false, false}, {"f() { %s; }", false, false},
	{"echo $( %s )", false, true}, {"echo \"$( %s )\"", false, true}, {"cat <( %s )", false, true},
	{"ls > >( %s )", false, false}, {"time %s", false, false}, {"ls; ! %s", false, false}, {"ls; coproc %s", false, false},
	{"x=$( %s )", false, false}, {"export X=$( %s )", false, false},
	{"sudo %s", true, true}, {"sudo -u root %s", true, true}, {"env A=1 %s", true, true}, {"nice -n 1 %s", true, true},
	{"nohup %s", true, true}, {"timeout 5 %s", true, true}, {"command %s", true, true}, {"exec %s", true, true},
	{"xargs %s", true, true}, {"find . -exec %s \\;", true, true},
	{"bash -c %q", false, true}, {"sh -c %q", false, true}, {"bash -c %Q", false, true}, {"eval %Q", false, true},
	{"echo %Q | xargs -0 bash -c", false, false}, {"trap %Q EXIT", false, true}, {"su -c %Q root", false, true},
	{"watch %Q", false, true}, {"builtin eval %Q", false, true},
}

// FuzzHiddenCommand hides a refused command in constructs chosen by the
// input, nested up to four deep, and checks that both policies refuse it.
func FuzzHiddenCommand(f *testing.F) {
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{3, 20, 32, 5})
	f.Add([]byte{8, 1, 15, 33, 2})
	allow := mustParse(f, `bash: {allow: ["ls *", "echo *", "cat *", "true", "sudo *", "env *", "nice *", "nohup *", "timeout *",
		"command *", "exec *", "time *", "xargs *", "find *", "bash *", "sh *", "su *", "watch *", "builtin *"]}`)
	deny := mustParse(f, `bash: {deny: ["rm *"]}`)
	f.Fuzz(func(t *testing.T, choice []byte) {
		if len(choice) == 0 || len(choice) > 5 {
			return
		}
		line, simple := hiddenSpellings[int(choice[0])%len(hiddenSpellings)], true
		for _, c := range choice[1:] {
			h := hiders[int(c)%len(hiders)]
			if h.wraps && !simple {
				continue
			}
			line, simple = hide(h.template, line), h.simple
		}
		if allow.CheckCommand(line, nil) == nil {
			t.Fatalf("allow list passed %q", line)
		}
		if deny.CheckCommand(line, nil) == nil {
			t.Fatalf("deny rules passed %q", line)
		}
	})
}

// hide puts cmd into template.
func hide(template, cmd string) string {
	sq := "'" + strings.ReplaceAll(cmd, "'", `'\''`) + "'"
	dq := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "$", `\$`, "`", "\\`").Replace(cmd) + `"`
	return strings.NewReplacer("%s", cmd, "%q", sq, "%Q", dq).Replace(template)
}

// FuzzPathRules: pattern compilation and matching never panic, a denied
// directory denies what is in it, and a pattern without wildcards never
// matches a prefix sibling.
func FuzzPathRules(f *testing.F) {
	for _, s := range [][2]string{{"/srv/app", "/srv/app_evil"}, {"**/.ssh/**", "/h/.ssh/k"}, {"*.pem", "/a/b.pem"},
		{"~/x", "/home/agent/x/y"}, {"src/[a-c]*", "/srv/app/src/b"}, {"/a/{b,c}/**", "/a/c/\xff"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, p string) {
		pp, err := compilePathPattern(pattern, testEnv())
		if err != nil {
			return
		}
		p = filepath.Clean("/" + p)
		pp.match(p)
		if pp.glob == "" && pp.lit != "/" {
			if pp.match(pp.lit+"_x") || !pp.match(pp.lit) || !pp.match(pp.lit+"/x") {
				t.Fatalf("literal %q: wrong on its own path, a child or a prefix sibling", pp.lit)
			}
		}
		pol := &Policy{env: testEnv()}
		pol.paths.byOp[Read].deny = []*pathList{{name: "paths.deny", pats: []pathPattern{pp}}}
		if pol.CheckPath(Read, p, p) != nil && pol.CheckPath(Read, p+"/child", p+"/child") == nil {
			t.Fatalf("%q denies %q but not what is in it", pattern, p)
		}
	})
}

// FuzzParse: parsing never panics, and a parsed policy's normalised form
// parses back to the same digest.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "tools: {deny: [write]}", "paths: {allow: [/srv/**], read: {deny: ['*.pem']}}",
		"bash:\n  allow:\n    - git *\n  deny: [git push *]\n", `{"skills": {"deny": ["x"]}}`, "bash: {allow: [~]}", "a: &x [1]\nb: *x"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data, testEnv())
		if err != nil {
			return
		}
		if len(p.Summary()) != 4 {
			t.Fatalf("summary %q", p.Summary())
		}
		again, err := Parse(p.rules.canonical(), testEnv())
		if err != nil {
			t.Fatalf("canonical form %s of %q does not parse: %v", p.rules.canonical(), data, err)
		}
		if again.Digest() != p.Digest() {
			t.Fatalf("digest changed through the canonical form of %q", data)
		}
	})
}
