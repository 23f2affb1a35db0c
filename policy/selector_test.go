package policy

import (
	"errors"
	"path"
	"reflect"
	"strings"
	"testing"
)

func TestParseSelector(t *testing.T) {
	tests := []struct {
		in, canonical string
	}{
		{"*", "*"},
		{"web-*", "web-*"},
		{"web-?", "web-?"},
		{"env=staging", "env=staging"},
		{" env = staging ", "env=staging"},
		{"role=web, env=prod", "role=web,env=prod"},
		{"web-*,env=prod", "web-*,env=prod"},
		{"example.com/tier=gold*", "example.com/tier=gold*"},
		{"env=*", "env=*"},
		{"env!=prod", "env!=prod"},
		{"env != prod", "env!=prod"},
		{"env!=*", "env!=*"},
		{"region in (eu,us)", "region in (eu,us)"},
		{"region in(eu , us-*)", "region in (eu,us-*)"},
		{"region\tin\n( eu )", "region in (eu)"},
		{"region notin (eu,us)", "region notin (eu,us)"},
		{"web-*, region in (eu,us), env!=prod", "web-*,region in (eu,us),env!=prod"},
		{"in in (in)", "in in (in)"}, // keywords are only keywords after a key
		{"notin=in", "notin=in"},     // ... so they can be keys and values
		{"in", "in"},                 // ... and host names
		{"owner=ada@example.com", "owner=ada@example.com"},
		{"version=1.2.3+build", "version=1.2.3+build"},
		{"team=R&D", "team=R&D"},
		{"city=zürich", "city=zürich"},
		{"path=/srv/app", "path=/srv/app"},
		{"a=b,a=c", "a=b,a=c"}, // contradictory, but well formed
		{strings.Repeat("a", MaxSelectorLen), strings.Repeat("a", MaxSelectorLen)},
		{" " + strings.Repeat("a", MaxSelectorLen) + "   ", strings.Repeat("a", MaxSelectorLen)}, // spaces do not count
	}
	for _, tc := range tests {
		sel, err := ParseSelector(tc.in)
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tc.in, err)
			continue
		}
		if got := sel.String(); got != tc.canonical {
			t.Errorf("ParseSelector(%q).String() = %q, want %q", tc.in, got, tc.canonical)
		}
	}
}

func TestParseSelectorErrors(t *testing.T) {
	tests := []struct {
		in  string
		col int      // column the error points at; 0: none
		err []string // substrings of the error
	}{
		{"", 0, []string{"empty", "env=staging"}},
		{"   ", 0, []string{"empty"}},
		{"web-*,", 7, []string{"empty term", "extra ','"}},
		{",web-*", 1, []string{"empty term"}},
		{"a,,b", 3, []string{"empty term"}},
		{"=prod", 1, []string{"without a key", "env=staging"}},
		{"!=prod", 1, []string{"without a key"}},
		{"!env", 1, []string{"'!' must follow a label key", "key!=*"}},
		{"env=", 5, []string{`label "env" has no value`, "env=*"}},
		{"env= ,x", 6, []string{"no value"}},
		{"env=a=b", 6, []string{`'='`, `after the value "a"`}},
		{"env==prod", 5, []string{"'==' is not an operator", "env=value"}},
		{"env!prod", 4, []string{"'!' must be followed by '='", "env!=value"}},
		{"env=pr od", 8, []string{`unexpected "od" after the value "pr"`, "joined by ','"}},
		{"web.1", 4, []string{`"web.1"`, `"."`, "letters", "key=value"}},
		{"[ab]", 1, []string{`"["`}},
		{"en v=x", 4, []string{`unexpected "v" after "en"`, "key in (v1,v2)"}},
		{"web 1", 5, []string{`unexpected "1" after "web"`}},
		{"web(", 4, []string{`unexpected '(' after "web"`}},
		{"e:nv=x", 2, []string{`label key "e:nv" has ":"`, "'/'"}},
		{"region in eu", 11, []string{"expected '(' after \"in\"", "region in (v1,v2)"}},
		{"region in", 10, []string{"expected '('", "end of selector"}},
		{"region in ()", 12, []string{"empty list", "region in (a,b)"}},
		{"region in (eu,)", 15, []string{"empty value", "extra ','"}},
		{"region in (,eu)", 12, []string{"empty value"}},
		{"region in (eu,us", 11, []string{"'(' is never closed"}},
		{"region in (eu", 11, []string{"never closed"}},
		{"region notin (eu us)", 18, []string{`unexpected "us" after "eu"`, "close the list with ')'"}},
		{"region in (eu=x)", 14, []string{`unexpected '=' after "eu"`}},
		{"region in (e(u)", 13, []string{`unexpected '('`}},
		{"region in (eu) x", 16, []string{`unexpected "x"`, "joined by ','"}},
		{"region of (eu)", 8, []string{`unexpected "of" after "region"`}},
		{"env=a)", 6, []string{`unexpected ')'`}},
		{")", 1, []string{`unexpected ')'`}},
		{"zürich=x", 2, []string{`label key "zürich" has "ü"`}},
		{"city=zü\u0000", 8, []string{`has "\x00"`, "control characters"}},
		{"env=\u00a0x", 5, []string{"spaces"}},
		{"web-*,env=pr od", 14, []string{"column 14"}}, // columns count characters, 1-based
		{"é=x,é", 1, []string{"column 1"}},
		{"a\xffb", 0, []string{"UTF-8"}},
		{strings.Repeat("a", MaxSelectorLen+1), 0, []string{"1025 characters", "at most 1024"}},
		{strings.Repeat(" ", 4*MaxSelectorLen+1) + "a", 0, []string{"at most 1024"}},
	}
	for _, tc := range tests {
		sel, err := ParseSelector(tc.in)
		if err == nil {
			t.Errorf("ParseSelector(%q) = %q, want an error", tc.in, sel)
			continue
		}
		for _, w := range tc.err {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseSelector(%q) error %q does not mention %q", tc.in, err, w)
			}
		}
		var se *SelectorError
		switch {
		case tc.col == 0:
		case !errors.As(err, &se):
			t.Errorf("ParseSelector(%q) error %q is not a *SelectorError", tc.in, err)
		case se.Pos != tc.col:
			t.Errorf("ParseSelector(%q) error %q points at column %d, want %d", tc.in, err, se.Pos, tc.col)
		}
	}
}

