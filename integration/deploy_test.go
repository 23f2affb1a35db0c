package integration

import (
	"reflect"
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
