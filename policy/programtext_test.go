package policy

import (
	"slices"
	"strings"
	"testing"
)

func TestScanAwk(t *testing.T) {
	for _, tc := range []struct {
		src              string
		commands, writes []string // "?" for a text the scanner cannot know
		reads            []string
		err              bool
	}{
		{src: `{ print $1 }`},
		{src: `BEGIN { system("id") }`, commands: []string{"id"}},
		{src: `BEGIN { system ("a \"b\" \\ \101") }`, commands: []string{`a "b" \ A`}},
		{src: `{ system($0) }`, commands: []string{"?"}},
		{src: `{ system("rm " $1) }`, commands: []string{"?"}},
		{src: `{ print | "sort -u" }`, commands: []string{"sort -u"}},
		{src: `{ print $1 | "sort" "x" }`, commands: []string{"?"}},
		{src: `{ print |& "sh" }`, commands: []string{"sh"}},
		{src: `BEGIN { "date" | getline d }`, commands: []string{"date"}},
		{src: `BEGIN { x "date" | getline d }`, commands: []string{"?"}},
		{src: `BEGIN { c | getline }`, commands: []string{"?"}},
		{src: `$1 || $2 { print }`},
		{src: `/a|b/ { print }`},
		{src: `{ print > "out" }`, writes: []string{"out"}},
		{src: `{ print $1, $2 >> "/tmp/x"; next }`, writes: []string{"/tmp/x"}},
		{src: `{ printf("%s", $0) > f }`, writes: []string{"?"}},
		{src: `{ if ($1 > 2) print }`},
		{src: `{ print ($1 > 2) }`},
		{src: `{ x = $1 > 2 ? "a" : "b" }`},
		{src: `BEGIN { getline l < "f" }`, reads: []string{"f"}},
		{src: `BEGIN { while ((getline l < ARGV[1]) > 0) n++ }`, reads: []string{"?"}},
		{src: `BEGIN { getline a[1] < "/inet/tcp/0/h/80" }`, reads: []string{"/inet/tcp/0/h/80"}},
		{src: `BEGIN { x = 1 < 2 }`},
		{src: `# system("id")` + "\n{ print }"},
		{src: `{ print "system(\"id\")" }`},
		{src: `/system/ { print }`},
		{src: `{ a = b / c / d; system("id") }`, commands: []string{"id"}},
		{src: `{ a = b /c/ d }`},
		{src: `{ n = NF / 2 }`},
		{src: `{ x = a[1] / 2 }`},
		{src: `{ x /= 2 }`},
		{src: "{ print \\\n > \"f\" }", writes: []string{"f"}},
		{src: "BEGIN { if (1) /\"/; system(\"id\") # \"\n}", commands: []string{"id"}},
		{src: `BEGIN { while (x) /"/; system("id") }`, commands: []string{"id"}},
		{src: `BEGIN { x = (1) / 2; y = (2) / 3 }`},
		{src: `{ x = i++ / 2 }`, err: true},
		{src: `{ getline / 2 }`, err: true},
		{src: `/[/]/ { print }`, err: true},
		{src: `{ print "x }`, err: true},
		{src: `/abc`, err: true},
		{src: `{ a & b }`, err: true},
	} {
		prog, err := scanAwk(tc.src)
		if (err != nil) != tc.err {
			t.Errorf("scanAwk(%q): error %v, want error %v", tc.src, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		for _, c := range []struct {
			name string
			got  []awkText
			want []string
		}{{"commands", prog.commands, tc.commands}, {"writes", prog.writes, tc.writes}, {"reads", prog.reads, tc.reads}} {
			var got []string
			for _, x := range c.got {
				if x.known {
					got = append(got, x.text)
				} else {
					got = append(got, "?")
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("scanAwk(%q) %s = %q, want %q", tc.src, c.name, got, c.want)
			}
		}
	}
}

func TestScanAwkDirectives(t *testing.T) {
	prog, err := scanAwk(`@load "x"; @include "y.awk"; @namespace "n"; BEGIN { f = "system"; @f("id") }`)
	if err != nil {
		t.Fatal(err)
	}
	if !prog.load || len(prog.includes) != 1 || prog.dynamic == "" {
		t.Errorf("got %+v, want @load, one @include and an indirect call", prog)
	}
}

func TestParseSed(t *testing.T) {
	for _, tc := range []struct {
		src      string
		commands []string
		writes   []string
		execs    bool
		err      bool
	}{
		{src: `s/a/b/g`},
		{src: `1e id`, commands: []string{"id"}},
		{src: "/x/{\ne ls -l\np\n}", commands: []string{"ls -l"}},
		{src: `e`, execs: true},
		{src: `$!N; e`, execs: true},
		{src: `s/.*/id/e`, execs: true},
		{src: `s/a/b/gpe`, execs: true},
		{src: `s/a/b/w out`, writes: []string{"out"}},
		{src: `s/a/b/;w /tmp/x; p`, writes: []string{"/tmp/x; p"}},
		{src: `W out`, writes: []string{"out"}},
		{src: "a e id\ns/x/y/", commands: nil},
		{src: "1i\\\n  e id\np"},
		{src: "a\\\ntext \\\ne id\np"},
		{src: `r /etc/passwd`},
		{src: `:a;N;$!ba;s/\n/ /g`},
		{src: `:a;e id`, commands: []string{"id"}},
		{src: `b end; e id`, commands: []string{"id"}},
		{src: `y/abc/xyz/`},
		{src: `s|/a|/b|`},
		{src: `s/x/[/`},
		{src: `s/[a-z]/x/`},
		{src: `\,a,d`},
		{src: `0,/x/d`},
		{src: `1~3d;2,+4p;5,~2d`},
		{src: `/x/I,/y/Mp`},
		{src: `/x/!{p;d}`},
		{src: `#n` + "\np"},
		{src: `l 5;q 1;Q`},
		{src: `s/a/b/ # comment`},
		{src: `s/[/]/x/`, err: true},
		{src: `/[/]/d`, err: true},
		{src: `k`, err: true},
		{src: `s/a/b`, err: true},
		{src: `p x`, err: true},
		{src: `{p`, err: true},
		{src: `}`, err: true},
		{src: `1,`, err: true},
		{src: "s/a\n/b/", err: true},
	} {
		sc, err := parseSed(tc.src)
		if (err != nil) != tc.err {
			t.Errorf("parseSed(%q): error %v, want error %v", tc.src, err, tc.err)
			continue
		}
		if err != nil {
			continue
		}
		if !slices.Equal(sc.commands, tc.commands) || !slices.Equal(sc.writes, tc.writes) || sc.execs != tc.execs {
			t.Errorf("parseSed(%q) = %+v, want commands %q writes %q execs %v", tc.src, sc, tc.commands, tc.writes, tc.execs)
		}
	}
}

func TestXargsItems(t *testing.T) {
	for _, tc := range []struct {
		in    string
		lines bool
		want  []string
		bad   bool
	}{
		{in: "a b\nc\n", want: []string{"a", "b", "c"}},
		{in: `'a b' "c d" e\ f`, want: []string{"a b", "c d", "e f"}},
		{in: `a"b c"d`, want: []string{"ab cd"}},
		{in: "  \n\t\n", want: nil},
		{in: "'a\nb'", bad: true},
		{in: `"a`, bad: true},
		{in: "  a b\n c d \n", lines: true, want: []string{"a b", "c d "}},
		{in: "'x y' z\n", lines: true, want: []string{"x y z"}},
	} {
		got, ok := xargsItems(tc.in, tc.lines)
		if ok == tc.bad || !slices.Equal(got, tc.want) {
			t.Errorf("xargsItems(%q, %v) = %q, %v; want %q, %v", tc.in, tc.lines, got, ok, tc.want, !tc.bad)
		}
	}
}

func TestPatternOptions(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		longs   []string
		shorts  string
	}{
		{"journalctl *--vacuum*", []string{"vacuum"}, ""},
		{"sort *-o*", nil, "o"},
		{"x * -o *--output=* --", []string{"output"}, "o"},
		{"find *-exec*", nil, ""},
		{"git -* push *", nil, ""},
		{"git -c*", nil, "c"},
		{"tar --to-command*", []string{"to-command"}, ""},
	} {
		po := patternOptions(tc.pattern)
		if !slices.Equal(po.longs, tc.longs) || po.shorts != tc.shorts {
			t.Errorf("patternOptions(%q) = %+v, want %q %q", tc.pattern, po, tc.longs, tc.shorts)
		}
	}
}

// FuzzScanAwk: the lexer never panics, and a call to system after a
// program it can read is always found, whatever the program before it.
func FuzzScanAwk(f *testing.F) {
	for _, s := range []string{`{ print $1 }`, `BEGIN { x = "a\"b" }`, `/a\/b/ { n++ }`, `{ a = b / c }`, "# c\n",
		`{ print > "f" }`, `{ "x" | getline }`, `a[1] / 2`, "\\", `{ print "`, "/[/]/", `@load "x"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		if _, err := lexAwk(src); err != nil {
			return
		}
		prog, err := scanAwk(src + "\nBEGIN { system(\"id\") }")
		if err == nil && len(prog.commands) == 0 {
			t.Fatalf("system() after %q not found", src)
		}
	})
}

// FuzzParseSed: the parser never panics, and an e command hidden in a
// construct chosen by the input is found.
func FuzzParseSed(f *testing.F) {
	f.Add("s/a/b/", byte(0), byte(1))
	f.Add("1d", byte(3), byte(7))
	f.Add("", byte(9), byte(2))
	// A file name or command runs to the end of its line: what follows
	// the hidden command starts on a new one.
	wraps := []string{"%s", "1{%s\n}", "/re/!{\n%s\n}", "$!N;%s", ":a\n%s\nta", "s/a/b/g;%s", "y/ab/cd/;%s",
		"/x/,/y/{%s\n}", "1~2{ %s\n;}", "0,/x/{%s\n}", `\,x,{` + "%s\n}", "#c\n%s", "a text\n%s", "i\\\nline\n%s",
		"b x;%s", "s|/|x|;%s", "r f\n%s", "$!{%s\n}", "/a\\/b/{\n%s\n}"}
	hidden := []string{"e id", "s/x/id/e", "w /tmp/x", "s/x/y/w /tmp/x", "1e id", "W /tmp/x"}
	f.Fuzz(func(t *testing.T, prefix string, w, h byte) {
		parseSed(prefix)
		script := hidden[int(h)%len(hidden)]
		for i := 0; i < 3; i++ {
			script = strings.Replace(wraps[(int(w)+i*int(h))%len(wraps)], "%s", script, 1)
		}
		sc, err := parseSed(script)
		if err != nil {
			t.Fatalf("parseSed(%q): %v", script, err)
		}
		if len(sc.commands) == 0 && !sc.execs && len(sc.writes) == 0 {
			t.Fatalf("parseSed(%q) found nothing", script)
		}
	})
}

// FuzzXargsItems: input without quotes or backslashes splits into the
// fields strings.Fields finds.
func FuzzXargsItems(f *testing.F) {
	for _, s := range []string{"a b\nc", "'a b'", `"x`, "\\\n", " \t "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		items, ok := xargsItems(in, false)
		xargsItems(in, true)
		if strings.ContainsAny(in, `'"\`) {
			return
		}
		want := strings.FieldsFunc(in, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' })
		if !ok || !slices.Equal(items, want) {
			t.Fatalf("xargsItems(%q) = %q, %v; want %q", in, items, ok, want)
		}
	})
}

// FuzzDenyAbbreviations: a deny rule naming a long option refuses every
// prefix of it, with or without a value, and a clustered short option;
// an option that is neither a prefix of it nor starts with it passes.
func FuzzDenyAbbreviations(f *testing.F) {
	f.Add("rotate", uint8(3), "other")
	f.Add("vacuum-size", uint8(8), "vacuum")
	f.Add("compress-program", uint8(1), "check")
	f.Fuzz(func(t *testing.T, name string, n uint8, other string) {
		if !optionName(name) || !optionName(other) {
			return
		}
		p := mustParse(t, `bash: {deny: ["prog *--`+name+`*", "prog *-Z*"]}`)
		prefix := name[:1+int(n)%len(name)]
		for _, line := range []string{"prog --" + prefix, "prog x --" + prefix + "=1 y", "prog --" + prefix + " v", "prog -abZ", "prog -aZc x"} {
			if p.CheckCommand(line, nil) == nil {
				t.Fatalf("deny rule for --%s passed %q", name, line)
			}
		}
		if !strings.HasPrefix(name, other) && !strings.HasPrefix(other, name) && !strings.Contains(other, "Z") {
			if err := p.CheckCommand("prog --"+other+" -abc", nil); err != nil {
				t.Fatalf("--%s refused by the rule for --%s: %v", other, name, err)
			}
		}
	})
}

func optionName(s string) bool {
	if s == "" || len(s) > 40 || !alnum(s[0]) {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") == ""
}
