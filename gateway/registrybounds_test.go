package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/loglimit"
)

// logCounter is a slog handler that counts the lines and bytes logged.
type logCounter struct {
	mu    sync.Mutex
	lines int
	bytes int
	last  string
}

func (c *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return c }
func (c *logCounter) WithGroup(string) slog.Handler            { return c }
func (c *logCounter) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	h := slog.NewTextHandler(&b, nil)
	_ = h.Handle(context.Background(), r)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines++
	c.bytes += b.Len()
	c.last = b.String()
	return nil
}

func (c *logCounter) counts() (lines, bytes int, last string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lines, c.bytes, c.last
}

// TestRegistryRefusesOversizedAnnounces: an announce with any field
// beyond the protocol's limits — or one that only grows beyond them once
// re-encoded — is ignored whole: no host, no memory, and one log line per
// agent a minute however many arrive, quoting at most about 100 bytes of
// the value.
func TestRegistryRefusesOversizedAnnounces(t *testing.T) {
	huge := strings.Repeat("x", 900<<10)
	escapes := make([]protocol.Skill, 60)
	for i := range escapes {
		escapes[i] = protocol.Skill{Name: fmt.Sprintf("s%d", i), Description: strings.Repeat("<", protocol.MaxSkillDescriptionLen), Path: "/p"}
	}
	tests := []struct {
		name string
		mod  func(*protocol.Announce)
		raw  []byte // instead of the announce
	}{
		{name: "cwd of 900 KB", mod: func(a *protocol.Announce) { a.Cwd = huge }},
		{name: "cwd one byte too long", mod: func(a *protocol.Announce) { a.Cwd = strings.Repeat("c", protocol.MaxPathLen+1) }},
		{name: "hostname", mod: func(a *protocol.Announce) { a.Hostname = huge[:100000] }},
		{name: "agent version", mod: func(a *protocol.Announce) { a.AgentVersion = huge[:1000] }},
		{name: "os", mod: func(a *protocol.Announce) { a.OS = huge[:1000] }},
		{name: "shell", mod: func(a *protocol.Announce) { a.Shell = huge[:100000] }},
		{name: "instance", mod: func(a *protocol.Announce) { a.Instance = huge[:1000] }},
		{name: "policy digest", mod: func(a *protocol.Announce) { a.PolicyDigest = huge[:1000] }},
		{name: "label value", mod: func(a *protocol.Announce) { a.Labels = map[string]string{"k": huge[:100000]} }},
		{name: "label key", mod: func(a *protocol.Announce) { a.Labels = map[string]string{huge[:100000]: "v"} }},
		{name: "many labels", mod: func(a *protocol.Announce) {
			a.Labels = map[string]string{}
			for i := range 10000 {
				a.Labels[fmt.Sprint(i)] = "v"
			}
		}},
		{name: "many tools", mod: func(a *protocol.Announce) { a.Tools = strings.Fields(strings.Repeat("t ", 10000)) }},
		{name: "tool name", mod: func(a *protocol.Announce) { a.Tools = []string{huge[:1000]} }},
		{name: "many skills", mod: func(a *protocol.Announce) {
			a.Skills = make([]protocol.Skill, protocol.MaxSkills+1)
			for i := range a.Skills {
				a.Skills[i].Name = fmt.Sprint(i)
			}
		}},
		{name: "skill description", mod: func(a *protocol.Announce) {
			a.Skills = []protocol.Skill{{Name: "s", Description: huge[:100000]}}
		}},
		{name: "skill problem", mod: func(a *protocol.Announce) { a.Skills = []protocol.Skill{{Name: "s", Problem: huge[:100000]}} }},
		{name: "grows beyond the limit once escaped", mod: func(a *protocol.Announce) { a.Skills = escapes }},
		{name: "host of 900 KB in the payload", mod: func(a *protocol.Announce) { a.Host = huge }},
		{name: "message of 900 KB", raw: []byte(`{"host":"web-1","x":"` + huge + `"}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newTestRegistry()
			logs := &logCounter{}
			r.log = slog.New(logs)
			// One window for the whole flood, however slow the machine.
			r.rejects = loglimit.New(time.Hour, 1)
			data := tc.raw
			if data == nil {
				a := announceOf("web-1")
				tc.mod(&a)
				data, _ = json.Marshal(a)
				if tc.name == "grows beyond the limit once escaped" {
					// Sent with the characters raw, as a rogue agent
					// may: it arrives within the limit.
					data = bytes.ReplaceAll(data, []byte(`\u003c`), []byte("<"))
					if len(data) > protocol.MaxAnnounceBytes {
						t.Fatalf("test announce of %d bytes is over the limit already", len(data))
					}
				}
			}
			for range 200 {
				r.onPresence(presenceMsgData("web-1", data))
			}
			if hosts := r.list(""); len(hosts) != 0 {
				t.Fatalf("oversized announce recorded: %d hosts", len(hosts))
			}
			if m := r.memory(); m != 0 {
				t.Errorf("registry holds %d bytes after refusing every announce", m)
			}
			lines, n, last := logs.counts()
			if lines != 1 || n > 1000 {
				t.Errorf("200 refused announces logged %d lines, %d bytes; want 1 line quoting the value cut short: %s", lines, n, last)
			}
		})
	}
}

// TestRegistryMemoryBounded: an agent that keeps changing its facts (a
// different working directory on every announce) leaves the registry
// holding one set of facts, not every one it ever sent; and no host can
// take the registry beyond its bound.
func TestRegistryMemoryBounded(t *testing.T) {
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	r, _ := newTestRegistry()
	announce(t, r, announceOf("web-1"))
	base, before := r.memory(), heap()
	for i := range 3000 {
		a := announceOf("web-1")
		a.Cwd = fmt.Sprintf("/%d/%s", i, strings.Repeat("d", protocol.MaxPathLen-10))
		announce(t, r, a)
	}
	grown, heapGrown := r.memory()-base, heap()-before
	t.Logf("after 3,000 announces with a different 4 KiB cwd: registry +%d bytes by its count, heap +%d bytes", grown, heapGrown)
	if grown > 2*protocol.MaxPathLen || heapGrown > 1<<20 {
		t.Errorf("changed facts left the registry holding +%d bytes (heap +%d); want the last facts only", grown, heapGrown)
	}
	runtime.KeepAlive(r)

	// A registry full to its bound refuses new hosts and facts that grow,
	// but takes facts that shrink.
	r, _ = newTestRegistry()
	logs := &logCounter{}
	r.log = slog.New(logs)
	r.maxBytes = 200 << 10
	big := func(host string, n int) protocol.Announce {
		a := announceOf(host)
		a.Skills = make([]protocol.Skill, n)
		for i := range a.Skills {
			a.Skills[i] = protocol.Skill{Name: fmt.Sprintf("%s-%d", host, i), Description: strings.Repeat("d", 1000)}
		}
		return a
	}
	admitted := 0
	for i := range 100 {
		host := fmt.Sprintf("web-%d", i)
		announce(t, r, big(host, 20))
		if _, ok := r.get(host); ok {
			admitted++
		}
	}
	if m := r.memory(); m > r.maxBytes {
		t.Errorf("registry holds %d bytes, beyond its bound of %d", m, r.maxBytes)
	}
	if admitted == 0 || admitted == 100 {
		t.Fatalf("%d of 100 hosts admitted under a 200 KiB bound", admitted)
	}
	// One line per host: "online" for those admitted, "full" for the rest.
	if lines, _, last := logs.counts(); !strings.Contains(last, "--hosts_max_mib") || lines > 100 {
		t.Errorf("%d lines logged; last %s", lines, last)
	}
	announce(t, r, big("web-0", 30))
	if h, _ := r.get("web-0"); len(h.Skills) != 20 {
		t.Errorf("facts that grow beyond the bound were taken: %d skills", len(h.Skills))
	}
	announce(t, r, big("web-0", 2))
	if h, _ := r.get("web-0"); len(h.Skills) != 2 {
		t.Errorf("facts that shrink were refused: %d skills", len(h.Skills))
	}
}

// TestRegistryBoundsInstances: an agent announcing a new instance ID on
// every heartbeat is a conflict, whose instance list stays short.
func TestRegistryBoundsInstances(t *testing.T) {
	r, _ := newTestRegistry()
	logs := &logCounter{}
	r.log = slog.New(logs)
	for i := range 5000 {
		a := announceOf("web-1")
		a.Instance = fmt.Sprintf("i-%d", i)
		announce(t, r, a)
	}
	h, _ := r.get("web-1")
	if h.Conflict == "" || len(h.Conflict) > 20*maxInstances+100 {
		t.Errorf("conflict = %q", h.Conflict)
	}
	r.mu.RLock()
	n := len(r.hosts["web-1"].instances)
	r.mu.RUnlock()
	if n > maxInstances {
		t.Errorf("%d instances kept, want at most %d", n, maxInstances)
	}
	if lines, bytes, _ := logs.counts(); lines > 12 || bytes > 12<<10 {
		t.Errorf("5000 conflicting announces logged %d lines, %d bytes", lines, bytes)
	}
}

func presenceFlood(r *registry, subject string, data []byte, n int) {
	for range n {
		r.onPresence(&nats.Msg{Subject: subject, Data: data})
	}
}

// TestRegistryMalformedFlood: 20,000 malformed messages cost one log line
// per agent a minute.
func TestRegistryMalformedFlood(t *testing.T) {
	r, _ := newTestRegistry()
	logs := &logCounter{}
	r.log = slog.New(logs)
	r.rejects = loglimit.New(time.Hour, 1)
	presenceFlood(r, protocol.PresenceSubject("web-1"), []byte(`{"host":"web-1","cwd":`+strings.Repeat("9", 10000)), 20000)
	presenceFlood(r, protocol.PresenceSubject("web-2"), []byte(`not json at all`), 20000)
	if lines, n, last := logs.counts(); lines != 2 || n > 2000 {
		t.Errorf("40,000 malformed messages from 2 agents logged %d lines, %d bytes; last %s", lines, n, last)
	}
}

// TestHostStoreBoundsRecords: the hosts bucket stores no record larger
// than an announce may be, and a record within that size whose announce
// breaks a limit (written by a gateway that did not check it) is ignored
// as damaged.
func TestHostStoreBoundsRecords(t *testing.T) {
	ns := startJetStream(t)
	clock := newClock()
	rp := newReplica(t, ns, clock, -1)
	kv := bucket(t, ns)
	huge, _ := json.Marshal(hostRecord{Announce: &protocol.Announce{Host: "web-1", Cwd: strings.Repeat("x", 900<<10)}})
	if _, err := kv.Put(context.Background(), "web-1", huge); err == nil {
		t.Error("the bucket stored a record of 900 KB")
	}
	long, _ := json.Marshal(hostRecord{Announce: &protocol.Announce{Host: "web-2", Cwd: strings.Repeat("x", protocol.MaxPathLen+1)}})
	good, _ := json.Marshal(hostRecord{Announce: &protocol.Announce{Host: "web-3"}})
	for _, kvp := range []struct {
		key   string
		value []byte
	}{{"web-2", long}, {"web-3", good}} {
		if _, err := kv.Put(context.Background(), kvp.key, kvp.value); err != nil {
			t.Fatal(err)
		}
	}
	waitSynced(t, kv, "web-3", rp)
	if l := rp.reg.list(""); len(l) != 1 || l[0].Host != "web-3" {
		t.Fatalf("hosts from the bucket: %+v", l)
	}
}
