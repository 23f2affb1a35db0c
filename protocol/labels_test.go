package protocol

import (
	"encoding/json"
	"maps"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

// labelCase is one row of testdata/labels.json, the table every caller
// of the label grammar (fleetctl, the gateway, the agent, selectors)
// runs: Label is key=value, Error what the refusal must say ("" for a
// label every caller accepts).
type labelCase struct {
	Label string `json:"label"`
	Error string `json:"error"`
}

func readLabelCases(t *testing.T) []labelCase {
	t.Helper()
	data, err := os.ReadFile("testdata/labels.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []labelCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatalf("testdata/labels.json: %v", err)
	}
	return cases
}

// TestLabelGrammarTable runs the shared table through ValidateLabels and
// ParseLabels.
func TestLabelGrammarTable(t *testing.T) {
	for _, tc := range readLabelCases(t) {
		k, v, _ := strings.Cut(tc.Label, "=")
		for name, err := range map[string]error{
			"ValidateLabels": ValidateLabels(map[string]string{k: v}),
			"ParseLabels":    func() error { _, err := ParseLabels(tc.Label); return err }(),
		} {
			switch {
			case tc.Error == "" && err != nil:
				t.Errorf("%s(%q) = %v, want it accepted", name, tc.Label, err)
			case tc.Error != "" && (err == nil || !strings.Contains(err.Error(), tc.Error)):
				t.Errorf("%s(%.60q) = %v, want an error saying %q", name, tc.Label, err, tc.Error)
			}
		}
	}
}

func TestParseLabels(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
		err  string
	}{
		{"", map[string]string{}, ""},
		{"  ", map[string]string{}, ""},
		{"env=prod", map[string]string{"env": "prod"}, ""},
		{" env = prod , role=web ", map[string]string{"env": "prod", "role": "web"}, ""},
		{"a=,b=", map[string]string{"a": "", "b": ""}, ""},
		{"env", nil, "no '='"},
		{"env=prod,", nil, "no '='"},
		{"env=a,env=b", nil, "given twice"},
		{"k=\xff", nil, "not UTF-8"},
		{"k\xff=v", nil, "not UTF-8"},
	} {
		got, err := ParseLabels(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseLabels(%q) = %v, %v; want an error saying %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("ParseLabels(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	many := make([]string, MaxLabels+1)
	for i := range many {
		many[i] = "k" + strings.Repeat("x", i) + "=v"
	}
	if _, err := ParseLabels(strings.Join(many, ",")); err == nil || !strings.Contains(err.Error(), "at most 64") {
		t.Errorf("%d labels: %v, want them refused", len(many), err)
	}
}

// TestLabelErrorsSayWhatIsAllowed: a refusal names the grammar it broke.
func TestLabelErrorsSayWhatIsAllowed(t *testing.T) {
	if err := ValidateLabelKey("a b"); err == nil || !strings.Contains(err.Error(), LabelKeyGrammar) {
		t.Errorf("ValidateLabelKey(%q) = %v, want it to say %q", "a b", err, LabelKeyGrammar)
	}
	if err := ValidateLabelValue("tier", "gold*"); err == nil || !strings.Contains(err.Error(), LabelValueGrammar) || !strings.Contains(err.Error(), "glob") {
		t.Errorf("ValidateLabelValue(tier, gold*) = %v, want it to say %q and why", err, LabelValueGrammar)
	}
	// Only the map form can hold a ',' in a value: the text form splits there.
	if err := ValidateLabels(map[string]string{"note": "a,b"}); err == nil || !strings.Contains(err.Error(), "has ','") {
		t.Errorf("ValidateLabels(note=a,b) = %v, want it refused for its ','", err)
	}
}

// FuzzParseLabels: what ParseLabels takes holds to the grammar, and
// FormatLabels writes it back to text that parses to the same labels.
func FuzzParseLabels(f *testing.F) {
	for _, s := range []string{"", "env=prod", "env=prod,role=web", "a=b=c", " a = b ", "a=,b=", "a", "=", ",", "k=\u00e9\u200b", "tier=gold*"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		labels, err := ParseLabels(s)
		if err != nil {
			return
		}
		if err := ValidateLabels(labels); err != nil {
			t.Fatalf("ParseLabels(%q) = %v, which ValidateLabels refuses: %v", s, labels, err)
		}
		for k, v := range labels {
			if !utf8.ValidString(k+v) || strings.ContainsAny(k+v, ",=!()*? \t\r\n") {
				t.Fatalf("ParseLabels(%q) took %q=%q", s, k, v)
			}
		}
		again, err := ParseLabels(FormatLabels(labels))
		if err != nil || !maps.Equal(again, labels) {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, labels, FormatLabels(labels), again, err)
		}
	})
}
