package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/enrol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/gwtest"
)

// startJetStream runs a NATS server with JetStream, its state in a
// temporary directory, until the test ends.
func startJetStream(t *testing.T) *server.Server {
	t.Helper()
	return natstest.StartJetStream(t, nil)
}

// replica is one gateway's registry and hosts store, on its own
// connection. Its store writes only when the test calls flush.
type replica struct {
	reg   *registry
	store *hostStore
}

func newReplica(t *testing.T, ns *server.Server, clock *testClock, retention time.Duration) *replica {
	t.Helper()
	reg := newRegistry(discardLogger(), 15*time.Second, enrol.NewIndex())
	reg.now = clock.now
	s, err := newHostStore(connectNATS(t, ns, "gateway"), reg, HostsConfig{Retention: retention, Replicas: 1}, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return &replica{reg: reg, store: s}
}

func newClock() *testClock { return &testClock{t: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)} }

// entry returns a copy of the replica's entry for host.
func (rp *replica) entry(host string) (hostEntry, bool) {
	rp.reg.mu.RLock()
	defer rp.reg.mu.RUnlock()
	e := rp.reg.hosts[host]
	if e == nil {
		return hostEntry{}, false
	}
	return *e, true
}

// fleetAnnounce is an announce as a real agent sends it: a start time in
// its own time zone, labels, skills.
func fleetAnnounce(host string) protocol.Announce {
	a := announceOf(host)
	a.Instance = "i-" + host
	a.Labels = map[string]string{"role": "web", "region": "eu-west"}
	a.StartedAt = time.Date(2025, 3, 4, 7, 0, 0, 123456789, time.FixedZone("", 2*3600))
	a.PolicyDigest = "sha256:" + strings.Repeat("ab", 32)
	a.Skills = []protocol.Skill{
		{Name: "deploy", Description: "Deploy the app to this host.", Path: "/srv/.agents/skills/deploy/SKILL.md"},
		{Name: "broken", Path: "/srv/.agents/skills/broken/SKILL.md", Problem: "description is missing"},
	}
	return a
}

