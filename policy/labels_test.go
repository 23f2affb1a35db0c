package policy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestLabelGrammarSelectors runs the label table every caller of the
// grammar shares (protocol/testdata/labels.json): a selector can name
// each label the grammar accepts, and key=value picks the host so
// labelled and not one whose value differs.
func TestLabelGrammarSelectors(t *testing.T) {
	data, err := os.ReadFile("../protocol/testdata/labels.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct{ Label, Error string }
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		k, v, _ := strings.Cut(tc.Label, "=")
		if tc.Error != "" || v == "" {
			continue
		}
		checkSelectable(t, k, v)
	}
}

// FuzzLabelGrammarSelectors: a label protocol.ValidateLabels accepts can
// be named by a selector, and the selector key=value picks the host that
// has it.
func FuzzLabelGrammarSelectors(f *testing.F) {
	for _, s := range [][2]string{{"env", "prod"}, {"k8s.io/zone", "eu-1"}, {"a", ""}, {"e", "x=y"}, {"é", "v"}, {"k", "ü"}, {"k", "a*"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		if protocol.ValidateLabels(map[string]string{k: v}) != nil || v == "" {
			return
		}
		checkSelectable(t, k, v)
	})
}

func checkSelectable(t *testing.T, k, v string) {
	t.Helper()
	sel, err := ParseSelector(k + "=" + v)
	if err != nil {
		t.Fatalf("label %q=%q is valid, but the selector naming it does not parse: %v", k, v, err)
	}
	if !sel.Match("host", map[string]string{k: v}) {
		t.Fatalf("selector %s=%s does not pick the host labelled so", k, v)
	}
	if sel.Match("host", map[string]string{k: v + "x"}) {
		t.Fatalf("selector %s=%s picks a host whose %s is %sx", k, v, k, v)
	}
}
