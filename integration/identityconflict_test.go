package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// TestCopiedIdentityIsAConflict: someone copies a host's seed and
// credential from its agent's state directory and connects beside the
// agent with them, never announcing, to receive the host's calls (other
// callers' commands) and answer first. Within 5 s the gateway marks the
// host conflicting in hosts, refuses calls to it (the copy receives
// none), audits the event and counts it; revoking the host clears the
// conflict and throws the copy out.
func TestCopiedIdentityIsAConflict(t *testing.T) {
	for _, external := range []bool{false, true} {
		name := "embedded"
		if external {
			name = "external cluster"
		}
		t.Run(name, func(t *testing.T) {
			copiedIdentity(t, NewEnv(t, Options{Agents: []string{}, ExternalNATS: external, Gateway: func(c *gateway.Config) {
				c.Metrics = true
				c.MetricsListen = "127.0.0.1:0"
			}}))
		})
	}
}

func copiedIdentity(t *testing.T, env *Env) {
	env.StartAgentProcess("victim")
	env.WaitHost("victim", true)
	cs := env.Client("2025-11-25", nil)
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "victim", "command": "echo before"}))

	var stolen atomic.Int64
	rogue := copyIdentity(t, env, "victim", &stolen)
	connected := time.Now()

	waitFor(t, 5*time.Second, "hosts to show victim in conflict", func() bool {
		out := mustOK(t, call(t, cs, "hosts", nil))
		return strings.Contains(out, "victim\tconflict\t") && strings.Contains(out, "live NATS connections use this host's identity")
	})
	t.Logf("conflict shown %s after the copy connected", time.Since(connected).Round(time.Millisecond))

	mustErr(t, call(t, cs, "bash", map[string]any{"host": "victim", "command": "echo secret"}), "live NATS connections use this host's identity")
	mustErr(t, call(t, cs, "fleet_bash", map[string]any{"selector": "victim", "command": "echo secret"}), "live NATS connections use this host's identity")
	if n := stolen.Load(); n != 0 {
		t.Errorf("the copy received %d call messages after the conflict was shown", n)
	}

	var recs []audit.Record
	waitFor(t, 5*time.Second, "the conflict's audit record", func() bool {
		recs = nil
		for _, r := range auditRecords(t, cs, map[string]any{"host": "victim"}) {
			if r.Tool == "identity_conflict" {
				recs = append(recs, r)
			}
		}
		return len(recs) > 0
	})
	if len(recs) != 1 || recs[0].Outcome != "refused" || !strings.Contains(recs[0].Error, "2 live NATS connections") {
		t.Errorf("audit records of the conflict: %+v", recs)
	}
	if got := scrape(t, env.Gateway.MetricsURL())["fleet_identity_conflicts_total"]; got != 1 {
		t.Errorf("fleet_identity_conflicts_total = %v, want 1", got)
	}

	if err := env.Gateway.RevokeAgent(t.Context(), "victim", "test"); err != nil {
		t.Fatal(err)
	}
	h, _ := env.Gateway.Host("victim")
	if h.Conflict != "" || h.IdentityConflict || !h.Revoked {
		t.Errorf("after the revocation: conflict %q, revoked %v", h.Conflict, h.Revoked)
	}
	waitFor(t, 5*time.Second, "the copy to be thrown out", func() bool { return rogue.IsClosed() })
	out := mustOK(t, call(t, cs, "hosts", nil))
	if !strings.Contains(out, "victim\trevoked\t") || strings.Contains(out, "conflict") {
		t.Errorf("hosts after the revocation:\n%s", out)
	}
}