func TestSelectorMatch(t *testing.T) {
	staging := map[string]string{"env": "staging", "role": "web", "region": "eu-west"}
	prod := map[string]string{"env": "prod", "role": "db", "region": "us-east"}
	tests := []struct {
		sel    string
		host   string
		labels map[string]string
		want   bool
	}{
		{"*", "anything", nil, true},
		{"web-*", "web-1", nil, true},
		{"web-*", "web-", nil, true},
		{"web-*", "db-1", nil, false},
		{"web-?", "web-10", nil, false},
		{"*-1", "db-1", nil, true},
		{"Web-1", "web-1", nil, false}, // names are case-sensitive
		{"env=staging", "web-1", staging, true},
		{"env=staging", "db-1", prod, false},
		{"env=staging", "bare", nil, false},
		{"env=*", "bare", nil, false}, // a label match needs the label
		{"env=*", "db-1", prod, true},
		{"env=stag*", "web-1", staging, true},
		{"env=Staging", "web-1", staging, false}, // values are case-sensitive
		{"env!=prod", "web-1", staging, true},
		{"env!=prod", "db-1", prod, false},
		{"env!=prod", "bare", nil, true}, // as in Kubernetes: no label, not equal
		{"env!=*", "bare", nil, true},
		{"env!=*", "web-1", staging, false},
		{"env!=pr*", "db-1", prod, false},
		{"region in (eu-*,ap-*)", "web-1", staging, true},
		{"region in (eu-*,ap-*)", "db-1", prod, false},
		{"region in (eu-*,ap-*)", "bare", nil, false},
		{"region in (us-east)", "db-1", prod, true},
		{"region notin (eu-*,ap-*)", "web-1", staging, false},
		{"region notin (eu-*,ap-*)", "db-1", prod, true},
		{"region notin (eu-*)", "bare", nil, true},
		{"role=web,env=staging", "web-1", staging, true},
		{"role=web,env=prod", "web-1", staging, false},
		{"web-*,env=prod", "web-1", staging, false},
		{"web-*,region in (eu-west,us-east),env!=prod", "web-1", staging, true},
		{"web-*,region in (eu-west,us-east),env!=prod", "web-2", prod, false},
		{"role=?b", "db-1", prod, true},
		{"city=z?rich", "x", map[string]string{"city": "zürich"}, true}, // ? is one character, not one byte
	}
	for _, tc := range tests {
		sel, err := ParseSelector(tc.sel)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", tc.sel, err)
		}
		if got := sel.Match(tc.host, tc.labels); got != tc.want {
			t.Errorf("%q.Match(%q, %v) = %v, want %v", tc.sel, tc.host, tc.labels, got, tc.want)
		}
	}
	if (Selector{}).Match("x", nil) {
		t.Error("the zero Selector matched a host")
	}
	if s := (Selector{}).String(); s != "" {
		t.Errorf("the zero Selector prints as %q", s)
	}
}

