package identity

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestLabelGrammarTable runs the label table every caller of the grammar
// shares (protocol/testdata/labels.json) through an enrolment file: the
// agent takes the labels the gateway gives and refuses the others.
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
		k, v, _ := strings.Cut(tc.Label, "=")
		e := enrolment("web-1")
		e.Labels = map[string]string{k: v}
		enc, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ParseEnrolment(enc)
		switch {
		case tc.Error == "" && err != nil:
			t.Errorf("an enrolment labelled %q: %v, want it accepted", tc.Label, err)
		case tc.Error != "" && (err == nil || !strings.Contains(err.Error(), tc.Error)):
			t.Errorf("an enrolment labelled %.60q: %v, want an error saying %q", tc.Label, err, tc.Error)
		}
	}
}
