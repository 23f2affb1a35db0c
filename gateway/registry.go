package gateway

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
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

	"github.com/fleetmcp/fleetmcp/gateway/enrol"
	"github.com/fleetmcp/fleetmcp/gateway/internal/loglimit"
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
	// this host name, calls to it being refused until only one is left;
	// or when two live NATS connections used the host's identity
	// (IdentityConflict, connwatch.go), calls being refused until an
	// operator revokes the host or re-enrols it with --replace.
	Conflict         string `json:"conflict,omitempty"`
	IdentityConflict bool   `json:"identity_conflict,omitempty"`
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
	// stats are the agent's counters from its last announce (never
	// modified: replaced), kept out of facts as busy is.
	stats *protocol.AgentStats
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
	// logged is the state this gateway last logged for the host (online
	// or not), and loggedAt when: each change is logged once.
	logged   bool
	loggedAt time.Time
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
//
// What it holds is bounded: every announce is checked against the
// protocol's limits (protocol.Announce.Validate) before it is looked at,
// each host keeps at most maxInstances agent instances, and the facts of
// all hosts together may take at most maxBytes (as estimated by
// entryCost and the interner): an announce that would take the registry
// beyond is ignored. Messages it ignores are logged through a limiter, a
// few lines per agent a minute with the offending value cut short.
type registry struct {
	log *slog.Logger
	// agents are the agent records: the hosts' labels and revocations
	// (nil: no host has labels).
	agents       *enrol.Index
	offlineAfter time.Duration
	maxBytes     int64
	now          func() time.Time
	// changed is signalled (without blocking) when something this
	// gateway heard may need writing to the bucket.
	changed chan struct{}
	// rejects limits the lines logged about ignored announces, events
	// those about hosts coming, going and conflicting.
	rejects, events *loglimit.Limiter
	// heardKeys, when set, is told the keys each announce says its host
	// trusts (outside the lock, on the presence callback: it must not
	// block).
	heardKeys func(host string, trusted []string)

	mu    sync.RWMutex
	hosts map[string]*hostEntry
	// idConflicts are the identity conflicts found (connwatch.go), by
	// host; one stands while its key is the host's enrolled key and the
	// host is not revoked (see standing).
	idConflicts map[string]identityConflict
	strings     interner
	// bytes is the estimated memory of the hosts' entries beyond the
	// interned strings (see entryCost).
	bytes int64
}

// DefaultHostsMaxBytes is the default bound on the registry's memory.
const DefaultHostsMaxBytes = 512 << 20

// maxInstances bounds the agent instances remembered per host: two or
// more announcing one name are a conflict however many there are.
const maxInstances = 8

// logEvery is the interval of the registry's log limiters.
const logEvery = time.Minute

func newRegistry(log *slog.Logger, offlineAfter time.Duration, agents *enrol.Index) *registry {
	return &registry{log: log, agents: agents, offlineAfter: offlineAfter, maxBytes: DefaultHostsMaxBytes, now: time.Now, changed: make(chan struct{}, 1),
		rejects: loglimit.New(logEvery, 1), events: loglimit.New(logEvery, 10),
		hosts: make(map[string]*hostEntry), idConflicts: make(map[string]identityConflict), strings: interner{m: make(map[string]*internRef)}}
}

func (r *registry) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// reject logs an ignored presence message, at most once a minute per
// subject host.
func (r *registry) reject(host, subject string, err error) {
	key := host
	if key == "" {
		key = "(invalid subject)"
	}
	r.rejects.Log(r.log, slog.LevelWarn, key, "ignoring announce", "subject", protocol.Clip(subject, 200), "err", err.Error())
}

