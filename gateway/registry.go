package gateway

import (
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is the host registry: what this gateway knows about each
// host, from the presence messages (announce and heartbeat) every gateway
// replica hears directly, and from the hosts bucket the replicas share
// (hoststore.go), which tells a replica about hosts it has not heard
// itself: hosts that went offline before it started, and their labels.
//
// Whether a host is online is decided by each replica from the heartbeats
// it hears, never from the bucket: a host is online while one of its agent
// instances was heard within its offline bound (see offlineBound), so
// replicas hearing the same heartbeats agree, and a host that stops
// heartbeating is offline everywhere at most that long after its last
// heartbeat.

// HostInfo is what the gateway knows about one host. Its Labels are the
// host's labels in its agent record (set by the operator), never those an
// agent announces.
type HostInfo struct {
	protocol.Announce
	LastSeen time.Time `json:"last_seen"`
	Online   bool      `json:"online"`
	// Revoked is set when the host's agent was revoked: it cannot
	// connect, and calls to it are refused.
	Revoked bool `json:"revoked,omitempty"`
	// Conflict is set when more than one agent process currently announces
	// this host name; calls to it are refused until only one is left.
	Conflict string `json:"conflict,omitempty"`
}

// clone returns a copy that shares no maps or slices with h.
func (h *HostInfo) clone() HostInfo {
	c := *h
	c.Labels = maps.Clone(h.Labels)
	c.Tools = slices.Clone(h.Tools)
	c.Skills = slices.Clone(h.Skills)
	return c
}

// maxHeartbeat caps the heartbeat interval an agent may claim, so an agent
// cannot keep a stale entry online for hours.
const maxHeartbeat = time.Minute

// factsDigest identifies a host's facts (its announce without the fields
// that change on every heartbeat): the SHA-256 of their JSON encoding.
type factsDigest [sha256.Size]byte

// instanceSeen is one agent process heard announcing a host, and when.
type instanceSeen struct {
	id    string
	agent string // the installation's AgentID; empty for old agents
	at    time.Time
	// replaced is when a new process of the same installation took the
	// host over (zero: never): this one is taken for dead and not
	// counted. Heard again, it is alive after all (a copied state
	// directory) and counts.
	replaced time.Time
}

// hostEntry is one host as this gateway knows it. It is kept small: a
// fleet has tens of thousands of hosts.
type hostEntry struct {
	// facts is the host's latest announce with Busy and Leaving cleared.
	// It is replaced when the facts change, never modified, so it may be
	// read without the lock once taken from the entry. Its strings are
	// shared with other hosts' (see interner). Nil only while the host is
	// known from an unreadable bucket record alone; it is not listed then.
	facts  *protocol.Announce
	digest factsDigest
	busy   int
	// heard is when this gateway last heard the host announce; zero when
	// it knows the host only from the bucket.
	heard time.Time
	// instances are the agent processes heard announcing the host; one
	// unless two machines claim its name.
	instances []instanceSeen

	// The host's record in the hosts bucket, as this gateway last saw it:
	// its revision (0: none), facts digest (zero: none) and last-seen time.
	rev      uint64
	kvDigest factsDigest
	kvSeen   time.Time
	// holdUntil pauses writes after a write lost a race with another
	// gateway's, until the watch brings the newer record.
	holdUntil time.Time
}

// lastSeen is when the host was last heard by this gateway or, as the
// bucket records it, by any gateway.
func (e *hostEntry) lastSeen() time.Time {
	if e.kvSeen.After(e.heard) {
		return e.kvSeen
	}
	return e.heard
}

// registry keeps the fleet's hosts. Presence messages update it directly;
// a hostStore, when attached, shares it with other gateway replicas
// through the hosts bucket.
type registry struct {
	log *slog.Logger
	// agents are the agent records: the hosts' labels and revocations
	// (nil: no host has labels).
	agents       *agentIndex
	offlineAfter time.Duration
	now          func() time.Time
	// changed is signalled (without blocking) when something this
	// gateway heard may need writing to the bucket.
	changed chan struct{}

	mu      sync.RWMutex
	hosts   map[string]*hostEntry
	strings interner
}

func newRegistry(log *slog.Logger, offlineAfter time.Duration, agents *agentIndex) *registry {
	return &registry{log: log, agents: agents, offlineAfter: offlineAfter, now: time.Now, changed: make(chan struct{}, 1),
		hosts: make(map[string]*hostEntry), strings: interner{m: make(map[string]string)}}
}

func (r *registry) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// onPresence records an announce. The host ID is taken from the subject and
// must match the payload. It runs for every heartbeat of every host (2,000
// a second at 10,000 hosts), so unchanged facts cost a decode and a
// comparison, and nothing else.
func (r *registry) onPresence(m *nats.Msg) {
	host := protocol.HostFromPresence(m.Subject)
	var a protocol.Announce
	if err := json.Unmarshal(m.Data, &a); err != nil {
		r.log.Warn("ignoring malformed announce", "subject", m.Subject, "err", err)
		return
	}
	if host == "" || a.Host != host {
		r.log.Warn("ignoring announce whose host does not match its subject", "subject", m.Subject, "host", a.Host)
		return
	}
	leaving, busy := a.Leaving, a.Busy
	// Labels an agent claims for itself authorise nothing: they are
	// dropped, and the agent record's are used.
	a.Leaving, a.Busy, a.Labels = false, 0, nil
	now := r.now()
	r.mu.Lock()
	e := r.hosts[host]
	wasOnline := e != nil && r.liveCount(e, now) > 0
	if e == nil {
		e = &hostEntry{}
		r.hosts[host] = e
	}
	took, late := r.claim(e, &a, leaving, now)
	if late {
		r.mu.Unlock()
		r.log.Debug("ignoring a late announce of an agent process that was replaced", "host", host, "instance", a.Instance)
		return
	}
	// The goodbye of one of two agents claiming the name leaves the
	// other's facts in place.
	changed := e.facts == nil || !(leaving && r.liveCount(e, now) > 0) && !reflect.DeepEqual(e.facts, &a)
	if changed {
		r.setFacts(e, &a, digestOf(&a))
	}
	if !leaving || r.liveCount(e, now) == 0 {
		e.busy = busy
	}
	e.heard = now
	instances := r.live(e, now)
	r.mu.Unlock()
	if changed || leaving || !wasOnline {
		r.notify()
	}
	switch {
	case leaving:
		r.log.Info("host left", "host", host, "instance", a.Instance)
	case len(instances) > 1:
		r.log.Warn("two agents announce the same host name; calls to it are refused", "host", host, "instances", instances)
	case took != "":
		r.log.Info("host restarted: the new agent process takes over", "host", host, "instance", a.Instance, "replaces", took)
	case !wasOnline:
		r.log.Info("host online", "host", host, "os", a.OS, "arch", a.Arch, "agent", a.AgentVersion)
	}
}

// claim records that instance a.Instance of installation a.AgentID
// announced e's host at now, or left it. A process the host has not
// heard before, of the installation of a live one, is that installation
// restarted (its state directory is locked, so two processes never
// share it): it takes the host over at once and the old process is taken
// for dead. If the old process is heard again after all, the state
// directory was copied to another machine, and both count, as any two
// claims of one name do; but within a heartbeat interval of the take-over
// what arrives from it is taken for a message sent before it died, and
// late is set: the announce is to be ignored. claim returns the instance
// taken over, if any. The caller holds r.mu.
func (r *registry) claim(e *hostEntry, a *protocol.Announce, leaving bool, now time.Time) (took string, late bool) {
	limit := r.limit(e)
	known := false
	e.instances = slices.DeleteFunc(e.instances, func(in instanceSeen) bool {
		if in.id == a.Instance {
			known = true
			return leaving
		}
		return now.Sub(in.at) > limit
	})
	if leaving {
		return "", false
	}
	if known {
		for i := range e.instances {
			in := &e.instances[i]
			if in.id != a.Instance {
				continue
			}
			if !in.replaced.IsZero() && now.Sub(in.replaced) <= r.interval(e) {
				return "", true
			}
			in.at, in.replaced = now, time.Time{}
		}
		return "", false
	}
	agent := a.AgentID
	if len(agent) > protocol.MaxAgentIDLen {
		agent = "" // not an identity an agent sends: no take-over
	}
	if agent != "" {
		for i := range e.instances {
			if in := &e.instances[i]; in.agent == agent && in.replaced.IsZero() {
				in.replaced, took = now, in.id
			}
		}
	}
	e.instances = append(e.instances, instanceSeen{id: a.Instance, agent: agent, at: now})
	return took, false
}

// interval is how often e's agent announces itself: its heartbeat,
// counted as at most maxHeartbeat, or a third of OfflineAfter when it
// gives none.
func (r *registry) interval(e *hostEntry) time.Duration {
	if e.facts != nil && e.facts.HeartbeatMS > 0 {
		return min(time.Duration(e.facts.HeartbeatMS)*time.Millisecond, maxHeartbeat)
	}
	return r.offlineAfter / 3
}

// live returns the IDs of e's instances that count (heard within the
// limit and not replaced), sorted. The caller holds r.mu.
func (r *registry) live(e *hostEntry, now time.Time) []string {
	limit := r.limit(e)
	var ids []string
	for _, in := range e.instances {
		if in.replaced.IsZero() && now.Sub(in.at) <= limit {
			ids = append(ids, in.id)
		}
	}
	slices.Sort(ids)
	return ids
}

// setFacts stores a (an announce without Busy and Leaving, not used
// elsewhere) as e's facts. The caller holds r.mu.
func (r *registry) setFacts(e *hostEntry, a *protocol.Announce, digest factsDigest) {
	r.strings.facts(a)
	e.facts, e.digest = a, digest
	r.strings.maybeCompact(r.hosts)
}

// digestOf returns the digest of a host's facts.
func digestOf(a *protocol.Announce) factsDigest {
	data, err := json.Marshal(a)
	if err != nil {
		// An Announce always encodes; make a failure differ from every
		// real digest rather than equal to another failure's.
		return factsDigest{0xff}
	}
	return sha256.Sum256(data)
}

// offlineBound is how long after an instance's last announce the gateway
// still counts it alive: OfflineAfter (default 15 s) or three heartbeat
// intervals of the host, whichever is longer, where the interval an agent
// claims is capped at maxHeartbeat (1 min). So a host that stops
// heartbeating is shown offline at most max(OfflineAfter, 3 min) after its
// last heartbeat — 15 s with the default 5 s heartbeat — and at once when
// it announces that it is leaving. Online state is computed when asked,
// so there is no sweep delay on top.
func offlineBound(offlineAfter time.Duration, heartbeatMS int64) time.Duration {
	hb := min(time.Duration(heartbeatMS)*time.Millisecond, maxHeartbeat)
	if hb > 0 && 3*hb > offlineAfter {
		return 3 * hb
	}
	return offlineAfter
}

func (r *registry) limit(e *hostEntry) time.Duration {
	if e.facts == nil {
		return r.offlineAfter
	}
	return offlineBound(r.offlineAfter, e.facts.HeartbeatMS)
}

// liveCount returns how many of e's instances count: heard within the
// limit and not replaced by a restart.
func (r *registry) liveCount(e *hostEntry, now time.Time) int {
	limit, n := r.limit(e), 0
	for _, in := range e.instances {
		if in.replaced.IsZero() && now.Sub(in.at) <= limit {
			n++
		}
	}
	return n
}

// labels returns host's labels as its agent record has them (shared: not
// to be modified), and whether it was revoked.
func (r *registry) labels(host string) (map[string]string, bool) {
	if r.agents == nil {
		return nil, false
	}
	rec, ok := r.agents.record(host)
	if !ok {
		return nil, false
	}
	return rec.Labels, rec.Revoked()
}

// view returns a copy of e's info with Online and Conflict computed now.
func (r *registry) view(host string, e *hostEntry, now time.Time) HostInfo {
	h := HostInfo{Announce: *e.facts, LastSeen: e.lastSeen()}
	h.Busy = e.busy
	h.Labels, h.Revoked = r.labels(host)
	c := h.clone()
	live := r.live(e, now)
	c.Online = len(live) > 0
	if len(live) > 1 {
		c.Conflict = "agent instances " + strings.Join(live, ", ") + " all announce this name"
	}
	return c
}

// get returns a copy of host's info with Online computed now.
func (r *registry) get(host string) (HostInfo, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.hosts[host]
	if e == nil || e.facts == nil {
		return HostInfo{}, false
	}
	return r.view(host, e, r.now()), true
}

// list returns every host matching filter, sorted by name. An empty filter
// matches all; otherwise filter is a host selector (policy.ParseSelector),
// and one that does not parse matches nothing.
func (r *registry) list(filter string) []HostInfo {
	var sel policy.Selector
	if filter != "" {
		var err error
		if sel, err = policy.ParseSelector(filter); err != nil {
			return nil
		}
	}
	now := r.now()
	r.mu.RLock()
	out := make([]HostInfo, 0, len(r.hosts))
	for name, e := range r.hosts {
		if e.facts == nil {
			continue
		}
		if labels, _ := r.labels(name); filter == "" || sel.Match(name, labels) {
			out = append(out, r.view(name, e, now))
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b HostInfo) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// interner shares equal strings between hosts' facts: a fleet's hosts
// mostly run the same agent version, tools and skills, and skill
// descriptions are up to 1 KiB each. It is guarded by the registry's lock.
type interner struct {
	m map[string]string
	// compactAt is the table size beyond which it is rebuilt from the
	// strings still in use, so facts that changed do not pin old strings.
	compactAt int
}

func (in *interner) get(s string) string {
	if c, ok := in.m[s]; ok {
		return c
	}
	in.m[s] = s
	return s
}

// facts replaces a's strings by shared copies.
func (in *interner) facts(a *protocol.Announce) {
	stringFields(a, func(p *string) { *p = in.get(*p) })
	if a.Labels != nil {
		labels := make(map[string]string, len(a.Labels))
		for k, v := range a.Labels {
			labels[in.get(k)] = in.get(v)
		}
		a.Labels = labels
	}
}

// maybeCompact rebuilds the table from the facts of hosts once it has
// doubled since the last rebuild. Stored facts are only read: they are
// made of the table's strings already.
func (in *interner) maybeCompact(hosts map[string]*hostEntry) {
	if len(in.m) <= in.compactAt {
		return
	}
	in.m = make(map[string]string, in.compactAt)
	add := func(p *string) { in.m[*p] = *p }
	for _, e := range hosts {
		if e.facts == nil {
			continue
		}
		stringFields(e.facts, add)
		for k, v := range e.facts.Labels {
			in.m[k], in.m[v] = k, v
		}
	}
	in.compactAt = max(2*len(in.m), 4096)
}

// stringFields calls f with the address of each string of a that hosts
// tend to share (labels aside: map keys have no address).
func stringFields(a *protocol.Announce, f func(*string)) {
	for _, p := range []*string{&a.AgentVersion, &a.OS, &a.Arch, &a.Shell, &a.Cwd, &a.PolicyDigest} {
		f(p)
	}
	for i := range a.Tools {
		f(&a.Tools[i])
	}
	for i := range a.Skills {
		sk := &a.Skills[i]
		f(&sk.Name)
		f(&sk.Description)
		f(&sk.Path)
		f(&sk.Problem)
	}
}
