package gateway

import (
	"encoding/json"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// HostInfo is what the gateway knows about one host.
type HostInfo struct {
	protocol.Announce
	LastSeen time.Time `json:"last_seen"`
	Online   bool      `json:"online"`
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

// hostEntry is a host's latest announce plus when each of its agent
// instances was last heard.
type hostEntry struct {
	info      HostInfo
	instances map[string]time.Time
}

// registry keeps the fleet's hosts from their presence announcements. Every
// gateway subscribes to every announce, so replicas agree without sharing
// state.
type registry struct {
	log          *slog.Logger
	offlineAfter time.Duration
	now          func() time.Time

	mu    sync.RWMutex
	hosts map[string]*hostEntry
}

func newRegistry(log *slog.Logger, offlineAfter time.Duration) *registry {
	return &registry{log: log, offlineAfter: offlineAfter, now: time.Now, hosts: make(map[string]*hostEntry)}
}

// onPresence records an announce. The host ID is taken from the subject and
// must match the payload.
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
	now := r.now()
	r.mu.Lock()
	e := r.hosts[host]
	wasOnline := e != nil && r.onlineAt(e, now)
	if e == nil {
		e = &hostEntry{instances: make(map[string]time.Time)}
		r.hosts[host] = e
	}
	e.info = HostInfo{Announce: a, LastSeen: now}
	if a.Leaving {
		delete(e.instances, a.Instance)
	} else {
		e.instances[a.Instance] = now
	}
	r.pruneInstances(e, now)
	conflict := len(e.instances) > 1
	r.mu.Unlock()
	switch {
	case a.Leaving:
		r.log.Info("host left", "host", host, "instance", a.Instance)
	case conflict:
		r.log.Warn("two agents announce the same host name; calls to it are refused", "host", host, "instances", slices.Sorted(maps.Keys(e.instances)))
	case !wasOnline:
		r.log.Info("host online", "host", host, "os", a.OS, "arch", a.Arch, "agent", a.AgentVersion)
	}
}

// limit is how long after its last announce an instance counts as alive.
func (r *registry) limit(e *hostEntry) time.Duration {
	limit := r.offlineAfter
	hb := min(time.Duration(e.info.HeartbeatMS)*time.Millisecond, maxHeartbeat)
	if hb > 0 && 3*hb > limit {
		limit = 3 * hb
	}
	return limit
}

func (r *registry) pruneInstances(e *hostEntry, now time.Time) {
	limit := r.limit(e)
	for id, seen := range e.instances {
		if now.Sub(seen) > limit {
			delete(e.instances, id)
		}
	}
}

// live returns the instances heard within the limit, sorted.
func (r *registry) live(e *hostEntry, now time.Time) []string {
	limit := r.limit(e)
	var ids []string
	for id, seen := range e.instances {
		if now.Sub(seen) <= limit {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func (r *registry) onlineAt(e *hostEntry, now time.Time) bool {
	return len(r.live(e, now)) > 0
}

// view returns a copy of e's info with Online and Conflict computed now.
func (r *registry) view(e *hostEntry, now time.Time) HostInfo {
	c := e.info.clone()
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
	if e == nil {
		return HostInfo{}, false
	}
	return r.view(e, r.now()), true
}

// list returns every host matching filter, sorted by name. An empty filter
// matches all; otherwise filter is a host selector (policy.ParseSelector).
func (r *registry) list(filter string) []HostInfo {
	now := r.now()
	r.mu.RLock()
	out := make([]HostInfo, 0, len(r.hosts))
	for _, e := range r.hosts {
		if matchFilter(&e.info, filter) {
			out = append(out, r.view(e, now))
		}
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b HostInfo) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// matchFilter applies a hosts filter, a host selector.
// A filter that does not parse matches nothing.
func matchFilter(h *HostInfo, filter string) bool {
	if filter == "" {
		return true
	}
	sel, err := policy.ParseSelector(filter)
	return err == nil && sel.Match(h.Host, h.Labels)
}