// onPresence records an announce. The host ID is taken from the subject and
// must match the payload. It runs for every heartbeat of every host (2,000
// a second at 10,000 hosts), so unchanged facts cost a decode and a
// comparison, and nothing else.
func (r *registry) onPresence(m *nats.Msg) {
	host := protocol.HostFromPresence(m.Subject)
	a, err := protocol.DecodeAnnounce(m.Data)
	if err == nil && a.Host != host {
		err = fmt.Errorf("the announce names host %s, its subject %s", protocol.Excerpt(a.Host), protocol.Excerpt(host))
	}
	if err != nil {
		r.reject(host, m.Subject, err)
		return
	}
	leaving, busy, stats := a.Leaving, a.Busy, a.Stats
	// Labels an agent claims for itself authorise nothing: they are
	// dropped, and the agent record's are used.
	a.Leaving, a.Busy, a.Labels, a.Stats = false, 0, nil, nil
	now := r.now()
	r.mu.Lock()
	e := r.hosts[host]
	wasOnline := e != nil && r.liveCount(e, now) > 0
	if e != nil && r.late(e, a.Instance, now) {
		r.mu.Unlock()
		r.log.Debug("ignoring a late announce of an agent process that was replaced", "host", host, "instance", a.Instance)
		return
	}
	// The goodbye of one of two agents claiming the name leaves the
	// other's facts in place.
	changed := e == nil || e.facts == nil || !(leaving && r.othersLive(e, a.Instance, now)) && !reflect.DeepEqual(e.facts, a)
	if changed {
		if err := r.admit(host, e, a); err != nil {
			r.mu.Unlock()
			r.reject(host, m.Subject, err)
			return
		}
		e = r.hosts[host]
	}
	took := r.claim(e, a, leaving, now)
	if !leaving || r.liveCount(e, now) == 0 {
		e.busy, e.stats = busy, stats
	}
	// back is how long a host this gateway logged offline was away.
	wasLogged, back := e.logged, time.Duration(0)
	// A goodbye of a host logged as gone already (a repeated goodbye)
	// is not news.
	goneAlready := !e.logged && !e.loggedAt.IsZero()
	if !e.loggedAt.IsZero() && !e.logged {
		back = max(now.Sub(e.heard), time.Nanosecond)
	}
	e.heard = now
	instances := r.live(e, now)
	if leaving && r.liveCount(e, now) == 0 {
		e.logged, e.loggedAt = false, now
	} else if !leaving {
		e.logged, e.loggedAt = true, now
	}
	r.mu.Unlock()
	if changed || leaving || !wasOnline {
		r.notify()
	}
	if !leaving && r.heardKeys != nil {
		r.heardKeys(host, a.TrustedKeys)
	}
	switch {
	case leaving && goneAlready:
		r.log.Debug("host left (again)", "host", host, "instance", a.Instance)
	case leaving:
		r.events.Log(r.log, slog.LevelInfo, host, "host left", "host", host, "instance", a.Instance)
	case len(instances) > 1:
		r.events.Log(r.log, slog.LevelWarn, host, "two agents announce the same host name; calls to it are refused", "host", host, "instances", instances)
	case took != "":
		r.events.Log(r.log, slog.LevelInfo, host, "host restarted: the new agent process takes over", "host", host, "instance", a.Instance, "replaces", took)
	case wasLogged:
	case back > 0:
		r.events.Log(r.log, slog.LevelInfo, host, "host back online", "host", host, "away", back.Round(time.Second), "agent", a.AgentVersion)
	default:
		r.events.Log(r.log, slog.LevelInfo, host, "host online", "host", host, "os", a.OS, "arch", a.Arch, "agent", a.AgentVersion)
	}
}

// logOffline logs, once each, the hosts this gateway logged online that
// have since stopped announcing (a host that said goodbye was logged as
// leaving). The hosts store calls it on each pass.
func (r *registry) logOffline(now time.Time) {
	type gone struct {
		host string
		seen time.Time
	}
	var off []gone
	r.mu.Lock()
	for host, e := range r.hosts {
		if e.logged && r.liveCount(e, now) == 0 {
			e.logged, e.loggedAt = false, now
			off = append(off, gone{host, e.heard})
		}
	}
	r.mu.Unlock()
	for _, g := range off {
		r.events.Log(r.log, slog.LevelWarn, g.host, "host offline: no announce within its offline bound", "host", g.host, "last_seen", g.seen.UTC().Format(time.RFC3339))
	}
}

// admit stores a, a checked announce without Busy and Leaving, as the
// facts of host (whose entry is e, nil when the host is new), unless its
// encoding exceeds the announce limit or it would take the registry
// beyond its memory bound. The caller holds r.mu.
func (r *registry) admit(host string, e *hostEntry, a *protocol.Announce) error {
	data, err := json.Marshal(a)
	if err != nil {
		return fmt.Errorf("encode facts: %w", err)
	}
	if len(data) > protocol.MaxAnnounceBytes {
		// Validate bounds each field, but escaping can make the whole
		// larger than it arrived; it must fit a hosts-bucket record.
		return fmt.Errorf("announce encodes to %d bytes; at most %d are allowed", len(data), protocol.MaxAnnounceBytes)
	}
	if e == nil {
		e = &hostEntry{}
	}
	if err := r.setFacts(host, e, a, sha256.Sum256(data)); err != nil {
		return err
	}
	r.hosts[host] = e
	return nil
}

