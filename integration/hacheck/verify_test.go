package hacheck

import (
	"strings"
	"testing"
)

// TestCheckEnrolments: the join token's count must cover every
// enrolment stored, the acknowledged ones and those whose answer was
// lost; a refusal of a host that is enrolled is a problem, a lost answer
// is not.
func TestCheckEnrolments(t *testing.T) {
	h := &History{RunID: "r"}
	for _, op := range []Op{
		{Kind: "enrol", Host: "r-e0", Outcome: OK},
		{Kind: "enrol", Host: "r-e1", Outcome: OK},
		{Kind: "enrol", Host: "r-e2", Outcome: Failed}, // answer lost, stored
		{Kind: "enrol", Host: "r-e3", Outcome: Failed}, // answer lost, not stored
		{Kind: "enrol", Host: "r-e4", Outcome: ToolError},
	} {
		h.add(op)
	}
	stored := []string{"r-e0", "r-e1", "r-e2"}
	for _, tc := range []struct {
		name    string
		agents  []string
		used    int
		problem string
	}{
		{"every stored enrolment counted", stored, 3, ""},
		{"the lost answer's use counted too", stored, 4, ""},
		{"a stored enrolment's use given back", stored, 2, "the history allows 3 to 4"},
		{"a refused enrolment stored", append(stored, "r-e4"), 3, "refused yet enrolled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Verify(h, &State{Agents: tc.agents, TokenUsed: tc.used}, nil)
			if tc.problem == "" {
				if !r.OK() {
					t.Fatalf("problems found:\n%s", r)
				}
				return
			}
			if r.OK() || !strings.Contains(r.String(), tc.problem) {
				t.Fatalf("want a problem saying %q, got OK=%v:\n%s", tc.problem, r.OK(), r)
			}
		})
	}
}
