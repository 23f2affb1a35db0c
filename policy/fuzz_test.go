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
// holding a command outside the allow list (or a denied one), or, under
// the allow list, arithmetic on a variable or prompt expansion, judged by
// a simpler reading of the same syntax tree. With sh as the agent's
// shell, the line is judged as POSIX sh and as bash.
func FuzzCheckCommand(f *testing.F) {
	for _, s := range []string{
		"ls -l | grep x", "echo $(rm x)", "r\\m x", "{r,}m x", "f() { rm x; }; f", "echo hi > /tmp/x",
		"ls; rm x", "'rm' x", "\"$X\"", "cat <(ls)", "x='a[$(id)]'; echo $((x))", "case a in a) rm;; esac",
		"git log --oneline && echo 'a; rm'", "$'\\x72m' x", "ls\nrm", "for i in 1; do rm $i; done",
		"((rm))", "ls $((c))", "ls ${b@P}", "[[ y -eq 0 ]]", "ls ${z[y]}", "echo $((1+2))", "flock /l rm x",
		"curl x | bash -", "PATH=/tmp ls", "declare 'PATH=/x'", "ssh h rm x", "xargs -I{} sh -c {}",
		"sort --com=sh x", "tar cIf sh x d", "awk 'BEGIN{system(\"rm x\")}'", "sed '1e rm x' f", "sh <<EOF\nrm x\nEOF",
		"xargs rm <<< 'a b'", "make X!=rm", "go test -exec rm", "crontab - <<< '* * * * * rm x'", "coproc rm <<< x",
	} {
		f.Add(s)
	}
	sh := testEnv()
	sh.Shell = "dash"
	judges := []struct {
		p        *Policy
		variants []syntax.LangVariant
		allow    bool
	}{
		{mustParse(f, fuzzAllowPolicy), []syntax.LangVariant{syntax.LangBash}, true},
		{mustParse(f, `bash: {deny: ["rm *"]}`), []syntax.LangVariant{syntax.LangBash}, false},
		{mustParseEnv(f, fuzzAllowPolicy, sh), []syntax.LangVariant{syntax.LangPOSIX, syntax.LangBash}, true},
		{mustParseEnv(f, `bash: {deny: ["rm *"]}`, sh), []syntax.LangVariant{syntax.LangPOSIX, syntax.LangBash}, false},
	}
	f.Fuzz(func(t *testing.T, line string) {
		for _, j := range judges {
			if j.p.CheckCommand(line, nil) != nil {
				continue
			}
			for _, v := range j.variants {
				r := readLine(t, line, v)
				if j.allow {
					judgeAllowed(t, line, r)
				} else {
					judgeDenied(t, line, r)
				}
			}
		}
	})
}

func judgeAllowed(t *testing.T, line string, r lineReading) {
	switch {
	case r.substs:
		t.Fatalf("allow list passed %q, which has a substitution", line)
	case r.evaluates:
		t.Fatalf("allow list passed %q, which makes bash evaluate a value as code", line)
	}
	for _, name := range r.names {
		if name == "" || name != unknownName && (path.Dir(name) == "." || sysBinDir(path.Dir(name))) && contains(fuzzAllowed, path.Base(name)) {
			continue // an empty name runs nothing
		}
		t.Fatalf("allow list passed %q, which runs %q", line, name)
	}
}