// claim records that instance a.Instance of installation a.AgentID
// announced e's host at now, or left it. A process the host has not
// heard before, of the installation of a live one, is that installation
// restarted (its state directory is locked, so two processes never
// share it): it takes the host over at once and the old process is taken
// for dead. If the old process is heard again after all, the state
// directory was copied to another machine, and both count, as any two
// claims of one name do (but see late). claim returns the instance taken
// over, if any. At most maxInstances are remembered, the oldest dropped
// first. The caller holds r.mu.
func (r *registry) claim(e *hostEntry, a *protocol.Announce, leaving bool, now time.Time) (took string) {
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
		return ""
	}
	if known {
		for i := range e.instances {
			if in := &e.instances[i]; in.id == a.Instance {
				in.at, in.replaced = now, time.Time{}
			}
		}
		return ""
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
	if len(e.instances) >= maxInstances {
		e.instances = slices.Delete(e.instances, 0, len(e.instances)-maxInstances+1)
	}
	e.instances = append(e.instances, instanceSeen{id: a.Instance, agent: agent, at: now})
	return took
}

// late reports whether an announce of instance, a process that another
// of its installation took over within a heartbeat interval, is to be
// ignored: it is taken for a message sent before the process died. Heard
// later than that, the process is alive after all and claim counts it
// again. The caller holds r.mu.
func (r *registry) late(e *hostEntry, instance string, now time.Time) bool {
	for _, in := range e.instances {
		if in.id == instance && !in.replaced.IsZero() && now.Sub(in.replaced) <= r.interval(e) {
			return true
		}
	}
	return false
}

