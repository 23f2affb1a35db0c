package integration

import (
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
