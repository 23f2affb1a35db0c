package policy

import (
	"strings"
	"testing"
)

func TestValidateLabels(t *testing.T) {
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		labels map[string]string
		want   string // "" for accepted
	}{
		{map[string]string{"env": "prod", "role": "web", "k8s.io/zone": "eu-west-1a", "empty": ""}, ""},
		{nil, ""},
		{map[string]string{"": "x"}, "empty key"},
		{map[string]string{"e nv": "x"}, `label key "e nv" has " "`},
		{map[string]string{"env": "a b"}, "values cannot contain spaces"},
		{map[string]string{"env": "prod,role=db"}, `has ","`},
		{map[string]string{"env": "pr*d"}, `has "*"`},
		{map[string]string{"env": "pro?"}, `has "?"`},
		{map[string]string{"env": "x\x00"}, "control characters"},
		{map[string]string{strings.Repeat("k", MaxLabelKeyLen+1): "x"}, "at most 128"},
		{map[string]string{"env": strings.Repeat("v", MaxLabelValueLen+1)}, "at most 256"},
		{many, "at most 64"},
	} {
		err := ValidateLabels(tc.labels)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ValidateLabels(%v) = %v, want it accepted", tc.labels, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ValidateLabels(%.60v) = %v, want an error saying %q", tc.labels, err, tc.want)
		}
	}
}

// FuzzValidateLabels: a label ValidateLabels accepts can be named by a
// selector, and the selector key=value picks the host that has it.
func FuzzValidateLabels(f *testing.F) {
	for _, s := range [][2]string{{"env", "prod"}, {"k8s.io/zone", "eu-1"}, {"a", ""}, {"e", "x=y"}, {"é", "v"}, {"k", "ü"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, k, v string) {
		labels := map[string]string{k: v}
		if ValidateLabels(labels) != nil || v == "" {
			return
		}
		sel, err := ParseSelector(k + "=" + v)
		if err != nil {
			t.Fatalf("label %q=%q was accepted, but the selector naming it does not parse: %v", k, v, err)
		}
		if !sel.Match("host", labels) {
			t.Fatalf("selector %s=%s does not pick the host labelled so", k, v)
		}
	})
}
