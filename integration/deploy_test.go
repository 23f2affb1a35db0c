package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// TestClusterConfigExample: deploy/nats/cluster-node.conf, with the
// include fleet-gateway nats-setup writes, puts a node in operator mode
// with a full resolver, TLS on the client and route listeners, and no
// user of its own (no shared agent user).
func TestClusterConfigExample(t *testing.T) {
	dir := t.TempDir()
	conf := clusterNodeConf(t, dir, "n1", 4222, 6222, []int{6222})
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("deploy/nats/cluster-node.conf: %v", err)
	}
	setup := filepath.Join(dir, "setup")
	op := opts.TrustedOperators
	switch {
	case len(op) != 1 || op[0].Subject != readPub(t, setup, gateway.NATSSetupFiles.OperatorJWT):
		t.Errorf("trusted operators %v, want the one nats-setup made", op)
	case opts.SystemAccount == "" || opts.SystemAccount != op[0].SystemAccount:
		t.Errorf("system account %q, operator's %q", opts.SystemAccount, op[0].SystemAccount)
	case opts.TLSConfig == nil || opts.Cluster.TLSConfig == nil:
		t.Errorf("TLS: clients %v, routes %v; want both", opts.TLSConfig != nil, opts.Cluster.TLSConfig != nil)
	case len(opts.Users) > 0 || len(opts.Nkeys) > 0:
		t.Errorf("the example defines users of its own: %d users, %d nkeys", len(opts.Users), len(opts.Nkeys))
	case !opts.JetStream:
		t.Error("JetStream is off")
	}
	if _, ok := opts.AccountResolver.(*server.DirAccResolver); !ok {
		t.Errorf("account resolver %T, want the full (directory) resolver", opts.AccountResolver)
	}
	text, _ := os.ReadFile("../deploy/nats/cluster-node.conf")
	if strings.Contains(string(text), "password") || strings.Contains(string(text), "user: agent") {
		t.Error("the example still has password users")
	}
}

// The gateway examples in deploy/ parse, and the systemd unit names the
// files they are installed as.
func TestGatewayExamplesParse(t *testing.T) {
	rules, err := access.LoadRules("../deploy/gateway/access.yaml")
	if err != nil {
		t.Fatalf("deploy/gateway/access.yaml: %v", err)
	}
	if len(rules.Summary()) < 3 {
		t.Fatalf("access.yaml has only %d rules", len(rules.Summary()))
	}
	if _, err := access.LoadAPITokens("../deploy/gateway/api-tokens.yaml"); err != nil {
		t.Fatalf("deploy/gateway/api-tokens.yaml: %v", err)
	}
	unit, err := os.ReadFile("../deploy/systemd/fleet-gateway.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"EnvironmentFile=/etc/fleetmcp/gateway.env", "$FLEET_GATEWAY_FLAGS", "--data_dir /var/lib/fleetmcp"} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("fleet-gateway.service does not contain %q", want)
		}
	}
	env, err := os.ReadFile("../deploy/gateway/gateway.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"FLEET_GATEWAY_FLAGS=", "--access /etc/fleetmcp/access.yaml", "--resource_url", "JWT_ISSUER=", "JWT_AUDIENCE="} {
		if !strings.Contains(string(env), want) {
			t.Errorf("gateway.env does not set %s", want)
		}
	}
}