func bucket(t *testing.T, ns *server.Server) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(connectNATS(t, ns, "inspector"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	kv, err := js.KeyValue(ctx, protocol.HostsBucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// record returns the bucket's record of host.
func record(t *testing.T, kv jetstream.KeyValue, host string) (hostRecord, uint64) {
	t.Helper()
	e, err := kv.Get(context.Background(), host)
	if err != nil {
		t.Fatalf("bucket record of %s: %v", host, err)
	}
	var rec hostRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatalf("bucket record of %s: %v", host, err)
	}
	return rec, e.Revision()
}

// waitSynced waits until every replica has seen the bucket's current
// revision of host.
func waitSynced(t *testing.T, kv jetstream.KeyValue, host string, reps ...*replica) {
	t.Helper()
	_, rev := record(t, kv, host)
	deadline := time.Now().Add(waitFor)
	for _, rp := range reps {
		for {
			if e, ok := rp.entry(host); ok && e.rev >= rev {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("a replica did not see revision %d of %s within %s", rev, host, waitFor)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

func writes(reps ...*replica) int64 {
	var n int64
	for _, rp := range reps {
		n += rp.store.writes.Load()
	}
	return n
}

// waitUntil waits (up to waitFor) until cond holds.
func waitUntil(t *testing.T, what string, cond func() bool) { gwtest.WaitUntil(t, waitFor, what, cond) }

// TestHostStoreSteadyState: two replicas hearing the same fleet write each
// host once between them, heartbeats (with changing busy counts) write
// nothing, and a change of facts writes once.
func TestHostStoreSteadyState(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	a, b := newReplica(t, ns, clock, -1), newReplica(t, ns, clock, -1)
	kv := bucket(t, ns)
	const n = 20
	fleet := make([]protocol.Announce, n)
	for i := range fleet {
		fleet[i] = fleetAnnounce(fmt.Sprintf("web-%d", i))
		announce(t, a.reg, fleet[i])
		announce(t, b.reg, fleet[i])
	}
	a.store.flush()
	b.store.flush() // finds the records written, or loses the race to write them
	for _, h := range fleet {
		waitSynced(t, kv, h.Host, a, b)
	}
	a.store.flush()
	b.store.flush()
	if w := writes(a, b); w != n {
		t.Fatalf("%d hosts announced to two replicas: %d records written, want %d (races: %d, %d)", n, w, n, a.store.races.Load(), b.store.races.Load())
	}

	// Ten minutes of heartbeats, busy counts changing.
	for i := range 120 {
		clock.advance(5 * time.Second)
		for _, h := range fleet {
			h.Busy = i % 3
			announce(t, a.reg, h)
			announce(t, b.reg, h)
		}
		if i%10 == 0 {
			a.store.flush()
			b.store.flush()
		}
	}
	a.store.flush()
	b.store.flush()
	if w := writes(a, b); w != n {
		t.Fatalf("heartbeats wrote %d records; want none", w-n)
	}
	if h, _ := a.reg.get("web-3"); h.Busy != 119%3 || !h.Online {
		t.Errorf("web-3 busy %d online %v, want the last heartbeat's busy %d, online", h.Busy, h.Online, 119%3)
	}

	// New facts: written once.
	fleet[3].AgentVersion = "0.2.0"
	announce(t, a.reg, fleet[3])
	announce(t, b.reg, fleet[3])
	b.store.flush()
	a.store.flush()
	waitSynced(t, kv, "web-3", a, b)
	a.store.flush()
	b.store.flush()
	if w := writes(a, b); w != n+1 {
		t.Fatalf("a change of facts wrote %d records, want 1", w-n)
	}
	if rec, _ := record(t, kv, "web-3"); rec.Announce.AgentVersion != "0.2.0" || rec.Announce.Busy != 0 {
		t.Errorf("record of web-3 after the change: agent version %q busy %d", rec.Announce.AgentVersion, rec.Announce.Busy)
	}
	// Labels an agent announces are not its to choose: a change of them
	// writes nothing, and the bucket never holds them.
	fleet[3].Labels = map[string]string{"role": "db"}
	announce(t, a.reg, fleet[3])
	announce(t, b.reg, fleet[3])
	a.store.flush()
	b.store.flush()
	if w := writes(a, b); w != n+1 {
		t.Errorf("a change of announced labels wrote %d records, want none", w-n-1)
	}
	if rec, _ := record(t, kv, "web-3"); rec.Announce.Labels != nil {
		t.Errorf("the bucket holds the labels web-3 announced: %v", rec.Announce.Labels)
	}
}

// TestHostStoreSharesFacts: a replica that never heard a host knows it,
// offline, with the facts another replica heard, and one that starts later
// loads it from the bucket.
func TestHostStoreSharesFacts(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	a, b := newReplica(t, ns, clock, -1), newReplica(t, ns, clock, -1)
	kv := bucket(t, ns)
	ann := fleetAnnounce("web-1")
	heard := clock.now()
	announce(t, a.reg, ann)
	a.store.flush()
	waitSynced(t, kv, "web-1", b)

	check := func(who string, rp *replica) {
		t.Helper()
		h, ok := rp.reg.get("web-1")
		switch {
		case !ok:
			t.Fatalf("%s does not know web-1", who)
		case h.Online:
			t.Errorf("%s shows web-1 online without hearing it", who)
		case !h.LastSeen.Equal(heard):
			t.Errorf("%s: web-1 last seen %v, want %v", who, h.LastSeen, heard)
		case h.Cwd != "/srv" || len(h.Skills) != 2 || h.Skills[1].Problem == "" || !h.StartedAt.Equal(ann.StartedAt):
			t.Errorf("%s: web-1 facts %+v, want those announced %+v", who, h.Announce, ann)
		case h.Labels != nil:
			t.Errorf("%s: web-1 has the labels it announced, %v", who, h.Labels)
		}
		if l := rp.reg.list("web-*"); len(l) != 1 || l[0].Host != "web-1" {
			t.Errorf("%s: selector web-* found %v", who, l)
		}
	}
	check("a replica that did not hear it", b)

	// The agent leaves; a replica started afterwards still knows the host.
	ann.Leaving = true
	announce(t, a.reg, ann)
	a.store.flush()
	c := newReplica(t, ns, clock, -1)
	check("a replica started later", c)
	if w := writes(a, b, c); w != 1 {
		t.Errorf("%d records written, want 1", w)
	}
}

// TestHostStoreLastSeenWhenOffline: the record's last-seen is rewritten
// once when a host goes quiet, not on its heartbeats.
func TestHostStoreLastSeenWhenOffline(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	a, b := newReplica(t, ns, clock, -1), newReplica(t, ns, clock, -1)
	kv := bucket(t, ns)
	ann := fleetAnnounce("web-1")
	announce(t, a.reg, ann)
	a.store.flush()
	for i := range 120 {
		clock.advance(5 * time.Second)
		announce(t, a.reg, ann)
		if i%12 == 0 {
			a.store.flush()
		}
	}
	last := clock.now()
	a.store.flush()
	if w := writes(a); w != 1 {
		t.Fatalf("ten minutes of heartbeats: %d writes, want 1", w)
	}
	clock.advance(15 * time.Second)
	a.store.flush()
	if w := writes(a); w != 1 {
		t.Fatalf("host not yet offline: %d writes, want 1", w)
	}
	clock.advance(time.Millisecond)
	if h, _ := a.reg.get("web-1"); h.Online {
		t.Fatal("web-1 still online 15 s after its last heartbeat")
	}
	a.store.flush()
	a.store.flush()
	if w := writes(a); w != 2 {
		t.Fatalf("host went offline: %d writes, want 2", w)
	}
	if rec, _ := record(t, kv, "web-1"); !rec.LastSeen.Equal(last) {
		t.Errorf("record last seen %v, want the last heartbeat %v", rec.LastSeen, last)
	}
	waitSynced(t, kv, "web-1", b)
	if h, _ := b.reg.get("web-1"); !h.LastSeen.Equal(last) || h.Online {
		t.Errorf("other replica: web-1 last seen %v online %v, want %v, offline", h.LastSeen, h.Online, last)
	}
}

// TestHostStoreRefresh: an online host's record is rewritten about hourly.
func TestHostStoreRefresh(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	a := newReplica(t, ns, clock, -1)
	ann := fleetAnnounce("web-1")
	announce(t, a.reg, ann)
	a.store.flush()
	step := 5 * time.Minute
	for elapsed := time.Duration(0); elapsed < seenRefresh*5/4+2*step; elapsed += step {
		clock.advance(step)
		announce(t, a.reg, ann)
		a.store.flush()
	}
	if w := writes(a); w != 2 {
		t.Errorf("%s online: %d writes, want 2 (the first and one refresh)", seenRefresh*5/4+2*step, w)
	}
}

// TestHostStoreForgets: a host offline for longer than the retention is
// removed from the bucket and every replica, and comes back when it
// announces again.
func TestHostStoreForgets(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	a, b := newReplica(t, ns, clock, 2*time.Hour), newReplica(t, ns, clock, 2*time.Hour)
	kv := bucket(t, ns)
	ann := fleetAnnounce("web-1")
	announce(t, a.reg, ann)
	announce(t, a.reg, fleetAnnounce("web-2"))
	a.store.flush()
	waitSynced(t, kv, "web-1", b)
	left := ann
	left.Leaving = true
	announce(t, a.reg, left)
	clock.advance(time.Hour)
	announce(t, a.reg, fleetAnnounce("web-2"))
	a.store.flush()
	b.store.flush()
	if _, ok := b.reg.get("web-1"); !ok {
		t.Fatal("web-1 forgotten after an hour; retention is two")
	}
	clock.advance(time.Hour + time.Minute)
	announce(t, a.reg, fleetAnnounce("web-2"))
	a.store.flush()
	b.store.flush()
	if _, err := kv.Get(context.Background(), "web-1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("bucket record of web-1 after the retention: %v, want none", err)
	}
	waitUntil(t, "both replicas forget web-1", func() bool {
		_, okA := a.reg.get("web-1")
		_, okB := b.reg.get("web-1")
		return !okA && !okB
	})
	if h, ok := a.reg.get("web-2"); !ok || !h.Online {
		t.Error("web-2, online throughout, was forgotten")
	}
	if _, ok := b.reg.get("web-2"); !ok {
		t.Error("web-2, online throughout, was forgotten by the replica that did not hear it")
	}
	if w := writes(a, b); w != 4 {
		t.Errorf("%d writes and removals, want 4 (two records, web-2's refresh after two hours, one removal)", w)
	}

	// It comes back.
	announce(t, a.reg, ann)
	a.store.flush()
	waitUntil(t, "the other replica sees web-1 again", func() bool { _, ok := b.reg.get("web-1"); return ok })
}

// TestHostStoreConflict: while two agents claim one name, its record is
// left alone; afterwards the remaining agent's facts are written.
func TestHostStoreConflict(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	a := newReplica(t, ns, clock, -1)
	kv := bucket(t, ns)
	one, two := fleetAnnounce("web-1"), fleetAnnounce("web-1")
	one.Instance, one.Cwd = "i-1", "/one"
	two.Instance, two.Cwd = "i-2", "/two"
	announce(t, a.reg, one)
	announce(t, a.reg, two)
	a.store.flush()
	if w := writes(a); w != 0 {
		t.Fatalf("conflicting host: %d writes, want none", w)
	}
	two.Leaving = true
	announce(t, a.reg, two)
	clock.advance(5 * time.Second)
	announce(t, a.reg, one)
	if h, _ := a.reg.get("web-1"); h.Cwd != "/one" || h.Conflict != "" || !h.Online {
		t.Errorf("after the second agent left: cwd %q conflict %q online %v, want the first agent's facts", h.Cwd, h.Conflict, h.Online)
	}
	a.store.flush()
	if rec, _ := record(t, kv, "web-1"); rec.Announce.Cwd != "/one" || rec.Announce.Instance != "i-1" {
		t.Errorf("record after the conflict: %+v", rec.Announce)
	}
}

// TestHostStoreDamagedRecords: records that are not JSON, name another
// host, or sit under a key that is no host name are ignored; a replica that
// hears the host writes a good record over a damaged one.
func TestHostStoreDamagedRecords(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	first := newReplica(t, ns, clock, -1) // creates the bucket
	kv := bucket(t, ns)
	other, _ := json.Marshal(hostRecord{Announce: &protocol.Announce{Host: "web-9"}})
	good, _ := json.Marshal(hostRecord{Announce: &protocol.Announce{Host: "web-5"}})
	for _, kvp := range []struct {
		key   string
		value []byte
	}{
		{"web-1", []byte("{not json")}, {"web-2", other}, {"web.3", other}, {"web-4", []byte(`{"last_seen":"2025-01-01T00:00:00Z"}`)},
		{"web-5", good}, // last, so that a replica that has it has seen the others
	} {
		if _, err := kv.Put(context.Background(), kvp.key, kvp.value); err != nil {
			t.Fatal(err)
		}
	}
	a := newReplica(t, ns, clock, -1)
	for _, rp := range []*replica{first, a} {
		waitSynced(t, kv, "web-5", rp)
		if l := rp.reg.list(""); len(l) != 1 || l[0].Host != "web-5" {
			t.Fatalf("damaged records made hosts: %+v", l)
		}
	}
	announce(t, a.reg, fleetAnnounce("web-1"))
	a.store.flush()
	if rec, _ := record(t, kv, "web-1"); rec.Announce == nil || rec.Announce.Host != "web-1" {
		t.Fatalf("damaged record not replaced: %+v", rec)
	}
	waitUntil(t, "the other replica takes in the good record", func() bool { _, ok := first.reg.get("web-1"); return ok })
}

// TestRegistrySharesStrings: hosts with the same skills share their text.
func TestRegistrySharesStrings(t *testing.T) {
	r, _ := newTestRegistry()
	announce(t, r, fleetAnnounce("web-1"))
	announce(t, r, fleetAnnounce("web-2"))
	r.mu.RLock()
	defer r.mu.RUnlock()
	d1, d2 := r.hosts["web-1"].facts.Skills[0].Description, r.hosts["web-2"].facts.Skills[0].Description
	if unsafe.StringData(d1) != unsafe.StringData(d2) {
		t.Error("two hosts with the same skill keep two copies of its description")
	}
	for k := range r.hosts["web-1"].facts.Labels {
		if _, ok := r.hosts["web-2"].facts.Labels[k]; !ok {
			t.Errorf("label %q missing", k)
		}
	}
}

// TestRegistryMemoryPerHost measures the registry's memory per host with a
// realistic announce (12 skills, 8 tools, 4 labels) after heartbeats.
func TestRegistryMemoryPerHost(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 2,000 hosts")
	}
	const hosts = 2000
	base := fleetAnnounce("x")
	base.Tools = []string{"bash", "edit", "read", "write", "skill", "list", "search", "patch"}
	base.Labels = map[string]string{"role": "web", "env": "prod", "region": "eu-west", "team": "payments"}
	base.Skills = nil
	for i := range 12 {
		base.Skills = append(base.Skills, protocol.Skill{Name: fmt.Sprintf("skill-%d", i),
			Description: strings.Repeat(fmt.Sprintf("Skill %d does a thing. ", i), 15), Path: fmt.Sprintf("/srv/.agents/skills/skill-%d/SKILL.md", i)})
	}
	msgs := make([][]byte, hosts)
	for i := range msgs {
		a := base
		a.Host, a.Instance, a.Hostname = fmt.Sprintf("web-%05d", i), fmt.Sprintf("inst-%05d", i), fmt.Sprintf("web-%05d.example.com", i)
		msgs[i], _ = json.Marshal(a)
	}
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	r, clock := newTestRegistry()
	before := heap()
	for beat := range 3 {
		for i, data := range msgs {
			r.onPresence(presenceMsgData(fmt.Sprintf("web-%05d", i), data))
		}
		clock.advance(5 * time.Second)
		_ = beat
	}
	after := heap()
	per := float64(after-before) / hosts
	t.Logf("registry: %.0f bytes per host (announce of %d bytes, 12 skills)", per, len(msgs[0]))
	if per > 4096 {
		t.Errorf("registry keeps %.0f bytes per host; want at most 4 KiB", per)
	}
	runtime.KeepAlive(r)
}

func presenceMsgData(host string, data []byte) *nats.Msg {
	return &nats.Msg{Subject: protocol.PresenceSubject(host), Data: data}
}

// BenchmarkRegistryHeartbeat is the cost of one heartbeat whose facts did
// not change, the registry's hot path.
func BenchmarkRegistryHeartbeat(b *testing.B) {
	r, _ := newTestRegistry()
	a := fleetAnnounce("web-1")
	for i := range 12 {
		a.Skills = append(a.Skills, protocol.Skill{Name: fmt.Sprintf("skill-%d", i),
			Description: strings.Repeat("Does a thing. ", 20), Path: fmt.Sprintf("/srv/.agents/skills/skill-%d/SKILL.md", i)})
	}
	data, _ := json.Marshal(a)
	m := presenceMsgData("web-1", data)
	r.onPresence(m)
	b.ReportAllocs()
	for b.Loop() {
		r.onPresence(m)
	}
}

// TestHostStoreSurvivesNATSRestart: after the NATS server restarts, the
// watch still brings other replicas' records, and writes resume. (Left
// to itself, the watch's consumer would notice the restart by missed
// heartbeats about 20 s later; the store starts a new watch on reconnect.)
func TestHostStoreSurvivesNATSRestart(t *testing.T) {
	dir := t.TempDir()
	opts := func(port int) *server.Options {
		return &server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true, JetStream: true, StoreDir: dir}
	}
	start := func(port int) *server.Server {
		ns, err := server.NewServer(opts(port))
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("NATS server not ready")
		}
		return ns
	}
	ns := start(-1)
	port := ns.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() }) // after the replicas' cleanups

	clock := newClock()
	replicaOn := func() *replica {
		nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		reg := newRegistry(discardLogger(), 15*time.Second, enrol.NewIndex())
		reg.now = clock.now
		s, err := newHostStore(nc, reg, HostsConfig{Retention: -1, Replicas: 1}, discardLogger())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.close)
		return &replica{reg: reg, store: s}
	}
	a, b := replicaOn(), replicaOn()
	announce(t, a.reg, fleetAnnounce("web-1"))
	a.store.flush()
	waitUntil(t, "b sees web-1", func() bool { _, ok := b.reg.get("web-1"); return ok })

	ns.Shutdown()
	ns.WaitForShutdown()
	ns = start(port)
	restarted := time.Now()

	announce(t, a.reg, fleetAnnounce("web-2"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		a.store.flush()
		if _, ok := b.reg.get("web-2"); ok {
			t.Logf("the other replica saw web-2 %s after the restart", time.Since(restarted).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a NATS restart, the other replica never saw web-2 (writes %d)", writes(a))
		}
		clock.advance(holdAfterFailure) // a failed write is held; retry now
		announce(t, a.reg, fleetAnnounce("web-2"))
		time.Sleep(200 * time.Millisecond)
	}
}

// TestHostStoreCloseLeavesNoGoroutines: a store that was watching and
// writing leaves nothing running once closed.
func TestHostStoreCloseLeavesNoGoroutines(t *testing.T) {
	ns := startJetStream(t)
	nc := connectNATS(t, ns, "gateway")
	var base int
	for i := range 4 {
		if i == 1 { // the bucket exists now, with the server's goroutines for it
			time.Sleep(100 * time.Millisecond)
			base = runtime.NumGoroutine()
		}
		reg := newRegistry(discardLogger(), 15*time.Second, enrol.NewIndex())
		s, err := openHostStore(nc, reg, HostsConfig{Retention: -1, Replicas: 1}, discardLogger())
		if err != nil {
			t.Fatal(err)
		}
		announce(t, reg, fleetAnnounce(fmt.Sprintf("web-%d", i)))
		waitUntil(t, "the store writes the host", func() bool { return s.writes.Load() == 1 })
		s.close()
	}
	deadline := time.Now().Add(waitFor)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
