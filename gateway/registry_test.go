package gateway

import (
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/enrol"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testClock is a settable clock for the registry's now field, safe for
// the goroutines of a hosts store.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newTestRegistry returns a registry with offlineAfter 15 s whose clock
// stands still until the test moves it.
func newTestRegistry() (*registry, *testClock) {
	clock := &testClock{t: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)}
	r := newRegistry(discardLogger(), 15*time.Second, enrol.NewIndex())
	r.now = clock.now
	return r, clock
}

// setLabels gives host labels in r's agent records, as an enrolment
// does.
func setLabels(r *registry, host string, labels map[string]string) {
	rev, _ := r.agents.Progress()
	r.agents.Apply(host, rev+1, &AgentRecord{Host: host, PublicKey: "U" + host, Labels: labels})
}

func announceOf(host string) protocol.Announce {
	return protocol.Announce{
		Host: host, Instance: "i-" + host, Protocol: protocol.Version, AgentVersion: "0.1.0",
		OS: "linux", Arch: "amd64", Cwd: "/srv", Shell: "/bin/bash",
		Tools: []string{"bash", "edit", "read", "write"}, HeartbeatMS: 5000, Limit: 16,
		TrustedKeys: []string{testGatewayKey().CurrentKeyID()},
	}
}

// presenceMsg is the message an agent publishes on subject with a as its
// payload.
func presenceMsg(t *testing.T, subject string, a protocol.Announce) *nats.Msg {
	t.Helper()
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: subject, Data: data}
}

func announce(t *testing.T, r *registry, a protocol.Announce) {
	t.Helper()
	r.onPresence(presenceMsg(t, protocol.PresenceSubject(a.Host), a))
}

func TestRegistryRecordsAnnounce(t *testing.T) {
	r, clock := newTestRegistry()
	a := announceOf("web-1")
	setLabels(r, "web-1", map[string]string{"role": "web"})
	a.Busy = 3
	announce(t, r, a)

	h, ok := r.get("web-1")
	if !ok {
		t.Fatal("announced host web-1 is not in the registry")
	}
	if !h.Online {
		t.Error("host is offline right after announcing")
	}
	if !h.LastSeen.Equal(clock.now()) {
		t.Errorf("LastSeen = %v, want the registry clock %v", h.LastSeen, clock.now())
	}
	if h.Host != "web-1" || h.OS != "linux" || h.Arch != "amd64" || h.Busy != 3 || h.Labels["role"] != "web" ||
		!slices.Equal(h.Tools, a.Tools) || h.HeartbeatMS != 5000 {
		t.Errorf("recorded %+v, want the announce %+v", h.Announce, a)
	}

	// A later announce replaces the earlier one and moves LastSeen.
	clock.advance(5 * time.Second)
	a.Busy = 7
	announce(t, r, a)
	if h, _ := r.get("web-1"); h.Busy != 7 || !h.LastSeen.Equal(clock.now()) {
		t.Errorf("after a second announce: Busy %d LastSeen %v, want 7 and %v", h.Busy, h.LastSeen, clock.now())
	}
	if n := len(r.list("")); n != 1 {
		t.Errorf("list has %d hosts after two announces of one host, want 1", n)
	}
}

func TestRegistryIgnoresBadAnnounces(t *testing.T) {
	valid := func(host string) []byte {
		data, _ := json.Marshal(announceOf(host))
		return data
	}
	tests := []struct {
		name    string
		subject string
		data    []byte
	}{
		{"payload host differs from subject", protocol.PresenceSubject("web-1"), valid("web-2")},
		{"payload host empty", protocol.PresenceSubject("web-1"), []byte(`{"host":"","os":"linux"}`)},
		{"malformed JSON", protocol.PresenceSubject("web-1"), []byte(`{"host":"web-1",`)},
		{"not an object", protocol.PresenceSubject("web-1"), []byte(`"web-1"`)},
		{"empty payload", protocol.PresenceSubject("web-1"), nil},
		{"wildcard in subject host", protocol.PresenceSubject("web*"), valid("web*")},
		{"dotted subject host", protocol.PresenceSubject("web.example.com"), valid("web.example.com")},
		{"subject host starts with dash", protocol.PresenceSubject("-web"), valid("-web")},
		{"subject host too long", protocol.PresenceSubject(string(make([]byte, 65))), valid(string(make([]byte, 65)))},
		{"not a presence subject", "other.subject", valid("other.subject")},
		{"presence prefix only", protocol.PresenceSubject(""), valid("")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newTestRegistry()
			r.onPresence(&nats.Msg{Subject: tc.subject, Data: tc.data})
			if hosts := r.list(""); len(hosts) != 0 {
				t.Errorf("announce on %q with %q was recorded: %+v", tc.subject, tc.data, hosts)
			}
		})
	}

	// An ignored announce leaves an existing entry alone.
	r, _ := newTestRegistry()
	announce(t, r, announceOf("web-1"))
	r.onPresence(&nats.Msg{Subject: protocol.PresenceSubject("web-1"), Data: []byte(`{"host":"web-1","os":`)})
	liar := announceOf("web-2")
	liar.Leaving = true
	r.onPresence(presenceMsg(t, protocol.PresenceSubject("web-1"), liar))
	if h, ok := r.get("web-1"); !ok || !h.Online || h.OS != "linux" {
		t.Errorf("bad announces changed web-1: %+v (found %v)", h, ok)
	}
	if _, ok := r.get("web-2"); ok {
		t.Error("an announce on web-1's subject created web-2")
	}
}

