package integration

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestAgentIdentityIsPerHost: on the embedded server each agent logs in as
// its own host and can touch only its own subjects. Nobody gets in without
// a credential.
func TestAgentIdentityIsPerHost(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}})
	url := env.NATSURL()

	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("anonymous client was admitted")
	}
	_, betaPass := env.Gateway.AgentCredentials("beta")
	if nc, err := nats.Connect(url, nats.UserInfo("alpha", betaPass)); err == nil {
		nc.Close()
		t.Fatal("alpha was admitted with beta's password")
	}

	user, pass := env.Gateway.AgentCredentials("alpha")
	asyncErrs := make(chan error, 16)
	nc, err := nats.Connect(url, nats.UserInfo(user, pass), nats.PermissionErrOnSubscribe(true),
		nats.CustomInboxPrefix(protocol.AgentInboxPrefix("alpha")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { asyncErrs <- err }))
	if err != nil {
		t.Fatalf("alpha's own credential: %v", err)
	}
	defer nc.Close()

	// Its own subjects are fine.
	for _, subj := range []string{protocol.CallSubject("alpha"), protocol.AgentInboxPrefix("alpha") + ".x"} {
		if _, err := nc.SubscribeSync(subj); err != nil {
			t.Fatalf("subscribe %s: %v", subj, err)
		}
	}
	// Another host's calls, the gateway's replies and every host at once
	// are not.
	for _, subj := range []string{protocol.CallSubject("beta"), protocol.AllHosts(), protocol.GatewayInboxPrefix() + ".>", ">"} {
		sub, err := nc.SubscribeSync(subj)
		if err == nil {
			err = nc.Flush()
		}
		if err == nil {
			_, err = sub.NextMsg(500 * time.Millisecond)
			if errors.Is(err, nats.ErrTimeout) {
				err = nil
			}
		}
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "permission") {
			t.Errorf("alpha subscribing to %s: err = %v, want a permissions violation", subj, err)
		}
	}

	// Announcing as beta is refused by the server; the gateway never sees
	// it.
	fake, _ := json.Marshal(protocol.Announce{Host: "beta", Instance: "forged", Protocol: protocol.Version, HeartbeatMS: 500})
	if err := nc.Publish(protocol.PresenceSubject("beta"), fake); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case err := <-asyncErrs:
		if !strings.Contains(strings.ToLower(err.Error()), "permission") {
			t.Fatalf("publish as beta: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publishing beta's presence with alpha's credential raised no permissions violation")
	}
	if h, _ := env.Gateway.Host("beta"); h.Conflict != "" || h.Instance == "forged" {
		t.Fatalf("the forged announce reached the gateway: %+v", h)
	}
}
