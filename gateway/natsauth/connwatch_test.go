package natsauth

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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
	conn := func(cid uint64, started, seen, last time.Duration) Conn {
		c := Conn{Server: "S", CID: cid, User: "UKEY", Start: now.Add(-started), seen: now.Add(-seen)}
		if last >= 0 {
			c.last = now.Add(-last)
		}
		return c
	}
	tests := []struct {
		name    string
		conns   []Conn
		counted []uint64
		again   bool
	}{
		{"one connection", []Conn{conn(1, time.Hour, time.Hour, 0)}, nil, false},
		{"a copy beside a live agent", []Conn{conn(1, time.Hour, time.Hour, time.Second), conn(2, 4*time.Second, 4*time.Second, 4*time.Second)}, []uint64{1, 2}, false},
		{"a copy that never sends beside a live agent", []Conn{conn(1, time.Hour, time.Hour, 2*time.Second), conn(2, time.Minute, time.Minute, time.Minute)}, []uint64{1, 2}, false},
		{"within the grace (a restart's old connection not gone yet)", []Conn{conn(1, time.Hour, time.Hour, time.Second), conn(2, time.Second, time.Second, time.Second)}, nil, true},
		{"both seen only now (at start) wait the grace", []Conn{conn(1, time.Hour, time.Second, time.Second), conn(2, time.Minute, time.Second, time.Minute)}, nil, true},
		{"a moved agent's dead link is excused", []Conn{conn(1, time.Hour, time.Hour, 20*time.Second), conn(2, 5*time.Second, 5*time.Second, time.Second)}, nil, true},
		{"a dead link past the stale bound answers pings: alive", []Conn{conn(1, time.Hour, time.Hour, 3*time.Minute), conn(2, 5*time.Second, 5*time.Second, time.Second)}, []uint64{1, 2}, false},
		{"activity unknown (events only) excuses nothing", []Conn{conn(1, time.Hour, time.Hour, -1), conn(2, 5*time.Second, 5*time.Second, -1)}, []uint64{1, 2}, false},
		{"calls delivered to a dead link: its received count stood still", []Conn{func() Conn {
			c := conn(1, time.Hour, time.Hour, time.Second)
			c.sampled, c.inSince = true, now.Add(-30*time.Second)
			return c
		}(), conn(2, 5*time.Second, 5*time.Second, time.Second)}, nil, true},
		{"a live agent's received count moves", []Conn{func() Conn {
			c := conn(1, time.Hour, time.Hour, time.Second)
			c.sampled, c.inSince = true, now.Add(-time.Second)
			return c
		}(), conn(2, 5*time.Second, 5*time.Second, time.Second)}, []uint64{1, 2}, false},
		{"three: one dead link, two live", []Conn{conn(1, time.Hour, time.Hour, 30*time.Second), conn(2, time.Minute, time.Minute, time.Second), conn(3, 5*time.Second, 5*time.Second, 0)}, []uint64{2, 3}, false},
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

// TestConnWatchConnz: connections that were open before the watch
// started (no event for them) are found by the servers' connz, and a
// connection the watch knew that the servers no longer list is dropped.
func TestConnWatchConnz(t *testing.T) {
	_, auth, nc, connect := startTestEmbedded(t)
	hosts := newHostKeys()
	kp, token := hosts.agent(t, auth, "early")
	a := connectAgent(t, connect, kp, token)
	connectAgent(t, connect, kp, token)
	w := newConnWatch(slog.New(slog.DiscardHandler), auth.accountPub, auth.AgentSignerPub(), auth.sys, nc)
	w.hostOf = hosts.hostOf
	w.page = 1 // the gateway's own connections come first: every page is read
	w.byHost["early"] = map[connID]*Conn{{"gone-server", 99}: {Server: "gone-server", CID: 99, host: "early"}}
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
	c := Conn{Server: "S", CID: 1, User: "UKEY", host: "h", last: now, in: 7, sampled: true}
	w.add(c)
	now = now.Add(20 * time.Second)
	c.last = now // a call delivered to it
	w.add(c)
	if q := w.byHost["h"][c.id()].quiet(now); q != 20*time.Second {
		t.Errorf("count still for 20 s: quiet %s", q)
	}
	w.add(Conn{Server: "S", CID: 1, User: "UKEY", host: "h"}) // an event keeps what connz knew
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
	_, auth, nc, _ := startTestEmbedded(t)
	w := newConnWatch(slog.New(slog.DiscardHandler), auth.accountPub, auth.AgentSignerPub(), auth.sys, nc)
	w.staleBound = 0
	w.refreshStaleBound(t.Context())
	// The embedded server pings every 20 s and closes a link after 2
	// unanswered pings.
	if want := 3*embeddedPingInterval + connStaleSlack; w.staleBound != want {
		t.Errorf("stale bound %s, want %s", w.staleBound, want)
	}
}

// TestConnWatchNodeDied: when a node dies its connections' disconnects
// never come, and its agents reconnect elsewhere: every host then seems
// to have two connections. One list of the account settles them all,
// and none is a conflict.
func TestConnWatchNodeDied(t *testing.T) {
	_, auth, nc, connect := startTestEmbedded(t)
	hosts := newHostKeys()
	w := newConnWatch(slog.New(slog.DiscardHandler), auth.accountPub, auth.AgentSignerPub(), auth.sys, nc)
	w.hostOf = hosts.hostOf
	var found []string
	w.found = func(_ context.Context, host string, _ []Conn) { found = append(found, host) }
	long := time.Now().Add(-time.Hour)
	for i := range connCheckMany + 2 {
		host := fmt.Sprintf("moved-%d", i)
		kp, token := hosts.agent(t, auth, host)
		connectAgent(t, connect, kp, token)
		pub, _ := kp.PublicKey()
		w.mu.Lock()
		w.seen[connID{"dead-node", uint64(i)}] = long
		w.add(Conn{Server: "dead-node", CID: uint64(i), User: pub, Start: long, host: host})
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
		w.add(Conn{Server: "dead-node", CID: uint64(i), User: w.anyUser(host), Start: long, host: host})
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

// TestConnWatchClosedStaysClosed: the connect and disconnect events come
// on two subscriptions, and a connz answer may predate a close; a
// connection seen closed must not come back from either, where it would
// pass for an older live link and make the next restart a strike.
func TestConnWatchClosedStaysClosed(t *testing.T) {
	w := newConnWatch(slog.New(slog.DiscardHandler), "ACCOUNT", "SIGNER", nil, nil)
	t0 := time.Now().Add(-time.Minute)
	conn := func(cid uint64, start time.Time) Conn {
		return Conn{Server: "S1", CID: cid, User: "UKEY", Start: start, host: "phoenix"}
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

// hostKeys are the hosts' enrolled keys of a test.
type hostKeys struct {
	mu   sync.Mutex
	host map[string]string
}

func newHostKeys() *hostKeys { return &hostKeys{host: map[string]string{}} }

// agent makes a key for host and issues its credential.
func (h *hostKeys) agent(t *testing.T, a *Authority, host string) (nkeys.KeyPair, string) {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	token, err := a.AgentJWT(host, pub, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.host[pub] = host
	h.mu.Unlock()
	return kp, token
}

// hostOf returns the host a key was made for.
func (h *hostKeys) hostOf(pub string) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	host, ok := h.host[pub]
	return host, ok
}

// connectAgent connects in process with the key kp and its credential.
func connectAgent(t *testing.T, connect func(...nats.Option) *nats.Conn, kp nkeys.KeyPair, token string) *nats.Conn {
	t.Helper()
	seed, _ := kp.Seed()
	return connect(nats.UserJWTAndSeed(token, string(seed)))
}
