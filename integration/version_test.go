package integration

import (
	"os/exec"
	"strings"
	"testing"
)

// The gateway's MCP server gives the version its --version prints, and
// the agent runs with the version fleet-agent --version prints.
func TestVersionsAgree(t *testing.T) {
	out, err := exec.Command(gatewayBinary(t), "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	want, ok := strings.CutPrefix(first, "fleet-gateway ")
	if !ok || want == "" || strings.Contains(want, "(devel)") {
		t.Fatalf("fleet-gateway --version printed %q", out)
	}
	gw := launchGatewayProcess(t, "")
	cs := gw.Client()
	if got := cs.InitializeResult().ServerInfo.Version; got != want {
		t.Errorf("the MCP server says version %q, fleet-gateway --version %q", got, want)
	}
	out, err = exec.Command(agentBinary(t), "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(out), "\n"); first != "fleet-agent "+want {
		t.Errorf("fleet-agent --version printed %q; want the gateway's version %s (one build)", first, want)
	}
}