func TestRegistryLeaving(t *testing.T) {
	r, clock := newTestRegistry()
	announce(t, r, announceOf("web-1"))
	a := announceOf("web-1")
	a.Leaving = true
	announce(t, r, a)
	h, ok := r.get("web-1")
	if !ok {
		t.Fatal("a leaving host disappeared from the registry; it should be listed offline")
	}
	if h.Online {
		t.Error("host announced Leaving but is still online")
	}
	if l := r.list(""); len(l) != 1 || l[0].Online {
		t.Errorf("list after Leaving = %+v, want web-1 offline", l)
	}
	// It comes back with its next ordinary announce.
	clock.advance(time.Second)
	announce(t, r, announceOf("web-1"))
	if h, _ := r.get("web-1"); !h.Online {
		t.Error("host is still offline after announcing again")
	}
}

func TestRegistryOnline(t *testing.T) {
	// offlineAfter is 15 s; a host is online while now-LastSeen is at most
	// max(15 s, 3 × heartbeat).
	tests := []struct {
		name      string
		heartbeat time.Duration
		after     time.Duration
		online    bool
	}{
		{"just announced", 5 * time.Second, 0, true},
		{"within offlineAfter", 5 * time.Second, 14 * time.Second, true},
		{"exactly offlineAfter", 5 * time.Second, 15 * time.Second, true},
		{"past offlineAfter", 5 * time.Second, 15*time.Second + time.Millisecond, false},
		{"no heartbeat given", 0, 15 * time.Second, true},
		{"no heartbeat given, late", 0, 16 * time.Second, false},
		{"short heartbeat uses offlineAfter", time.Second, 14 * time.Second, true},
		{"short heartbeat, late", time.Second, 16 * time.Second, false},
		{"slow heartbeat: 3x rule keeps it online", 10 * time.Second, 29 * time.Second, true},
		{"slow heartbeat: exactly 3 beats", 10 * time.Second, 30 * time.Second, true},
		{"slow heartbeat: 3 beats missed", 10 * time.Second, 30*time.Second + time.Millisecond, false},
		{"very slow heartbeat", time.Minute, 2 * time.Minute, true},
		{"very slow heartbeat, late", time.Minute, 3*time.Minute + time.Second, false},
		{"negative heartbeat ignored", -time.Minute, 16 * time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, clock := newTestRegistry()
			a := announceOf("web-1")
			a.HeartbeatMS = tc.heartbeat.Milliseconds()
			announce(t, r, a)
			clock.advance(tc.after)
			h, ok := r.get("web-1")
			if !ok {
				t.Fatal("host not found")
			}
			if h.Online != tc.online {
				t.Errorf("heartbeat %s, last seen %s ago: get says online=%v, want %v", tc.heartbeat, tc.after, h.Online, tc.online)
			}
			if l := r.list(""); len(l) != 1 || l[0].Online != tc.online {
				t.Errorf("heartbeat %s, last seen %s ago: list = %+v, want online=%v", tc.heartbeat, tc.after, l, tc.online)
			}
		})
	}
}

func TestRegistryList(t *testing.T) {
	r, clock := newTestRegistry()
	var fleet []protocol.Announce
	for _, h := range []struct {
		host   string
		labels map[string]string
	}{
		{"web-2", map[string]string{"role": "web", "env": "prod"}},
		{"db-1", map[string]string{"role": "db", "env": "prod"}},
		{"web-1", map[string]string{"role": "web", "env": "staging"}},
		{"cache", nil},
		{"web-10", map[string]string{"role": "web"}},
	} {
		a := announceOf(h.host)
		setLabels(r, h.host, h.labels)
		fleet = append(fleet, a)
		announce(t, r, a)
	}
	// db-1 goes quiet: it must still be listed, as offline.
	clock.advance(10 * time.Second)
	for _, a := range fleet {
		if a.Host != "db-1" {
			announce(t, r, a)
		}
	}
	clock.advance(10 * time.Second)

	tests := []struct {
		filter string
		want   []string
	}{
		{"", []string{"cache", "db-1", "web-1", "web-10", "web-2"}},
		{"*", []string{"cache", "db-1", "web-1", "web-10", "web-2"}},
		{"web-*", []string{"web-1", "web-10", "web-2"}},
		{"web-?", []string{"web-1", "web-2"}},
		{"db-1", []string{"db-1"}},
		{"*-1", []string{"db-1", "web-1"}},
		{"nothing-*", nil},
		{"[", nil}, // malformed glob matches nothing
		{"role=web", []string{"web-1", "web-10", "web-2"}},
		{"role = web", []string{"web-1", "web-10", "web-2"}},
		{"env=prod", []string{"db-1", "web-2"}},
		{"role=db", []string{"db-1"}},
		{"role=", nil},
		{"role=we", nil},
		{"os=linux", nil}, // announce fields are not labels
	}
	for _, tc := range tests {
		got := r.list(tc.filter)
		var names []string
		for _, h := range got {
			names = append(names, h.Host)
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("list(%q) = %q, want %q", tc.filter, names, tc.want)
		}
		for _, h := range got {
			if want := h.Host != "db-1"; h.Online != want {
				t.Errorf("list(%q): %s online=%v, want %v", tc.filter, h.Host, h.Online, want)
			}
		}
	}
}

