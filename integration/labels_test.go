package integration

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestLabelGrammarGateway runs the label table every caller of the label
// grammar shares (protocol/testdata/labels.json; fleetctl, the agent and
// selectors run it in their own tests) through a running gateway: a join
// token with the label, and the label set on an enrolled host. The
// gateway accepts exactly the labels the others accept, and refuses the
// rest with the same reason.
func TestLabelGrammarGateway(t *testing.T) {
	data, err := os.ReadFile("../protocol/testdata/labels.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct{ Label, Error string }
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	env := NewEnv(t)
	ctx := context.Background()
	for _, tc := range cases {
		k, v, _ := strings.Cut(tc.Label, "=")
		labels := map[string]string{k: v}
		_, tokErr := env.Gateway.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Labels: labels}, "test")
		_, setErr := env.Gateway.SetAgentLabels(ctx, "alpha", labels, nil)
		for name, err := range map[string]error{"CreateJoinToken": tokErr, "SetAgentLabels": setErr} {
			switch {
			case tc.Error == "" && err != nil:
				t.Errorf("%s with %q: %v, want it accepted", name, tc.Label, err)
			case tc.Error != "" && (err == nil || !strings.Contains(err.Error(), tc.Error)):
				t.Errorf("%s with %.60q: %v, want an error saying %q", name, tc.Label, err, tc.Error)
			}
		}
	}
}