// copyIdentity connects with the seed and credential in host's agent
// state directory, as a thief who copied them would, subscribes to the
// host's calls (counting them in stolen) and never announces.
func copyIdentity(t *testing.T, env *Env, host string, stolen *atomic.Int64) *nats.Conn {
	t.Helper()
	// What a thief takes: the files in the agent's state directory.
	store := identity.Open(filepath.Join(env.AgentDir(host), ".state"))
	seed, err := os.ReadFile(filepath.Join(store.Dir(), identity.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	token, err := os.ReadFile(filepath.Join(store.Dir(), identity.JWTFile))
	if err != nil {
		t.Fatal(err)
	}
	enrolment, err := store.LoadEnrolment()
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nats.UserJWTAndSeed(strings.TrimSpace(string(token)), strings.TrimSpace(string(seed))),
		nats.CustomInboxPrefix(protocol.AgentInboxPrefix(host)), nats.MaxReconnects(0)}
	if enrolment.NATSCA != "" {
		opts = append(opts, agentTLS([]byte(enrolment.NATSCA)))
	}
	rogue, err := nats.Connect(enrolment.NATSURLs[0], opts...)
	if err != nil {
		t.Fatalf("the copied credential does not connect: %v", err)
	}
	t.Cleanup(rogue.Close)
	if _, err := rogue.Subscribe(protocol.CallSubject(host), func(*nats.Msg) { stolen.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}
	return rogue
}

// TestCopyConnectedBeforeGatewayStarts: a copy already connected when a
// gateway starts (no connect event will tell of it) is found by the
// servers' connection list.
func TestCopyConnectedBeforeGatewayStarts(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, ExternalNATS: true})
	env.StartAgentProcess("early")
	env.WaitHost("early", true)
	var stolen atomic.Int64
	copyIdentity(t, env, "early", &stolen)
	env.RestartGateway()
	started := time.Now()
	waitFor(t, 10*time.Second, "the restarted gateway to find the copy", func() bool {
		h, ok := env.Gateway.Host("early")
		return ok && h.IdentityConflict
	})
	t.Logf("found %s after the gateway restarted", time.Since(started).Round(time.Millisecond))
	cs := env.Client("2025-11-25", nil)
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "early", "command": "echo secret"}), "live NATS connections use this host's identity")
}

// TestAgentRestartIsNoConflict: an agent killed and started again on
// the same state directory reconnects with the same identity while the
// server may still count its old connection; that is no conflict.
func TestAgentRestartIsNoConflict(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) {
		c.Metrics = true
		c.MetricsListen = "127.0.0.1:0"
	}})
	env.StartAgentProcess("phoenix")
	env.WaitHost("phoenix", true)
	cs := env.Client("2025-11-25", nil)
	for round := range 3 {
		env.KillAgent("phoenix")
		env.RestartAgentProcess("phoenix")
		env.WaitHost("phoenix", true)
		// Past the grace, with the agent heartbeating.
		time.Sleep(5 * time.Second)
		if h, _ := env.Gateway.Host("phoenix"); h.Conflict != "" || h.IdentityConflict {
			t.Fatalf("round %d: after a restart the host shows conflict %q", round, h.Conflict)
		}
		if out := mustOK(t, call(t, cs, "bash", map[string]any{"host": "phoenix", "command": "echo alive"})); out != "alive\n" {
			t.Fatalf("round %d: %q", round, out)
		}
	}
	if got := scrape(t, env.Gateway.MetricsURL())["fleet_identity_conflicts_total"]; got != 0 {
		t.Errorf("fleet_identity_conflicts_total = %v, want 0", got)
	}
}

// TestCopiedIdentityInACluster: on a cluster of gateways, the agent on
// one node and a copy of its identity on another are a conflict that
// every gateway finds within 5 s (the servers' events and connection
// lists span the cluster); revoking through one clears it on all.
func TestCopiedIdentityInACluster(t *testing.T) {
	c := startGatewayCluster(t, 3, nil)
	creds, seed, err := enrolKey(t, c.gw(0), "split")
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
		waitFor(t, 20*time.Second, fmt.Sprintf("split listed at gateway %d", i+1), func() bool { _, ok := c.gw(i).Host("split"); return ok })
	}
	dial(c.gw(2).NATSURL()) // the copy, on another node
	connected := time.Now()
	for i := range 3 {
		waitFor(t, 5*time.Second-time.Since(connected), fmt.Sprintf("gateway %d to find the conflict", i+1), func() bool {
			h, _ := c.gw(i).Host("split")
			return h.IdentityConflict
		})
	}
	if err := c.gw(1).RevokeAgent(t.Context(), "split", "test"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		waitFor(t, 5*time.Second, fmt.Sprintf("gateway %d to clear the conflict", i+1), func() bool {
			h, _ := c.gw(i).Host("split")
			return !h.IdentityConflict && h.Revoked
		})
	}
}