// othersLive reports whether instances of e other than instance count.
// The caller holds r.mu.
func (r *registry) othersLive(e *hostEntry, instance string, now time.Time) bool {
	limit := r.limit(e)
	for _, in := range e.instances {
		if in.id != instance && in.replaced.IsZero() && now.Sub(in.at) <= limit {
			return true
		}
	}
	return false
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
// elsewhere) as the facts of host, whose entry is e (not yet in r.hosts
// when the host is new), unless that would take the registry beyond
// r.maxBytes; facts that take no more than the ones they replace always
// fit. The caller holds r.mu.
func (r *registry) setFacts(host string, e *hostEntry, a *protocol.Announce, digest factsDigest) error {
	oldCost := int64(0)
	if r.hosts[host] == e {
		oldCost = entryCost(host, e.facts)
	}
	cost := entryCost(host, a)
	before := r.bytes + r.strings.bytes
	r.strings.hold(a)
	if e.facts != nil {
		r.strings.release(e.facts)
	}
	if total := r.bytes + cost - oldCost + r.strings.bytes; total > r.maxBytes && total > before {
		if e.facts != nil {
			r.strings.retain(e.facts)
		}
		r.strings.release(a)
		return fmt.Errorf("the host registry is full: this host's facts would take it to %d bytes, beyond its bound of %d (--hosts_max_mib)", total, r.maxBytes)
	}
	r.bytes += cost - oldCost
	e.facts, e.digest = a, digest
	return nil
}

// addEntry adds a new entry without facts for host. The caller holds
// r.mu.
func (r *registry) addEntry(host string) *hostEntry {
	e := &hostEntry{}
	r.hosts[host] = e
	r.bytes += entryCost(host, nil)
	return e
}

// removeEntry forgets host, whose entry is e. The caller holds r.mu.
func (r *registry) removeEntry(host string, e *hostEntry) {
	delete(r.hosts, host)
	r.bytes -= entryCost(host, e.facts)
	if e.facts != nil {
		r.strings.release(e.facts)
	}
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

// entryCost estimates the memory of host's entry with facts a beyond the
// strings the interner holds: the entry, its announce, the headers of
// their slices and map, and the strings no other host shares.
func entryCost(host string, a *protocol.Announce) int64 {
	n := int64(600 + len(host))
	if a != nil {
		n += int64(len(a.Host) + len(a.Instance) + len(a.Hostname) + 16*len(a.Tools) + 96*len(a.Skills) + 64*len(a.Labels))
	}
	return n
}

// memory returns the registry's estimated memory: its entries and the
// strings they share.
func (r *registry) memory() int64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.bytes + r.strings.bytes
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
	rec, ok := r.agents.Record(host)
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
	if len(live) == 1 {
		// The process that counts, which messages to the host are signed
		// for: the facts may be another's (one that left, or that a
		// restart replaced) until the next announce.
		c.Instance = live[0]
	}
	if len(live) > 1 {
		c.Conflict = "agent instances " + strings.Join(live, ", ") + " all announce this name"
	}
	if ic, ok := r.standing(host); ok {
		// The stronger claim: it outlasts the connections that made it.
		c.Conflict, c.IdentityConflict = ic.detail, true
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
// descriptions are up to 4 KiB each. Each string is counted by the facts
// that hold it and dropped with the last of them, so strings of facts
// that changed are not kept, and bytes is exact. It is guarded by the
// registry's lock.
type interner struct {
	m map[string]*internRef
	// bytes is the memory of the strings held, with internOverhead each.
	bytes int64
}

type internRef struct {
	s    string
	refs int
}

// internOverhead estimates the memory of one table entry beyond its
// string's bytes.
const internOverhead = 64

func (in *interner) get(s string) string {
	if s == "" {
		return ""
	}
	if ref, ok := in.m[s]; ok {
		ref.refs++
		return ref.s
	}
	in.m[s] = &internRef{s: s, refs: 1}
	in.bytes += int64(len(s)) + internOverhead
	return s
}

func (in *interner) put(s string) {
	ref := in.m[s]
	if ref == nil {
		return
	}
	if ref.refs--; ref.refs == 0 {
		delete(in.m, s)
		in.bytes -= int64(len(s)) + internOverhead
	}
}

// hold replaces a's strings by shared copies and counts a as holding
// them.
func (in *interner) hold(a *protocol.Announce) {
	stringFields(a, func(p *string) { *p = in.get(*p) })
	if a.Labels != nil {
		labels := make(map[string]string, len(a.Labels))
		for k, v := range a.Labels {
			labels[in.get(k)] = in.get(v)
		}
		a.Labels = labels
	}
}

// retain counts a, whose strings are already shared copies, as holding
// them again. Unlike hold it does not modify a.
func (in *interner) retain(a *protocol.Announce) {
	stringFields(a, func(p *string) { in.get(*p) })
	for k, v := range a.Labels {
		in.get(k)
		in.get(v)
	}
}

// release counts a as no longer holding its strings.
func (in *interner) release(a *protocol.Announce) {
	stringFields(a, func(p *string) { in.put(*p) })
	for k, v := range a.Labels {
		in.put(k)
		in.put(v)
	}
}

// stringFields calls f with the address of each string of a that hosts
// tend to share (labels aside: map keys have no address).
func stringFields(a *protocol.Announce, f func(*string)) {
	for _, p := range []*string{&a.AgentVersion, &a.OS, &a.Arch, &a.Shell, &a.Cwd, &a.PolicyDigest, &a.Confinement} {
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

// identityConflict is two live NATS connections found on one host's
// identity (connwatch.go). Unlike two processes announcing one name, it
// does not end when a connection goes: whoever holds the copy can come
// back at will, so it stands until an operator acts. The gateway that
// finds it keeps it here at once and writes it into the host's agent
// record (identityConflictFound), from which every replica, and this one
// after a restart, knows it too. Revoking the host (its record turns
// revoked) or re-enrolling it with --replace (its record gets another
// key, the old one revoked) ends it; the registry reads both from the
// agent records, so every replica clears it when the records change,
// whichever replica the operator used.
type identityConflict struct {
	key    string
	detail string
	since  time.Time
}

// markIdentityConflict records a conflict on host's identity key and
// reports whether it is new (none stood for that key already, here or
// in the host's record).
func (r *registry) markIdentityConflict(host, key, detail string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for h := range r.idConflicts {
		if _, ok := r.standing(h); !ok {
			delete(r.idConflicts, h) // cleared by an operator since
		}
	}
	if old, ok := r.standing(host); ok && old.key == key {
		return false
	}
	r.idConflicts[host] = identityConflict{key: key, detail: detail, since: r.now()}
	return true
}

// standing returns host's identity conflict while it stands: found here
// or kept in its record, for the key the host is still enrolled with,
// and the host is not revoked. The caller holds r.mu.
func (r *registry) standing(host string) (identityConflict, bool) {
	var rec *AgentRecord
	if r.agents != nil {
		rec, _ = r.agents.Record(host)
	}
	if ic, ok := r.idConflicts[host]; ok && (rec == nil || !rec.Revoked() && rec.PublicKey == ic.key) {
		return ic, true
	}
	if rec != nil {
		if kept, ok := rec.ConflictStands(); ok {
			return identityConflict{key: kept.PublicKey, detail: kept.Detail, since: kept.FoundAt}, true
		}
	}
	return identityConflict{}, false
}

// identityConflicted reports whether host has a standing identity
// conflict.
func (r *registry) identityConflicted(host string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, ok := r.standing(host)
	return ok
}

// identityConflicts counts the hosts with a standing identity conflict,
// found here or kept in their records.
func (r *registry) identityConflicts() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	hosts := make(map[string]bool)
	for h := range r.idConflicts {
		if _, ok := r.standing(h); ok {
			hosts[h] = true
		}
	}
	if r.agents != nil {
		for _, rec := range r.agents.All() {
			if _, ok := rec.ConflictStands(); ok {
				hosts[rec.Host] = true
			}
		}
	}
	return len(hosts)
}