func TestSelectorAll(t *testing.T) {
	for in, want := range map[string]bool{
		"*": true, "**": true, "*,*": true, " * , * ": true,
		"web-*": false, "env=*": false, "?": false, "env!=x": false, "*,env!=*": false, "k notin (x)": false,
	} {
		sel, err := ParseSelector(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := sel.All(); got != want {
			t.Errorf("%q.All() = %v, want %v", in, got, want)
		}
	}
	if (Selector{}).All() {
		t.Error("the zero Selector claims to select every host")
	}
}

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"", "", true},
		{"", "a", false},
		{"*", "", true},
		{"*", "a/b", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"a*b", "ab", true},
		{"a*b", "abab", true},
		{"a*b", "abac", false},
		{"*@example.com", "ada@example.com", true},
		{"*@example.com", "ada@example.com.evil", false},
		{"?", "é", true},
		{"??", "é", false},
		{"é", "é", true},
		{"é?", "éé", true},
		{"*é", "aé", true},
		{"*é", "ae", false},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"**a", "bba", true},
		{"[a]", "[a]", true},
		{"a\\b", "a\\b", true},
		{"*?", "", false},
		{"*?", "x", true},
		{"x*y*z", strings.Repeat("x", 200) + "z", false},
	}
	for _, tc := range tests {
		if got := Glob(tc.pattern, tc.s); got != tc.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { Glob("web-*-?x*", "web-1234-5x67") }); n != 0 {
		t.Errorf("Glob allocates %v times per call, want 0", n)
	}
}

// FuzzParseSelector: parsing never panics; a parsed selector prints in a
// form that parses back to an equal selector, printed the same and
// matching the same hosts; name globs agree with path.Match wherever
// path.Match's syntax coincides with ours; errors point inside the text.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{
		"*", "web-*", "env=staging", "role=web,env=prod", "a?c", " x = y ", "=", ",", "web-*,env=pr*",
		"env!=prod", "region in (eu,us)", "region notin ( eu , us-* )", "k in (a", "k in ()", "!k", "a==b",
		"in in (in)", "x=é", "a,b,c", "k in (a),k notin (b),k!=c,k=d,e",
	} {
		f.Add(s, "web-1", "staging")
	}
	f.Fuzz(func(t *testing.T, s, host, label string) {
		sel, err := ParseSelector(s)
		if err != nil {
			var se *SelectorError
			if errors.As(err, &se) && (se.Pos < 0 || se.Pos > len([]rune(s))+1) {
				t.Fatalf("ParseSelector(%q): error points at column %d, outside the text: %v", s, se.Pos, err)
			}
			return
		}
		canon := sel.String()
		again, err := ParseSelector(canon)
		if err != nil {
			t.Fatalf("ParseSelector(%q).String() = %q does not parse: %v", s, canon, err)
		}
		if !reflect.DeepEqual(again, sel) {
			t.Fatalf("%q and its canonical form %q parse differently: %+v vs %+v", s, canon, sel, again)
		}
		if again.String() != canon {
			t.Fatalf("canonical form not stable: %q -> %q -> %q", s, canon, again.String())
		}
		labels := map[string]string{"env": label, "k": label}
		if sel.Match(host, labels) != again.Match(host, labels) {
			t.Fatalf("%q and its canonical form %q disagree on %q", s, canon, host)
		}
		if sel.All() && (!sel.Match(host, labels) || !sel.Match(host, nil)) {
			t.Fatalf("%q claims to select every host but does not select %q", s, host)
		}
		if len(sel.terms) == 1 && sel.terms[0].op == opName && !strings.ContainsAny(host, "/[\\") {
			want, err := path.Match(sel.terms[0].values[0], host)
			if err == nil && want != sel.Match(host, nil) {
				t.Fatalf("glob %q on %q: path.Match says %v, Selector says %v", sel.terms[0].values[0], host, want, !want)
			}
		}
		for _, tm := range sel.terms {
			if (tm.op == opNe || tm.op == opNotIn) && !sel.Match(host, nil) && len(sel.terms) == 1 {
				t.Fatalf("%q: a negated label match must select a host without the label", s)
			}
		}
	})
}