// TestChurningCopyIsAConflict: the thief with the host's copied seed and
// credential never keeps a connection open for the 3 s two connections
// are given: it opens a new one every 2.5 s and closes the one before
// just after, so it always hears the host's calls. The gateway finds it
// within seconds all the same, refuses the host, and still refuses it
// after the copy is gone and the gateway has restarted; revoking the
// host clears it.
func TestChurningCopyIsAConflict(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, ExternalNATS: true})
	env.StartAgentProcess("victim")
	env.WaitHost("victim", true)
	cs := env.Client("2025-11-25", nil)
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "victim", "command": "echo before"}))

	var stolen atomic.Int64
	start := time.Now()
	var prev *nats.Conn
	for {
		h, _ := env.Gateway.Host("victim")
		if h.IdentityConflict {
			break
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("the churning copy was not found within %s", time.Since(start).Round(time.Second))
		}
		next := copyIdentity(t, env, "victim", &stolen)
		if prev != nil {
			prev.Close()
		}
		prev = next
		time.Sleep(2500 * time.Millisecond)
	}
	t.Logf("found %s after the copy began", time.Since(start).Round(time.Millisecond))
	prev.Close()
	const refused = "a second client keeps connecting on this host's identity"
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "victim", "command": "echo secret"}), refused)

	env.RestartGateway()
	env.WaitHost("victim", true)
	cs = env.Client("2025-11-25", nil)
	if h, _ := env.Gateway.Host("victim"); !h.IdentityConflict {
		t.Fatalf("the restarted gateway forgot the conflict: %+v", h.Conflict)
	}
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "victim", "command": "echo secret"}), refused)
	if out := mustOK(t, call(t, cs, "hosts", nil)); !strings.Contains(out, "victim\tconflict\t") {
		t.Errorf("hosts after the restart:\n%s", out)
	}
	if err := env.Gateway.RevokeAgent(t.Context(), "victim", "test"); err != nil {
		t.Fatal(err)
	}
	if h, _ := env.Gateway.Host("victim"); h.IdentityConflict || !h.Revoked {
		t.Errorf("after the revocation: conflict %q, revoked %v", h.Conflict, h.Revoked)
	}
}

// TestIdentityConflictKeptInACluster: a gateway replica that was down
// while a copy connected beside the agent (it never saw the two
// connections, and the copy is gone when it starts) refuses the host all
// the same: the conflict is kept in the host's record. Revoking through
// another replica clears it everywhere.
func TestIdentityConflictKeptInACluster(t *testing.T) {
	c := startGatewayCluster(t, 3, nil)
	creds, seed, err := enrolKey(t, c.gw(0), "kept")
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
	waitFor(t, 20*time.Second, "kept listed at gateway 2", func() bool { _, ok := c.gw(1).Host("kept"); return ok })
	c.stop(2)
	copied := dial(c.gw(1).NATSURL())
	for i := range 2 {
		waitFor(t, 5*time.Second, fmt.Sprintf("gateway %d to find the conflict", i+1), func() bool {
			h, _ := c.gw(i).Host("kept")
			return h.IdentityConflict
		})
	}
	copied.Close()
	c.restart(2)
	waitFor(t, 20*time.Second, "gateway 3 to refuse the host it never saw two connections of", func() bool {
		h, _ := c.gw(2).Host("kept")
		return h.IdentityConflict && strings.Contains(h.Conflict, "live NATS connections use this host's identity")
	})
	if err := c.gw(1).RevokeAgent(t.Context(), "kept", "test"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		waitFor(t, 5*time.Second, fmt.Sprintf("gateway %d to clear the conflict", i+1), func() bool {
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
		opts = append(opts, agentTLS(creds.CAPEM))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
