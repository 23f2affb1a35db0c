package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestJudge: two connections on one identity are a conflict once both
// have been open the grace; a restart's old connection that goes within
// it is not; an older connection silent for longer than two heartbeats
// is an agent's dead link and excused, for the stale bound only; the
// newest connection is never excused.
func TestJudge(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	const grace, silent, stale = 3 * time.Second, 11 * time.Second, 2 * time.Minute
	conn := func(cid uint64, started, seen, last time.Duration) natsConn {
		c := natsConn{Server: "S", CID: cid, User: "UKEY", Start: now.Add(-started), seen: now.Add(-seen)}
		if last >= 0 {
			c.last = now.Add(-last)
		}
		return c
	}
	tests := []struct {
		name    string
		conns   []natsConn
		counted []uint64
		again   bool
	}{
		{"one connection", []natsConn{conn(1, time.Hour, time.Hour, 0)}, nil, false},
		{"a copy beside a live agent", []natsConn{conn(1, time.Hour, time.Hour, time.Second), conn(2, 4*time.Second, 4*time.Second, 4*time.Second)}, []uint64{1, 2}, false},
		{"a copy that never sends beside a live agent", []natsConn{conn(1, time.Hour, time.Hour, 2*time.Second), conn(2, time.Minute, time.Minute, time.Minute)}, []uint64{1, 2}, false},
		{"within the grace (a restart's old connection not gone yet)", []natsConn{conn(1, time.Hour, time.Hour, time.Second), conn(2, time.Second, time.Second, time.Second)}, nil, true},
		{"both seen only now (at start) wait the grace", []natsConn{conn(1, time.Hour, time.Second, time.Second), conn(2, time.Minute, time.Second, time.Minute)}, nil, true},
		{"a moved agent's dead link is excused", []natsConn{conn(1, time.Hour, time.Hour, 20*time.Second), conn(2, 5*time.Second, 5*time.Second, time.Second)}, nil, true},
		{"a dead link past the stale bound answers pings: alive", []natsConn{conn(1, time.Hour, time.Hour, 3*time.Minute), conn(2, 5*time.Second, 5*time.Second, time.Second)}, []uint64{1, 2}, false},
		{"activity unknown (events only) excuses nothing", []natsConn{conn(1, time.Hour, time.Hour, -1), conn(2, 5*time.Second, 5*time.Second, -1)}, []uint64{1, 2}, false},
		{"calls delivered to a dead link: its received count stood still", []natsConn{func() natsConn {
			c := conn(1, time.Hour, time.Hour, time.Second)
			c.sampled, c.inSince = true, now.Add(-30*time.Second)
			return c
		}(), conn(2, 5*time.Second, 5*time.Second, time.Second)}, nil, true},
		{"a live agent's received count moves", []natsConn{func() natsConn {
			c := conn(1, time.Hour, time.Hour, time.Second)
			c.sampled, c.inSince = true, now.Add(-time.Second)
			return c
		}(), conn(2, 5*time.Second, 5*time.Second, time.Second)}, []uint64{1, 2}, false},
		{"three: one dead link, two live", []natsConn{conn(1, time.Hour, time.Hour, 30*time.Second), conn(2, time.Minute, time.Minute, time.Second), conn(3, 5*time.Second, 5*time.Second, 0)}, []uint64{2, 3}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			counted, again := judge(tt.conns, now, grace, silent, stale)
			var ids []uint64
			for _, c := range counted {
				ids = append(ids, c.CID)
			}
			if !equalIDs(ids, tt.counted) || again != tt.again {
				t.Errorf("judge = %v, again %v; want %v, again %v", ids, again, tt.counted, tt.again)
			}
		})
	}
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

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
	if gw.reg.identityConflicted("restarts") {
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
	waitUntil(t, "the conflict to be found", func() bool { return gw.reg.identityConflicted("victim") })
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("found after %s, want within 5 s", took)
	}
	time.Sleep(connCheckEvery * 3) // more looks find the same conflict again
	if n := gw.identityConflictCount.Load(); n != 1 {
		t.Errorf("counted %d conflicts, want 1", n)
	}
	rec := tap.find(t, gw, auditIdentityConflict, outcomeRefused)
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
	_, err := gw.router.checkHost("victim")
	if err == nil || !strings.Contains(err.Error(), "live NATS connections use this host's identity") {
		t.Errorf("a call to the host: %v", err)
	}
	if err := gw.RevokeAgent(t.Context(), "victim", "test"); err != nil {
		t.Fatal(err)
	}
	if gw.reg.identityConflicted("victim") {
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
	for !gw.reg.identityConflicted("cloned") {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("no conflict found within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	kp2, creds2 := enrolLocalAgent(t, gw, "cloned", ReplaceHost())
	if gw.reg.identityConflicted("cloned") {
		t.Fatal("re-enrolling with --replace did not clear the conflict")
	}
	connectAs(t, gw, "cloned", kp2, creds2)
	time.Sleep(connGrace + 2*time.Second)
	if gw.reg.identityConflicted("cloned") {
		t.Error("the new key's connection raised a conflict")
	}
}

// TestConnWatchConnz: connections that were open before the watch
// started (no event for them) are found by the servers' connz, and a
// connection the watch knew that the servers no longer list is dropped.
func TestConnWatchConnz(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	kp, creds := enrolLocalAgent(t, gw, "early")
	a := connectAs(t, gw, "early", kp, creds)
	connectAs(t, gw, "early", kp, creds)
	w := newConnWatch(gw.log, gw.authority.AccountPub(), gw.authority.AgentSignerPub(), gw.sys, gw.nc)
	w.hostOf = gw.agentIndex.keyHost
	w.page = 1 // the gateway's own connections come first: every page is read
	w.byHost["early"] = map[connID]*natsConn{{"gone-server", 99}: {Server: "gone-server", CID: 99, host: "early"}}
	if err := w.reconcile(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	if n := len(w.byHost["early"]); n != 2 {
		t.Fatalf("connz found %d connections of early, want 2: %+v", n, w.byHost["early"])
	}
	for _, c := range w.byHost["early"] {
		pub, _ := kp.PublicKey()
		if c.User != pub || c.last.IsZero() || c.Start.IsZero() || c.Server == "" {
			t.Errorf("connection %+v", c)
		}
	}
	a.Close()
	pub, _ := kp.PublicKey()
	waitUntil(t, "connz to list one connection", func() bool {
		if err := w.reconcile(t.Context(), pub); err != nil {
			t.Fatal(err)
		}
		return len(w.byHost["early"]) == 1
	})
	// The gateway's own users and its watch's idea of other accounts
	// never count.
	for _, conns := range w.byHost {
		for _, c := range conns {
			if c.host != "early" {
				t.Errorf("a connection of %q counted", c.host)
			}
		}
	}
}

// FuzzConnEvent: whatever a connect or disconnect event holds, the watch
// neither panics nor records a connection not issued by the agent
// signing key of the fleet account, nor one for an invalid host.
func FuzzConnEvent(f *testing.F) {
	start := time.Unix(1_000_000, 0)
	good, _ := json.Marshal(connEvent{Type: server.ConnectEventMsgType, Server: server.ServerInfo{ID: "S1"},
		Client: server.ClientInfo{ID: 5, Account: "AFLEET", IssuerKey: "ASIGNER", User: "UKEY", Start: &start}})
	f.Add(good)
	f.Add([]byte(`{"type":"io.nats.server.advisory.v1.client_disconnect","client":{"acc":"AFLEET","issuer_key":"ASIGNER","user":"UKEY","id":5}}`))
	f.Add([]byte(`{"client":{"acc":"AFLEET","issuer_key":"ASIGNER","jwt":"x.y.z"}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		w := newConnWatch(nil, "AFLEET", "ASIGNER", nil, nil)
		w.hostOf = func(u string) (string, bool) { return "h-" + protocol.Clip(u, 8), u != "" }
		w.onEvent(&nats.Msg{Data: data})
		var ev connEvent
		_ = json.Unmarshal(data, &ev)
		for host, conns := range w.byHost {
			if protocol.ValidateHost(host) != nil && !strings.HasPrefix(host, "h-") {
				t.Fatalf("recorded invalid host %q", host)
			}
			if ev.Client.IssuerKey != "ASIGNER" || ev.Client.Account != "AFLEET" {
				t.Fatalf("recorded %v from an event of issuer %q account %q", conns, ev.Client.IssuerKey, ev.Client.Account)
			}
		}
	})
}

// TestConnWatchReceivedCount: a connection's received count standing
// still across connz answers dates its quiet from the first answer with
// that count; a moving count, or none known (events only), does not.
func TestConnWatchReceivedCount(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	w := newConnWatch(nil, "AFLEET", "ASIGNER", nil, nil)
	w.now = func() time.Time { return now }
	c := natsConn{Server: "S", CID: 1, User: "UKEY", host: "h", last: now, in: 7, sampled: true}
	w.add(c)
	now = now.Add(20 * time.Second)
	c.last = now // a call delivered to it
	w.add(c)
	if q := w.byHost["h"][c.id()].quiet(now); q != 20*time.Second {
		t.Errorf("count still for 20 s: quiet %s", q)
	}
	w.add(natsConn{Server: "S", CID: 1, User: "UKEY", host: "h"}) // an event keeps what connz knew
	if q := w.byHost["h"][c.id()].quiet(now); q != 20*time.Second {
		t.Errorf("after an event: quiet %s", q)
	}
	c.in = 8
	w.add(c)
	if q := w.byHost["h"][c.id()].quiet(now); q != 0 {
		t.Errorf("count moved: quiet %s", q)
	}
}

// TestConnWatchStaleBound: a silent older connection is excused for as
// long as the servers take to close a dead link, read from their ping
// settings.
func TestConnWatchStaleBound(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	w := newConnWatch(gw.log, gw.authority.AccountPub(), gw.authority.AgentSignerPub(), gw.sys, gw.nc)
	w.staleBound = 0
	w.refreshStaleBound(t.Context())
	// The embedded server pings every 20 s and closes a link after 2
	// unanswered pings.
	if want := 3*20*time.Second + connStaleSlack; w.staleBound != want {
		t.Errorf("stale bound %s, want %s", w.staleBound, want)
	}
}

// TestConnWatchNodeDied: when a node dies its connections' disconnects
// never come, and its agents reconnect elsewhere: every host then seems
// to have two connections. One list of the account settles them all,
// and none is a conflict.
func TestConnWatchNodeDied(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	w := newConnWatch(gw.log, gw.authority.AccountPub(), gw.authority.AgentSignerPub(), gw.sys, gw.nc)
	w.hostOf = gw.agentIndex.keyHost
	var found []string
	w.found = func(_ context.Context, host string, _ []natsConn) { found = append(found, host) }
	long := time.Now().Add(-time.Hour)
	for i := range connCheckMany + 2 {
		host := fmt.Sprintf("moved-%d", i)
		kp, creds := enrolLocalAgent(t, gw, host)
		connectAs(t, gw, host, kp, creds)
		pub, _ := kp.PublicKey()
		w.mu.Lock()
		w.seen[connID{"dead-node", uint64(i)}] = long
		w.add(natsConn{Server: "dead-node", CID: uint64(i), User: pub, Start: long, host: host})
		w.mu.Unlock()
	}
	if err := w.reconcile(t.Context(), ""); err != nil { // the new connections, as the events brought them
		t.Fatal(err)
	}
	// Phantoms from before the list are gone already; put them back as
	// if their node's connections were heard after it.
	for i := range connCheckMany + 2 {
		host := fmt.Sprintf("moved-%d", i)
		w.mu.Lock()
		for _, c := range w.byHost[host] {
			c.seen = long
		}
		w.seen[connID{"dead-node", uint64(i)}] = long
		w.add(natsConn{Server: "dead-node", CID: uint64(i), User: w.anyUser(host), Start: long, host: host})
		w.mu.Unlock()
	}
	w.checkAll(t.Context())
	if len(found) > 0 {
		t.Errorf("conflicts found for %v", found)
	}
	for i := range connCheckMany + 2 {
		if n := len(w.byHost[fmt.Sprintf("moved-%d", i)]); n != 1 {
			t.Errorf("moved-%d has %d connections, want 1", i, n)
		}
	}
}

// anyUser returns the key of one of host's connections. The caller
// holds w.mu.
func (w *connWatch) anyUser(host string) string {
	for _, c := range w.byHost[host] {
		return c.User
	}
	return ""
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
			for !gw.reg.identityConflicted("victim") {
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
			if _, err := gw.router.checkHost("victim"); err == nil {
				t.Error("a call to the churned host is not refused")
			}
			if n := gw.identityConflictCount.Load(); n != 1 {
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
	if gw.reg.identityConflicted("phoenix") {
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
	before, _, err := gw.agents.get(t.Context(), "victim")
	if err != nil {
		t.Fatal(err)
	}
	connectAs(t, gw, "victim", kp, creds)
	waitUntil(t, "the conflict to be kept in the record", func() bool {
		rec, ok := gw.agentIndex.record("victim")
		return ok && rec.IdentityConflict != nil
	})
	time.Sleep(connCheckEvery * 4) // more looks find it again: no more writes
	rec, _, err := gw.agents.get(t.Context(), "victim")
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	if rec.Gen != before.Gen+1 || rec.IdentityConflict.PublicKey != pub || !strings.Contains(rec.IdentityConflict.Detail, "live NATS connections") {
		t.Errorf("record gen %d (was %d), conflict %+v", rec.Gen, before.Gen, rec.IdentityConflict)
	}
	// What a gateway that did not see it knows: the record only.
	gw.reg.mu.Lock()
	clear(gw.reg.idConflicts)
	gw.reg.mu.Unlock()
	if h, _ := gw.Host("victim"); !h.IdentityConflict || !strings.Contains(h.Conflict, "--replace") {
		t.Errorf("from the record alone, hosts shows %+v", h)
	}
	if _, err := gw.router.checkHost("victim"); err == nil {
		t.Error("from the record alone, a call to the host is not refused")
	}
	if err := gw.RevokeAgent(t.Context(), "victim", "test"); err != nil {
		t.Fatal(err)
	}
	if h, _ := gw.Host("victim"); h.IdentityConflict {
		t.Errorf("after the revocation: %+v", h)
	}
}

// TestConnWatchClosedStaysClosed: the connect and disconnect events come
// on two subscriptions, and a connz answer may predate a close; a
// connection seen closed must not come back from either, where it would
// pass for an older live link and make the next restart a strike.
func TestConnWatchClosedStaysClosed(t *testing.T) {
	w := newConnWatch(slog.New(slog.DiscardHandler), "ACCOUNT", "SIGNER", nil, nil)
	t0 := time.Now().Add(-time.Minute)
	conn := func(cid uint64, start time.Time) natsConn {
		return natsConn{Server: "S1", CID: cid, User: "UKEY", Start: start, host: "phoenix"}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for round := range 3 {
		first, second := conn(uint64(10*round+1), t0.Add(time.Duration(round)*time.Second)), conn(uint64(10*round+2), t0.Add(time.Duration(round)*time.Second+time.Millisecond))
		// A restart: the old process's disconnect is handled before its
		// connect; then the new one comes, and a stale list still
		// names the old one.
		w.closed("phoenix", first.id())
		w.add(first)
		w.add(second)
		stale := first
		stale.sampled, stale.in = true, 1
		w.add(stale)
		if n := len(w.byHost["phoenix"]); n != 1 {
			t.Fatalf("round %d: %d connections held for the host, want only the live one", round, n)
		}
		// The next restart closes the new one too: no older link stands
		// beside it, so no strike.
		w.closed("phoenix", second.id())
	}
	if s := w.strikes["phoenix"]; len(s) != 0 || len(w.churned) != 0 {
		t.Errorf("restarts made strikes %v, conflicts %v", s, w.churned)
	}
}
