package main

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/protocol"
)

func TestParseLabels(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
		err  string
	}{
		{"", map[string]string{}, ""},
		{"  ", map[string]string{}, ""},
		{"env=prod", map[string]string{"env": "prod"}, ""},
		{"env=prod, role=web", map[string]string{"env": "prod", "role": "web"}, ""},
		{"note=a=b,empty=", map[string]string{"note": "a=b", "empty": ""}, ""},
		{"team.io/owner=x", map[string]string{"team.io/owner": "x"}, ""},
		{"env", nil, "no '='"},
		{"env=prod,", nil, "no '='"},
		{"env=a,env=b", nil, "given twice"},
		{"=x", nil, "empty key"},
		{"e v=x", nil, "has ' '"},
		{"e\x00=x", nil, "has '\\x00'"},
		{"env=a\nb", nil, "control character"},
		{"k=\xff", nil, "not UTF-8"},
		{strings.Repeat("k", protocol.MaxLabelKeyLen+1) + "=v", nil, "at most"},
		{"k=" + strings.Repeat("v", protocol.MaxLabelValueLen+1), nil, "at most"},
	} {
		got, err := parseLabels(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseLabels(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("parseLabels(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	many := make([]string, protocol.MaxLabels+1)
	for i := range many {
		many[i] = "k" + strings.Repeat("x", i) + "=v"
	}
	if _, err := parseLabels(strings.Join(many, ",")); err == nil {
		t.Errorf("%d labels were taken; at most %d are allowed", len(many), protocol.MaxLabels)
	}
}

func TestParseLabelEdits(t *testing.T) {
	for _, tc := range []struct {
		in     []string
		set    map[string]string
		remove []string
		err    string
	}{
		{[]string{"env=prod"}, map[string]string{"env": "prod"}, nil, ""},
		{[]string{"tier-", "env=prod", "old-"}, map[string]string{"env": "prod"}, []string{"old", "tier"}, ""},
		{[]string{"a-=b"}, map[string]string{"a-": "b"}, nil, ""},  // "=" sets, even with a key ending in '-'
		{[]string{"a--"}, map[string]string{}, []string{"a-"}, ""}, // removes "a-"
		{[]string{"note=x,y"}, nil, nil, "has a ','"},
		{nil, nil, nil, "no label changes"},
		{[]string{"env"}, nil, nil, "neither key=value"},
		{[]string{"-"}, nil, nil, "empty key"},
		{[]string{"=v"}, nil, nil, "empty key"},
		{[]string{"env=a", "env-"}, nil, nil, "changed twice"},
		{[]string{"env=a", "env=b"}, nil, nil, "changed twice"},
		{[]string{"a,b=c"}, nil, nil, "has ','"},
		{[]string{"env=a\tb"}, nil, nil, "control character"},
	} {
		got, err := parseLabelEdits(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("parseLabelEdits(%q) = %+v, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !maps.Equal(got.Set, tc.set) || !slices.Equal(got.Remove, tc.remove) {
			t.Errorf("parseLabelEdits(%q) = %+v, %v; want set %v remove %v", tc.in, got, err, tc.set, tc.remove)
		}
	}
}

// FuzzParseLabels: whatever parseLabels takes is valid, and reads back
// the same when written with formatLabels.
func FuzzParseLabels(f *testing.F) {
	for _, s := range []string{"", "env=prod", "env=prod,role=web", "a=b=c", " a = b ", "a=,b=", "a", "=", ",", "k=\u00e9\u200b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		labels, err := parseLabels(s)
		if err != nil {
			return
		}
		checkLabels(t, labels)
		if len(labels) == 0 {
			return
		}
		again, err := parseLabels(formatLabels(labels))
		if err != nil || !maps.Equal(again, labels) {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, labels, formatLabels(labels), again, err)
		}
	})
}

// FuzzParseLabelEdits: every argument becomes exactly one change to a
// valid key, sets with valid values.
func FuzzParseLabelEdits(f *testing.F) {
	for _, s := range []string{"env=prod tier-", "a-=b a--", "x", "- =", "k=v k-", "k=\x7f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := strings.Split(s, " ")
		e, err := parseLabelEdits(args)
		if err != nil {
			return
		}
		if len(e.Set)+len(e.Remove) != len(args) {
			t.Fatalf("%q: %d arguments became %d sets and %d removals", args, len(args), len(e.Set), len(e.Remove))
		}
		checkLabels(t, e.Set)
		for _, k := range e.Remove {
			if _, both := e.Set[k]; both || checkLabelKey(k) != nil {
				t.Fatalf("%q: removes %q", args, k)
			}
		}
	})
}

func checkLabels(t *testing.T, labels map[string]string) {
	t.Helper()
	if err := protocol.ValidateLabels(labels); err != nil {
		t.Fatalf("%v: %v", labels, err)
	}
	for k, v := range labels {
		if k == "" || strings.ContainsAny(k, "=, \t\n") || !utf8.ValidString(k) || !utf8.ValidString(v) ||
			strings.IndexFunc(v, unicode.IsControl) >= 0 || strings.ContainsRune(v, ',') {
			t.Fatalf("label %q=%q was taken", k, v)
		}
	}
}
