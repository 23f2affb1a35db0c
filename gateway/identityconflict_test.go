package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// connGrace and connCheckEvery are the watch's (natsauth): how long two
// connections must both be open before they are judged, and how often a
// host with two is looked at again.
const (
	connGrace      = 3 * time.Second
	connCheckEvery = 500 * time.Millisecond
)

// enrolLocalAgent enrols host with a new key and returns the key and its
// credential.
func enrolLocalAgent(t *testing.T, gw *Gateway, host string, opts ...EnrolOption) (nkeys.KeyPair, AgentCredentials) {
	t.Helper()
	kp := newUser(t)
	pub, _ := kp.PublicKey()
	creds, err := gw.EnrolLocal(t.Context(), host, pub, map[string]string{"env": "test"}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return kp, creds
}

func connectAs(t *testing.T, gw *Gateway, host string, kp nkeys.KeyPair, creds AgentCredentials) *nats.Conn {
	t.Helper()
	seed, _ := kp.Seed()
	return connectAgent(t, gw, host, creds.JWT, seed, creds.CAPEM)
}

// TestConnWatchCopiedCredential: a second connection with a host's seed
// and credential, which never announces, is found within 5 s from the
// servers' events, marks the host, is counted and audited once, and
// refuses calls; revoking the host clears it. A connection that closes
// within the grace (a restart) is no conflict.
func TestConnWatchCopiedCredential(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	tap := tapAudit(t, gw)

	kp, creds := enrolLocalAgent(t, gw, "restarts")
	first := connectAs(t, gw, "restarts", kp, creds)
	second := connectAs(t, gw, "restarts", kp, creds)
	first.Close() // the old process of a restart goes at once
	time.Sleep(connGrace + 2*time.Second)
	if gw.calling.reg.identityConflicted("restarts") {
		t.Fatal("a restart (the old connection closed within the grace) was taken for a conflict")
	}
	second.Close()

	kp, creds = enrolLocalAgent(t, gw, "victim")
	agent := connectAs(t, gw, "victim", kp, creds)
	hello, _ := json.Marshal(protocol.Announce{Host: "victim", Instance: "i-1", Protocol: protocol.Version, HeartbeatMS: 5000, OS: "linux"})
	if err := agent.Publish(protocol.PresenceSubject("victim"), hello); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "victim to announce", func() bool { _, ok := gw.Host("victim"); return ok })
	start := time.Now()
	connectAs(t, gw, "victim", kp, creds) // the copy
	waitUntil(t, "the conflict to be found", func() bool { return gw.calling.reg.identityConflicted("victim") })
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("found after %s, want within 5 s", took)
	}
	time.Sleep(connCheckEvery * 3) // more looks find the same conflict again
	if n := gw.calling.identityConflictCount.Load(); n != 1 {
		t.Errorf("counted %d conflicts, want 1", n)
	}
	rec := tap.find(t, gw, auditIdentityConflict, audit.OutcomeRefused)
	if len(rec.Hosts) != 1 || rec.Hosts[0] != "victim" || !strings.Contains(rec.Error, "2 live NATS connections") || rec.Args["connections"] == nil {
		t.Errorf("audit record %+v", rec)
	}
	tap.mu.Lock()
	n := 0
	for _, r := range tap.recs {
		if r.Tool == auditIdentityConflict {
			n++
		}
	}
	tap.mu.Unlock()
	if n != 1 {
		t.Errorf("%d audit records of the conflict, want 1", n)
	}
	if h, _ := gw.Host("victim"); !h.IdentityConflict || !strings.Contains(h.Conflict, "--replace") {
		t.Errorf("hosts shows %+v", h)
	}
	_, err := gw.calling.router.checkHost("victim")
	if err == nil || !strings.Contains(err.Error(), "live NATS connections use this host's identity") {
		t.Errorf("a call to the host: %v", err)
	}
	if err := gw.RevokeAgent(t.Context(), "victim", "test"); err != nil {
		t.Fatal(err)
	}
	if gw.calling.reg.identityConflicted("victim") {
		t.Error("revoking the host did not clear its conflict")
	}
	if h, _ := gw.Host("victim"); h.IdentityConflict || h.Conflict != "" || !h.Revoked {
		t.Errorf("after the revocation: %+v", h)
	}
}

