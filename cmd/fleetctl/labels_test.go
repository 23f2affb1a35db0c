package main

import (
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestLabelGrammarTable runs the label table every caller of the
// grammar shares (protocol/testdata/labels.json) through both ways
// fleetctl takes labels: token create --labels and agent label.
func TestLabelGrammarTable(t *testing.T) {
	data, err := os.ReadFile("../../protocol/testdata/labels.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct{ Label, Error string }
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		_, tokErr := tokenRequest(tc.Label, time.Hour, 1, "", "", "")
		_, editErr := parseLabelEdits([]string{tc.Label})
		for name, err := range map[string]error{"token create --labels": tokErr, "agent label": editErr} {
			switch {
			case tc.Error == "" && err != nil:
				t.Errorf("%s %q: %v, want it accepted", name, tc.Label, err)
			case tc.Error != "" && (err == nil || !strings.Contains(err.Error(), tc.Error)):
				t.Errorf("%s %.60q: %v, want an error saying %q", name, tc.Label, err, tc.Error)
			}
		}
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
		{[]string{"note=x,y"}, nil, nil, "has ','"},
		{[]string{"tier=gold*"}, nil, nil, "has '*'"},
		{[]string{"note=a=b"}, nil, nil, "has '='"},
		{nil, nil, nil, "no label changes"},
		{[]string{"env"}, nil, nil, "neither key=value"},
		{[]string{"-"}, nil, nil, "empty key"},
		{[]string{"=v"}, nil, nil, "empty key"},
		{[]string{"env=a", "env-"}, nil, nil, "changed twice"},
		{[]string{"env=a", "env=b"}, nil, nil, "changed twice"},
		{[]string{"a,b=c"}, nil, nil, "has ','"},
		{[]string{"env=a\tb"}, nil, nil, "has '\\t'"},
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
			if _, both := e.Set[k]; both || protocol.ValidateLabelKey(k) != nil {
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
		if k == "" || strings.ContainsAny(k+v, ",=!()*? \t\n") || !utf8.ValidString(k) || !utf8.ValidString(v) ||
			strings.IndexFunc(v, unicode.IsControl) >= 0 {
			t.Fatalf("label %q=%q was taken", k, v)
		}
	}
}
