package gateway

import (
	"path"
	"strings"
	"testing"
)

func TestParseSelector(t *testing.T) {
	tests := []struct {
		in, canonical string
		err           []string // substrings of the error; none: valid
	}{
		{in: "*", canonical: "*"},
		{in: "web-*", canonical: "web-*"},
		{in: "web-?", canonical: "web-?"},
		{in: "env=staging", canonical: "env=staging"},
		{in: " env = staging ", canonical: "env=staging"},
		{in: "role=web, env=prod", canonical: "role=web,env=prod"},
		{in: "web-*,env=prod", canonical: "web-*,env=prod"},
		{in: "example.com/tier=gold*", canonical: "example.com/tier=gold*"},
		{in: "env=*", canonical: "env=*"},
		{in: "", err: []string{"empty", "env=staging"}},
		{in: "   ", err: []string{"empty"}},
		{in: "web-*,", err: []string{"empty term"}},
		{in: "=prod", err: []string{"no key"}},
		{in: "env=", err: []string{"no value", "key=*"}},
		{in: "env=a=b", err: []string{"more than one '='"}},
		{in: "web.1", err: []string{`"web.1"`, `"."`, "letters"}},
		{in: "[ab]", err: []string{`"["`}},
		{in: "en v=x", err: []string{`label key "en v"`}},
		{in: strings.Repeat("a", 300), err: []string{"300 characters", "at most 256"}},
	}
	for _, tc := range tests {
		sel, err := ParseSelector(tc.in)
		if len(tc.err) > 0 {
			if err == nil {
				t.Errorf("ParseSelector(%q) = %v, want an error", tc.in, sel)
				continue
			}
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("ParseSelector(%q) error %q does not mention %q", tc.in, err, w)
				}
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tc.in, err)
			continue
		}
		if got := sel.String(); got != tc.canonical {
			t.Errorf("ParseSelector(%q).String() = %q, want %q", tc.in, got, tc.canonical)
		}
	}
}

func TestSelectorMatch(t *testing.T) {
	staging := map[string]string{"env": "staging", "role": "web"}
	prod := map[string]string{"env": "prod", "role": "db"}
	tests := []struct {
		sel    string
		name   string
		labels map[string]string
		want   bool
	}{
		{"*", "anything", nil, true},
		{"web-*", "web-1", nil, true},
		{"web-*", "web-", nil, true},
		{"web-*", "db-1", nil, false},
		{"web-?", "web-10", nil, false},
		{"*-1", "db-1", nil, true},
		{"env=staging", "web-1", staging, true},
		{"env=staging", "db-1", prod, false},
		{"env=staging", "bare", nil, false},
		{"env=*", "bare", nil, false}, // a label glob needs the label
		{"env=*", "db-1", prod, true},
		{"env=stag*", "web-1", staging, true},
		{"role=web,env=staging", "web-1", staging, true},
		{"role=web,env=prod", "web-1", staging, false},
		{"web-*,env=prod", "web-1", staging, false},
		{"Web-1", "web-1", nil, false}, // names are case-sensitive
	}
	for _, tc := range tests {
		sel, err := ParseSelector(tc.sel)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", tc.sel, err)
		}
		if got := sel.Match(tc.name, tc.labels); got != tc.want {
			t.Errorf("%q.Match(%q, %v) = %v, want %v", tc.sel, tc.name, tc.labels, got, tc.want)
		}
	}
	if (Selector{}).Match("x", nil) {
		t.Error("the zero Selector matched a host")
	}
}

func TestSelectorAll(t *testing.T) {
	for in, want := range map[string]bool{"*": true, "**": true, "*,*": true, "web-*": false, "env=*": false, "?": false} {
		sel, err := ParseSelector(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := sel.All(); got != want {
			t.Errorf("%q.All() = %v, want %v", in, got, want)
		}
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
		{"*@example.com", "ada@example.com", true},
		{"*@example.com", "ada@example.com.evil", false},
		{"?", "é", true},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"**a", "bba", true},
		{"[a]", "[a]", true},
		{"a\\b", "a\\b", true},
	}
	for _, tc := range tests {
		if got := Glob(tc.pattern, tc.s); got != tc.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}

// FuzzSelector: parsing never panics; a parsed selector prints in a form
// that parses back to the same selector; host-name globs agree with
// path.Match wherever path.Match's syntax coincides with ours.
func FuzzSelector(f *testing.F) {
	for _, s := range []string{"*", "web-*", "env=staging", "role=web,env=prod", "a?c", " x = y ", "=", ",", "web-*,env=pr*"} {
		f.Add(s, "web-1", "staging")
	}
	f.Fuzz(func(t *testing.T, s, name, label string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		again, err := ParseSelector(sel.String())
		if err != nil {
			t.Fatalf("ParseSelector(%q).String() = %q does not parse: %v", s, sel.String(), err)
		}
		if again.String() != sel.String() {
			t.Fatalf("canonical form not stable: %q -> %q -> %q", s, sel.String(), again.String())
		}
		labels := map[string]string{"env": label}
		if sel.Match(name, labels) != again.Match(name, labels) {
			t.Fatalf("%q and its canonical form %q disagree on %q", s, sel.String(), name)
		}
		if sel.All() && !sel.Match(name, labels) {
			t.Fatalf("%q claims to select every host but does not select %q", s, name)
		}
		if len(sel.terms) == 1 && sel.terms[0].key == "" && !strings.ContainsAny(name, "/[\\") {
			want, err := path.Match(sel.terms[0].pattern, name)
			if err == nil && want != sel.Match(name, nil) {
				t.Fatalf("glob %q on %q: path.Match says %v, Selector says %v", sel.terms[0].pattern, name, want, !want)
			}
		}
	})
}
