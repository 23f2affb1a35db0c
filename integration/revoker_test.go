package integration

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestRevokerHoldsTheOperatorKey: on an external cluster whose revoker
// holds the operator signing key, the gateway runs without it, and a
// revoked host is still cut off within a second and refused from then
// on. Whoever holds the gateway's creds can ask the revoker nothing but
// to revoke keys the gateways revoked already: a junk key, every user
// ("*") or a time to come are refused. With that, nothing the gateway
// holds (its creds, the system user's, the agent signing key:
// TestAuditTrailRuntimeCredentialsCannotErase) can re-sign an account.
func TestRevokerHoldsTheOperatorKey(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Revoker: true, Agents: []string{}})
	if env.gwConfig.NATSOperatorSigningKeyFile != "" {
		t.Fatal("the gateway was given the operator signing key")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	creds, seed := env.Enrol("victim")
	live := watchConn(t, env.NATSURL(), creds.JWT, seed, creds.CAPEM)
	start := time.Now()
	if err := env.Gateway.RevokeAgent(ctx, "victim", "test"); err != nil {
		t.Fatal(err)
	}
	revokedWithin(t, env, live, start, creds, seed)

	gw, err := nats.Connect(env.NATSURL(), nats.UserCredentials(filepath.Join(env.setup, gateway.NATSSetupFiles.GatewayCreds)))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	junk, _ := nkeys.CreateUser()
	junkPub, _ := junk.PublicKey()
	gwPub := credsClaims(t, filepath.Join(env.setup, gateway.NATSSetupFiles.GatewayCreds)).Subject
	for name, keys := range map[string]map[string]int64{
		"the gateways' own user": {gwPub: time.Now().Unix()},
		"a key never revoked":    {junkPub: time.Now().Unix()},
		"every user":             {"*": time.Now().Unix()},
		"a time to come":         {publicOf(t, seed): time.Now().Add(time.Hour).Unix()},
	} {
		data, _ := json.Marshal(protocol.RevokerRequest{Keys: keys})
		msg, err := gw.Request(protocol.RevokerSubject(), data, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var ans protocol.RevokerAnswer
		if err := json.Unmarshal(msg.Data, &ans); err != nil || ans.Error == "" || ans.Added != 0 {
			t.Errorf("the revoker took %s: %s", name, msg.Data)
		}
	}
	// The gateway's own users are still in.
	env.StartAgent("alpha", nil)
	env.WaitHost("alpha", true)
	cs := env.Client("", nil)
	if out := mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo still here"})); !strings.Contains(out, "still here") {
		t.Errorf("bash after the refused requests: %q", out)
	}
}
