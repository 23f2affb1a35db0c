package integration

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// TestClusterConfigMatchesAgentPermissions keeps the external-cluster
// example in deploy/ in step with the permissions the embedded server
// gives agents.
func TestClusterConfigMatchesAgentPermissions(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	t.Setenv("GATEWAY_PASSWORD", "gw-secret")
	t.Setenv("AGENT_PASSWORD", "agent-secret")
	opts, err := server.ProcessConfigFile("../deploy/nats/cluster-node.conf")
	if err != nil {
		t.Fatalf("deploy/nats/cluster-node.conf: %v", err)
	}
	users := map[string]*server.User{}
	for _, u := range opts.Users {
		users[u.Username] = u
	}
	if users["gateway"] == nil || users["gateway"].Password != "gw-secret" {
		t.Fatalf("gateway user missing or password not taken from the environment")
	}
	a := users["agent"]
	if a == nil || a.Password != "agent-secret" {
		t.Fatalf("agent user missing or password not taken from the environment")
	}
	want := gateway.AgentPermissions(time.Hour)
	if !reflect.DeepEqual(a.Permissions, want) {
		t.Fatalf("agent permissions in the example differ from the embedded server's:\n got %+v %+v %+v\nwant %+v %+v %+v",
			a.Permissions.Publish, a.Permissions.Subscribe, a.Permissions.Response, want.Publish, want.Subscribe, want.Response)
	}
}

// The gateway examples in deploy/ parse, and the systemd unit names the
// files they are installed as.
func TestGatewayExamplesParse(t *testing.T) {
	rules, err := gateway.LoadAccess("../deploy/gateway/access.yaml")
	if err != nil {
		t.Fatalf("deploy/gateway/access.yaml: %v", err)
	}
	if len(rules.Summary()) < 3 {
		t.Fatalf("access.yaml has only %d rules", len(rules.Summary()))
	}
	if _, err := gateway.LoadAPITokens("../deploy/gateway/api-tokens.yaml"); err != nil {
		t.Fatalf("deploy/gateway/api-tokens.yaml: %v", err)
	}
	unit, err := os.ReadFile("../deploy/systemd/fleet-gateway.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--access /etc/fleetmcp/access.yaml", "EnvironmentFile=/etc/fleetmcp/gateway.env", "--resource_url"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("fleet-gateway.service does not contain %q", want)
		}
	}
	env, err := os.ReadFile("../deploy/gateway/gateway.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"JWT_ISSUER=", "JWT_AUDIENCE="} {
		if !strings.Contains(string(env), want) {
			t.Errorf("gateway.env does not set %s", want)
		}
	}
}