func TestRegistryGetReturnsCopy(t *testing.T) {
	r, clock := newTestRegistry()
	a := announceOf("web-1")
	setLabels(r, "web-1", map[string]string{"role": "web"})
	announce(t, r, a)

	if _, ok := r.get("web-2"); ok {
		t.Error("get of a host that never announced reports it found")
	}

	h, _ := r.get("web-1")
	h.OS = "plan9"
	h.Host = "changed"
	h.Busy = 99
	h.Online = false
	h.LastSeen = time.Time{}
	again, ok := r.get("web-1")
	if !ok || again.OS != "linux" || again.Host != "web-1" || again.Busy != 0 || !again.Online || !again.LastSeen.Equal(clock.now()) {
		t.Errorf("changing get's result changed the registry: %+v", again)
	}
	l := r.list("")
	l[0].OS = "plan9"
	l[0].Online = false
	if again, _ := r.get("web-1"); again.OS != "linux" || !again.Online {
		t.Errorf("changing list's result changed the registry: %+v", again)
	}

	// The copy is deep: its label map and tool list are its own, so a
	// caller that edits them neither corrupts the registry nor races with
	// other readers.
	h, _ = r.get("web-1")
	h.Labels["role"] = "db"
	h.Tools[0] = "rm"
	again, _ = r.get("web-1")
	if again.Labels["role"] != "web" {
		t.Errorf("editing the labels of get's result changed the registry: labels %v", again.Labels)
	}
	if again.Tools[0] != "bash" {
		t.Errorf("editing the tools of get's result changed the registry: tools %v", again.Tools)
	}
	l = r.list("")
	l[0].Labels["role"] = "cache"
	if again, _ := r.get("web-1"); again.Labels["role"] != "web" {
		t.Errorf("editing the labels of list's result changed the registry: labels %v", again.Labels)
	}
}

// Labels an agent announces for itself are ignored: a host's labels, for
// the listing and for selectors, are those of its agent record, so an
// agent cannot move itself into or out of a selector (env!=prod). A
// revoked host is listed as revoked.
func TestRegistryLabelsFromRecords(t *testing.T) {
	r, _ := newTestRegistry()
	setLabels(r, "web-1", map[string]string{"env": "prod"})
	a := announceOf("web-1")
	a.Labels = map[string]string{"env": "staging", "role": "db"}
	announce(t, r, a)
	b := announceOf("web-2") // announced, never enrolled
	b.Labels = map[string]string{"env": "staging"}
	announce(t, r, b)

	h, _ := r.get("web-1")
	if !maps.Equal(h.Labels, map[string]string{"env": "prod"}) {
		t.Errorf("web-1 has labels %v; want its record's env=prod", h.Labels)
	}
	if h, _ := r.get("web-2"); len(h.Labels) != 0 {
		t.Errorf("web-2, which has no record, has labels %v; want none", h.Labels)
	}
	for filter, want := range map[string][]string{
		"env=staging": nil, "env!=prod": {"web-2"}, "role=db": nil, "env=prod": {"web-1"},
	} {
		var got []string
		for _, h := range r.list(filter) {
			got = append(got, h.Host)
		}
		if !slices.Equal(got, want) {
			t.Errorf("list(%q) = %v, want %v", filter, got, want)
		}
	}
	// The record changes: at once, without an announce.
	setLabels(r, "web-1", map[string]string{"env": "staging"})
	if l := r.list("env=staging"); len(l) != 1 || l[0].Host != "web-1" {
		t.Errorf("after the record changed, env=staging lists %v", l)
	}
	rev, _ := r.agents.Progress()
	r.agents.Apply("web-1", rev+1, &AgentRecord{Host: "web-1", PublicKey: "Uweb-1", RevokedAt: time.Now()})
	if h, _ := r.get("web-1"); !h.Revoked {
		t.Error("web-1 is revoked in its record but not in the registry")
	}
}