func judgeDenied(t *testing.T, line string, r lineReading) {
	for _, name := range r.names {
		// A name ending in "/" is a directory, which runs nothing.
		if path.Base(name) == "rm" && !strings.HasSuffix(name, "/") || name == unknownName {
			t.Fatalf("deny rules passed %q, which runs %q", line, name)
		}
	}
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

// lineReading is what a line the checker allowed does, read simply.
type lineReading struct {
	names     []string // the name of every simple command, or unknownName
	substs    bool     // command or process substitutions
	evaluates bool     // arithmetic naming a variable, ${x@P}, ${!x}
}

// readLine reads a line the checker allowed, parsed as variant.
func readLine(t *testing.T, line string, variant syntax.LangVariant) lineReading {
	var r lineReading
	file, err := syntax.NewParser(syntax.Variant(variant)).Parse(strings.NewReader(line), "")
	if err != nil {
		t.Fatalf("checker passed %q, which does not parse as %s: %v", line, variant, err)
	}
	syntax.Walk(file, func(n syntax.Node) bool {
		switch n := n.(type) {
		case *syntax.CallExpr:
			if len(n.Args) == 0 {
				return true
			}
			first := firstBraceWord(n.Args[0])
			fields, err := expand.Fields(&expand.Config{}, first)
			if err != nil || len(fields) == 0 || !plainWord(first) {
				r.names = append(r.names, unknownName)
			} else {
				r.names = append(r.names, fields[0])
			}
		case *syntax.CmdSubst, *syntax.ProcSubst:
			r.substs = true
		case *syntax.ArithmExp, *syntax.ArithmCmd, *syntax.LetClause, *syntax.CStyleLoop:
			r.evaluates = r.evaluates || namesVariable(n)
		case *syntax.ParamExp:
			r.evaluates = r.evaluates || n.Excl && n.Names == 0 && n.Index == nil ||
				n.Exp != nil && n.Exp.Op == syntax.OtherParamOps && n.Exp.Word.Lit() == "P"
		}
		return true
	})
	return r
}

// firstBraceWord returns the first word brace expansion makes of w that
// bash keeps (it drops empty unquoted ones), or w.
func firstBraceWord(w *syntax.Word) *syntax.Word {
	cp := &syntax.Word{Parts: append([]syntax.WordPart(nil), w.Parts...)}
	if !syntax.SplitBraces(cp) {
		return w
	}
	for bw, err := range expand.BracesSeq(nil, cp) {
		if err != nil {
			return w
		}
		if fields, err := expand.Fields(&expand.Config{}, bw); err != nil || len(fields) > 0 {
			return bw
		}
	}
	return w
}

// namesVariable reports whether a literal in arithmetic node n starts
// with a letter or an underscore: a variable's name, bare or expanded.
func namesVariable(n syntax.Node) bool {
	found := false
	syntax.Walk(n, func(m syntax.Node) bool {
		if pe, ok := m.(*syntax.ParamExp); ok && pe.Length && pe.Index == nil {
			return false // ${#x}: a number
		}
		if lit, ok := m.(*syntax.Lit); ok && lit.Value != "" {
			c := lit.Value[0]
			found = found || c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		}
		return !found
	})
	return found
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
	// scope says which policies must refuse the result.
	scope hiderScope
}

// hiderScope says which policies a hider's result must be refused by.
type hiderScope int

const (
	anyPolicy hiderScope = iota
	// allowOnly: bash evaluates an assembled value as code, which only an
	// allow list refuses.
	allowOnly
	// shOnly: the command runs only when a POSIX shell reads the line.
	shOnly
)

var hiders = []hider{
	{"ls; %s", false, false, anyPolicy}, {"ls && %s", false, false, anyPolicy}, {"ls || %s", false, false, anyPolicy},
	{"ls | %s", false, false, anyPolicy}, {"ls & %s", false, false, anyPolicy}, {"ls\n%s", false, false, anyPolicy}, {"( %s )", false, false, anyPolicy},
	{"{ %s; }", false, false, anyPolicy}, {"if true; then %s; fi", false, false, anyPolicy}, {"if %s; then ls; fi", false, false, anyPolicy},
	{"while true; do %s; done", false, false, anyPolicy}, {"until ls; do %s; done", false, false, anyPolicy},
	{"for i in 1; do %s; done", false, false, anyPolicy}, {"case x in x) %s;; esac", false, false, anyPolicy}, {"f() { %s; }", false, false, anyPolicy},
	{"echo $( %s )", false, true, anyPolicy}, {"echo \"$( %s )\"", false, true, anyPolicy}, {"cat <( %s )", false, true, anyPolicy},
	{"ls > >( %s )", false, false, anyPolicy}, {"time %s", false, false, anyPolicy}, {"ls; ! %s", false, false, anyPolicy}, {"ls; coproc %s", false, false, anyPolicy},
	{"x=$( %s )", false, false, anyPolicy}, {"export X=$( %s )", false, false, anyPolicy},
	{"sudo %s", true, true, anyPolicy}, {"sudo -u root %s", true, true, anyPolicy}, {"env A=1 %s", true, true, anyPolicy}, {"nice -n 1 %s", true, true, anyPolicy},
	{"nohup %s", true, true, anyPolicy}, {"timeout 5 %s", true, true, anyPolicy}, {"command %s", true, true, anyPolicy}, {"exec %s", true, true, anyPolicy},
	{"xargs %s", true, true, anyPolicy}, {"find . -exec %s \\;", true, true, anyPolicy},
	{"bash -c %q", false, true, anyPolicy}, {"sh -c %q", false, true, anyPolicy}, {"bash -c %Q", false, true, anyPolicy}, {"eval %Q", false, true, anyPolicy},
	{"echo %Q | xargs -0 bash -c", false, false, anyPolicy}, {"trap %Q EXIT", false, true, anyPolicy}, {"su -c %Q root", false, true, anyPolicy},
	{"watch %Q", false, true, anyPolicy}, {"builtin eval %Q", false, true, anyPolicy},
	// Launchers, and wrappers that change directory.
	{"flock /tmp/l %s", true, true, anyPolicy}, {"flock -n /tmp/l -c %Q", false, true, anyPolicy},
	{"chrt -f 10 %s", true, true, anyPolicy}, {"taskset -c 0 %s", true, true, anyPolicy},
	{"unshare -r %s", true, true, anyPolicy}, {"setpriv --no-new-privs %s", true, true, anyPolicy},
	{"nsenter -t 1 -m %s", true, true, anyPolicy}, {"chroot /srv %s", true, true, anyPolicy},
	{"script -qc %Q /dev/null", false, true, anyPolicy}, {"systemd-run --user %s", true, true, anyPolicy},
	{"ssh -p 22 host %Q", false, true, anyPolicy}, // ssh joins its words: quote the command line
	{"xargs -I{} %s", true, true, anyPolicy}, {"env -C /tmp %s", true, true, anyPolicy},
	{"sudo -D /tmp %s", true, true, anyPolicy}, {"su - -c %Q", false, true, anyPolicy},
	{"mapfile -C %Q -c 1 x < /dev/null", false, false, anyPolicy},
	// Scripts read from standard input.
	{"echo %Q | bash -", false, false, anyPolicy}, {"bash /dev/stdin <<< %Q", false, false, anyPolicy},
	{". /dev/fd/0 <<< %Q", false, false, anyPolicy},
	// Values bash evaluates: $( assembled from pieces.
	{`p='$'; c="a[${p}("%Q")]"; ls $((c))`, false, false, allowOnly},
	{`a='$'; b="${a}("%Q")"; ls ${b@P}`, false, false, allowOnly},
	{`p='$'; y="a[${p}("%Q")]"; [[ y -eq 0 ]]`, false, false, allowOnly},
	{`p='$'; y="a[${p}("%Q")]"; ls ${z[y]}`, false, false, allowOnly},
	// Nested subshells to a POSIX shell, arithmetic to bash.
	{"((%s))", false, false, shOnly},
	// Options that run a command line, program text, here-documents.
	{"tar -cf x --to-command=%q d", false, true, anyPolicy}, {"tar -I %q -cf x d", false, true, anyPolicy},
	{"tar -cf x --checkpoint-act=exec=%q d", false, true, anyPolicy}, {"rsync -e %q a h:b", false, true, anyPolicy},
	{"man -P %q ls", false, true, anyPolicy}, {"zip -T -TT %q a f", false, true, anyPolicy},
	{"go test -exec %q ./...", false, true, anyPolicy}, {"make X!=%q", false, true, anyPolicy},
	{"awk %a", false, true, anyPolicy}, {"sed %e f", false, true, anyPolicy},
	{"bash <<'EOF'\n%s\nEOF", false, false, anyPolicy}, {"sh <<< %q", false, false, anyPolicy},
	// Programs that run a program after their options, or through one.
	{"strace -f -o /dev/null %s", true, true, anyPolicy}, {"fakeroot %s", true, true, anyPolicy},
	{"prlimit --nofile=10 %s", true, true, anyPolicy}, {"numactl -N0 %s", true, true, anyPolicy},
	{"cgexec -g cpu:x %s", true, true, anyPolicy}, {"pkexec %s", true, true, anyPolicy}, {"toybox %s", true, true, anyPolicy},
	{"bwrap --ro-bind / / %s", true, true, anyPolicy}, {"firejail --net=none %s", true, true, anyPolicy},
	{"xvfb-run -a %s", true, true, anyPolicy}, {"dbus-run-session -- %s", true, true, anyPolicy},
	{"ssh-agent %s", true, true, anyPolicy}, {"perf stat -e cycles %s", true, true, anyPolicy},
	{"valgrind --tool=memcheck %s", true, true, anyPolicy}, {"ip netns exec ns %s", true, true, anyPolicy},
	{"runuser -u app -- %s", true, true, anyPolicy}, {"fd -x %s ;", true, true, anyPolicy},
	{"cmake -E env A=1 %s", true, true, anyPolicy}, {"faketime now %s", true, true, anyPolicy},
	{"capsh -- -c %q", false, true, anyPolicy}, {"sg grp -c %q", false, true, anyPolicy},
	{"split --filter=%q f", false, true, anyPolicy}, {"nc -c %q h 1", false, true, anyPolicy},
	{"hyperfine %q", false, true, anyPolicy}, {"entr -s %q", false, true, anyPolicy},
	{"perf stat --pre %q ls", false, true, anyPolicy}, {"dpkg --pre-invoke=%q -l", false, true, anyPolicy},
	{"apt-get -o APT::Update::Pre-Invoke::=%q update", false, true, anyPolicy}, {"gpg --photo-viewer %q -k", false, true, anyPolicy},
	{"hg --config hooks.pre-status=%q status", false, true, anyPolicy}, {`strace -o "|"%q ls`, false, true, anyPolicy},
}

// FuzzHiddenCommand hides a refused command in constructs chosen by the
// input, nested up to four deep, and checks that the policies refuse it,
// with bash and with sh as the agent's shell.
func FuzzHiddenCommand(f *testing.F) {
	f.Add([]byte{0, 0, 0})
	f.Add([]byte{3, 20, 32, 5})
	f.Add([]byte{8, 1, 15, 33, 2})
	f.Add([]byte{0, 68})
	f.Add([]byte{1, 70, 25})
	f.Add([]byte{0, 72, 80})
	f.Add([]byte{2, 78, 81})
	allowRules := `bash: {allow: ["ls *", "echo *", "cat *", "true", "sudo *", "env *", "nice *", "nohup *", "timeout *",
		"command *", "exec *", "time *", "xargs *", "find *", "bash *", "sh *", "su *", "watch *", "builtin *", "flock *",
		"chrt *", "taskset *", "unshare *", "setpriv *", "nsenter *", "chroot *", "script *", "systemd-run *", "ssh *",
		"mapfile *", "[[ *", "tar *", "rsync *", "man *", "zip *", "go test *", "make *", "awk *", "sed *",
		"strace *", "fakeroot *", "prlimit *", "numactl *", "cgexec *", "pkexec *", "toybox *", "bwrap *", "firejail *",
		"xvfb-run *", "dbus-run-session *", "ssh-agent *", "perf *", "valgrind *", "ip *", "runuser *", "fd *", "cmake *",
		"faketime *", "capsh *", "sg *", "split *", "nc *", "hyperfine *", "entr *", "dpkg *", "apt-get *", "gpg *", "hg *"]}`
	denyRules := `bash: {deny: ["rm *"]}`
	sh := testEnv()
	sh.Shell = "/bin/sh"
	policies := []struct {
		p        *Policy
		sh, deny bool
	}{
		{mustParse(f, allowRules), false, false}, {mustParse(f, denyRules), false, true},
		{mustParseEnv(f, allowRules, sh), true, false}, {mustParseEnv(f, denyRules, sh), true, true},
	}
	f.Fuzz(func(t *testing.T, choice []byte) {
		if len(choice) == 0 || len(choice) > 5 {
			return
		}
		line, simple := hiddenSpellings[int(choice[0])%len(hiddenSpellings)], true
		scopes := map[hiderScope]bool{}
		for _, c := range choice[1:] {
			h := hiders[int(c)%len(hiders)]
			// Wrappers need a simple command; bash reads what only a
			// POSIX shell runs as arithmetic.
			if h.wraps && !simple || scopes[shOnly] && (strings.Contains(h.template, "bash ") || strings.HasPrefix(h.template, "capsh ")) {
				continue
			}
			if strings.Contains(h.template, "%e") && strings.Contains(line, "\n") {
				continue // sed's e runs one line; the next is a sed command
			}
			line, simple = hide(h.template, line), h.simple
			scopes[h.scope] = true
		}
		for _, pol := range policies {
			if scopes[allowOnly] && pol.deny || scopes[shOnly] && !pol.sh {
				continue
			}
			if pol.p.CheckCommand(line, nil) == nil {
				t.Fatalf("policy (sh=%v, deny=%v) passed %q", pol.sh, pol.deny, line)
			}
		}
	})
}

// hide puts cmd into template: %s as it is, %q single-quoted, %Q
// double-quoted, %a as the command of an awk program's system(), %e as
// the command of a sed script's e.
func hide(template, cmd string) string {
	squote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	dq := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "$", `\$`, "`", "\\`").Replace(cmd) + `"`
	awk := squote(`BEGIN { system("` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(cmd) + `") }`)
	return strings.NewReplacer("%s", cmd, "%q", squote(cmd), "%Q", dq, "%a", awk, "%e", squote("1e "+cmd)).Replace(template)
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
		"bash:\n  allow:\n    - git *\n  deny: [git push *]\n", `{"skills": {"deny": ["x"]}}`, "bash: {allow: [~]}", "a: &x [1]\nb: *x",
		"callers:\n  - name: d\n    match: {client_id: [ci-*], groups: [a, b]}\n    tools: {allow: [read]}\n    paths: {allow: [/srv/**]}\n    bash: {deny: [rm *]}\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data, testEnv())
		if err != nil {
			return
		}
		want := 4
		if n := len(p.rules.Callers); n > 0 {
			want += n + 1
		}
		if len(p.Summary()) != want {
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