// TestConnWatchReplaceClears: re-enrolling a conflicting host with
// another key (--replace) clears the conflict, and the new key's single
// connection raises none.
func TestConnWatchReplaceClears(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	kp, creds := enrolLocalAgent(t, gw, "cloned")
	connectAs(t, gw, "cloned", kp, creds)
	connectAs(t, gw, "cloned", kp, creds)
	start := time.Now()
	for !gw.calling.reg.identityConflicted("cloned") {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no conflict found within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	kp2, creds2 := enrolLocalAgent(t, gw, "cloned", ReplaceHost())
	if gw.calling.reg.identityConflicted("cloned") {
		t.Fatal("re-enrolling with --replace did not clear the conflict")
	}
	connectAs(t, gw, "cloned", kp2, creds2)
	time.Sleep(connGrace + 2*time.Second)
	if gw.calling.reg.identityConflicted("cloned") {
		t.Error("the new key's connection raised a conflict")
	}
}

// heartbeat announces host on nc every second, as its agent does, until
// the test ends.
func heartbeat(t *testing.T, nc *nats.Conn, host string) {
	t.Helper()
	hello, _ := json.Marshal(protocol.Announce{Host: host, Instance: "i-1", Protocol: protocol.Version, HeartbeatMS: 1000, OS: "linux"})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_ = nc.Publish(protocol.PresenceSubject(host), hello)
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// TestConnWatchChurningCopy: a copy that never keeps a connection open
// for the grace, beside a live agent, is found all the same: one that
// opens each link before closing the one before (overlapping), and one
// that stays just under the grace and then waits as long before coming
// back. Each of its links is newer than the agent's and closes while the
// agent's stays.
func TestConnWatchChurningCopy(t *testing.T) {
	for _, tt := range []struct {
		name      string
		stay, gap time.Duration
	}{
		{"overlapping links", 2500 * time.Millisecond, -500 * time.Millisecond},
		{"a link at a time", connGrace - 100*time.Millisecond, connGrace},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gw := startAPIGateway(t, nil, nil)
			kp, creds := enrolLocalAgent(t, gw, "victim")
			heartbeat(t, connectAs(t, gw, "victim", kp, creds), "victim")
			waitUntil(t, "victim to announce", func() bool { _, ok := gw.Host("victim"); return ok })
			start := time.Now()
			var prev *nats.Conn
			for !gw.calling.reg.identityConflicted("victim") {
				if time.Since(start) > 4*(tt.stay+tt.gap)+5*time.Second {
					t.Fatalf("the churning copy was not found within %s", time.Since(start).Round(time.Second))
				}
				if tt.gap > 0 && prev != nil {
					prev.Close()
					time.Sleep(tt.gap)
				}
				next := connectAs(t, gw, "victim", kp, creds)
				if tt.gap < 0 && prev != nil {
					prev.Close()
				}
				prev = next
				time.Sleep(tt.stay + min(tt.gap, 0))
			}
			t.Logf("found after %s", time.Since(start).Round(time.Millisecond))
			h, _ := gw.Host("victim")
			if !strings.Contains(h.Conflict, "a second client keeps connecting") {
				t.Errorf("hosts shows %q", h.Conflict)
			}
			if _, err := gw.calling.router.checkHost("victim"); err == nil {
				t.Error("a call to the churned host is not refused")
			}
			if n := gw.calling.identityConflictCount.Load(); n != 1 {
				t.Errorf("counted %d conflicts, want 1", n)
			}
		})
	}
}

// TestConnWatchRestartsAreNoChurn: an agent that restarts again and
// again, its old link closing at once or just after its new one opened,
// raises no conflict: each time the older link is the one that ends.
func TestConnWatchRestartsAreNoChurn(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	kp, creds := enrolLocalAgent(t, gw, "phoenix")
	old := connectAs(t, gw, "phoenix", kp, creds)
	for round := range 6 {
		if round%2 == 0 {
			next := connectAs(t, gw, "phoenix", kp, creds)
			old.Close() // the old process goes after the new one came
			old = next
		} else {
			old.Close() // killed: its link ends before the next one
			old = connectAs(t, gw, "phoenix", kp, creds)
		}
		time.Sleep(time.Second)
	}
	time.Sleep(connCheckEvery * 3)
	if gw.calling.reg.identityConflicted("phoenix") {
		h, _ := gw.Host("phoenix")
		t.Fatalf("restarts taken for a conflict: %s", h.Conflict)
	}
}

// TestConnWatchConflictKept: a conflict found is written into the host's
// record, once, and stands from the record alone (what another gateway,
// or this one after a restart, knows); revoking the host ends it.
func TestConnWatchConflictKept(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	kp, creds := enrolLocalAgent(t, gw, "victim")
	heartbeat(t, connectAs(t, gw, "victim", kp, creds), "victim")
	waitUntil(t, "victim to announce", func() bool { _, ok := gw.Host("victim"); return ok })
	before, _, err := gw.subsys.agents.Get(t.Context(), "victim")
	if err != nil {
		t.Fatal(err)
	}
	connectAs(t, gw, "victim", kp, creds)
	waitUntil(t, "the conflict to be kept in the record", func() bool {
		rec, ok := gw.subsys.agentIndex.Record("victim")
		return ok && rec.IdentityConflict != nil
	})
	time.Sleep(connCheckEvery * 4) // more looks find it again: no more writes
	rec, _, err := gw.subsys.agents.Get(t.Context(), "victim")
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	if rec.Gen != before.Gen+1 || rec.IdentityConflict.PublicKey != pub || !strings.Contains(rec.IdentityConflict.Detail, "live NATS connections") {
		t.Errorf("record gen %d (was %d), conflict %+v", rec.Gen, before.Gen, rec.IdentityConflict)
	}
	// What a gateway that did not see it knows: the record only.
	gw.calling.reg.mu.Lock()
	clear(gw.calling.reg.idConflicts)
	gw.calling.reg.mu.Unlock()
	if h, _ := gw.Host("victim"); !h.IdentityConflict || !strings.Contains(h.Conflict, "--replace") {
		t.Errorf("from the record alone, hosts shows %+v", h)
	}
	if _, err := gw.calling.router.checkHost("victim"); err == nil {
		t.Error("from the record alone, a call to the host is not refused")
	}
	if err := gw.RevokeAgent(t.Context(), "victim", "test"); err != nil {
		t.Fatal(err)
	}
	if h, _ := gw.Host("victim"); h.IdentityConflict {
		t.Errorf("after the revocation: %+v", h)
	}
}
