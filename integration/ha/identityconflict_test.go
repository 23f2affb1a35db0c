package ha

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/integration"
)

// TestCopiedIdentityInACluster: on a cluster of gateways, the agent on
// one node and a copy of its identity on another are a conflict that
// every gateway finds within 5 s (the servers' events and connection
// lists span the cluster); revoking through one clears it on all.
func TestCopiedIdentityInACluster(t *testing.T) {
	c := startGatewayCluster(t, 3, nil)
	creds, seed, err := integration.EnrolKey(t, c.gw(0), "split")
	if err != nil {
		t.Fatal(err)
	}
	dial := func(url string) *nats.Conn {
		return dialAgentCreds(t, url, "split", creds, seed, nats.MaxReconnects(0))
	}
	agent := dial(c.gw(0).NATSURL())
	hello, _ := json.Marshal(protocol.Announce{Host: "split", Instance: "i-1", Protocol: protocol.Version, HeartbeatMS: 1000, OS: "linux"})
	stop := make(chan struct{})
	defer close(stop)
	go func() { // heartbeats, as the agent sends them
		for {
			_ = agent.Publish(protocol.PresenceSubject("split"), hello)
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	for i := range 3 {
		integration.WaitFor(t, 20*time.Second, fmt.Sprintf("split listed at gateway %d", i+1), func() bool { _, ok := c.gw(i).Host("split"); return ok })
	}
	dial(c.gw(2).NATSURL()) // the copy, on another node
	connected := time.Now()
	for i := range 3 {
		integration.WaitFor(t, 5*time.Second-time.Since(connected), fmt.Sprintf("gateway %d to find the conflict", i+1), func() bool {
			h, _ := c.gw(i).Host("split")
			return h.IdentityConflict
		})
	}
	if err := c.gw(1).RevokeAgent(t.Context(), "split", "test"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		integration.WaitFor(t, 5*time.Second, fmt.Sprintf("gateway %d to clear the conflict", i+1), func() bool {
			h, _ := c.gw(i).Host("split")
			return !h.IdentityConflict && h.Revoked
		})
	}
}

// TestIdentityConflictKeptInACluster: a gateway replica that was down
// while a copy connected beside the agent (it never saw the two
// connections, and the copy is gone when it starts) refuses the host all
// the same: the conflict is kept in the host's record. Revoking through
// another replica clears it everywhere.
func TestIdentityConflictKeptInACluster(t *testing.T) {
	c := startGatewayCluster(t, 3, nil)
	creds, seed, err := integration.EnrolKey(t, c.gw(0), "kept")
	if err != nil {
		t.Fatal(err)
	}
	dial := func(url string) *nats.Conn {
		return dialAgentCreds(t, url, "kept", creds, seed, nats.MaxReconnects(-1))
	}
	agent := dial(c.gw(0).NATSURL())
	hello, _ := json.Marshal(protocol.Announce{Host: "kept", Instance: "i-1", Protocol: protocol.Version, HeartbeatMS: 1000, OS: "linux"})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // heartbeats, as the agent sends them
		defer close(done)
		for {
			_ = agent.Publish(protocol.PresenceSubject("kept"), hello)
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	defer func() { close(stop); <-done }()
	integration.WaitFor(t, 20*time.Second, "kept listed at gateway 2", func() bool { _, ok := c.gw(1).Host("kept"); return ok })
	c.stop(2)
	copied := dial(c.gw(1).NATSURL())
	for i := range 2 {
		integration.WaitFor(t, 5*time.Second, fmt.Sprintf("gateway %d to find the conflict", i+1), func() bool {
			h, _ := c.gw(i).Host("kept")
			return h.IdentityConflict
		})
	}
	copied.Close()
	c.restart(2)
	integration.WaitFor(t, 20*time.Second, "gateway 3 to refuse the host it never saw two connections of", func() bool {
		h, _ := c.gw(2).Host("kept")
		return h.IdentityConflict && strings.Contains(h.Conflict, "live NATS connections use this host's identity")
	})
	if err := c.gw(1).RevokeAgent(t.Context(), "kept", "test"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		integration.WaitFor(t, 5*time.Second, fmt.Sprintf("gateway %d to clear the conflict", i+1), func() bool {
			h, _ := c.gw(i).Host("kept")
			return !h.IdentityConflict && h.Revoked
		})
	}
}

// dialAgentCreds connects to url with host's credential and seed, as its
// agent (or a copy of it) does.
func dialAgentCreds(t *testing.T, url, host string, creds gateway.AgentCredentials, seed []byte, extra ...nats.Option) *nats.Conn {
	t.Helper()
	opts := append([]nats.Option{nats.UserJWTAndSeed(creds.JWT, string(seed)), nats.CustomInboxPrefix(protocol.AgentInboxPrefix(host))}, extra...)
	if len(creds.CAPEM) > 0 {
		opts = append(opts, integration.AgentTLS(creds.CAPEM))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
