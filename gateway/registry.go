package gateway

import (
	"encoding/json"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// HostInfo is what the gateway knows about one host.
type HostInfo struct {
	protocol.Announce
	LastSeen time.Time `json:"last_seen"`
	Online   bool      `json:"online"`
}

// clone returns a copy that shares no maps or slices with h.
func (h *HostInfo) clone() HostInfo {
	c := *h
	c.Labels = maps.Clone(h.Labels)
	c.Tools = slices.Clone(h.Tools)
	return c
}

// registry keeps the fleet's hosts from their presence announcements. Every
// gateway subscribes to every announce, so replicas agree without sharing
// state.
type registry struct {
	log          *slog.Logger
	offlineAfter time.Duration
	now          func() time.Time

	mu    sync.RWMutex
	hosts map[string]*HostInfo
}

func newRegistry(log *slog.Logger, offlineAfter time.Duration) *registry {
	return &registry{log: log, offlineAfter: offlineAfter, now: time.Now, hosts: make(map[string]*HostInfo)}
}

// onPresence records an announce. The host ID is taken from the subject,
// which NATS permissions control, and must match the payload.
func (r *registry) onPresence(m *nats.Msg) {
	host := strings.TrimPrefix(m.Subject, strings.TrimSuffix(protocol.PresenceSubject("x"), "x"))
	var a protocol.Announce
	if err := json.Unmarshal(m.Data, &a); err != nil {
		r.log.Warn("ignoring malformed announce", "subject", m.Subject, "err", err)
		return
	}
	if protocol.ValidateHost(host) != nil || a.Host != host {
		r.log.Warn("ignoring announce whose host does not match its subject", "subject", m.Subject, "host", a.Host)
		return
	}
	now := r.now()
	r.mu.Lock()
	prev := r.hosts[host]
	r.hosts[host] = &HostInfo{Announce: a, LastSeen: now, Online: !a.Leaving}
	r.mu.Unlock()
	switch {
	case a.Leaving:
		r.log.Info("host left", "host", host)
	case prev == nil || !r.online(prev, now):
		r.log.Info("host online", "host", host, "os", a.OS, "arch", a.Arch, "agent", a.AgentVersion)
	}
}

func (r *registry) online(h *HostInfo, now time.Time) bool {
	if !h.Online {
		return false
	}
	limit := r.offlineAfter
	if hb := time.Duration(h.HeartbeatMS) * time.Millisecond; hb > 0 && 3*hb > limit {
		limit = 3 * hb
	}
	return now.Sub(h.LastSeen) <= limit
}

// get returns a copy of host's info with Online computed now.
func (r *registry) get(host string) (HostInfo, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h := r.hosts[host]
	if h == nil {
		return HostInfo{}, false
	}
	c := h.clone()
	c.Online = r.online(h, r.now())
	return c, true
}

// list returns every host matching filter, sorted by name. An empty filter
// matches all; otherwise filter is a host-name glob (web-*) or a label match
// (role=web).
func (r *registry) list(filter string) []HostInfo {
	now := r.now()
	r.mu.RLock()
	out := make([]HostInfo, 0, len(r.hosts))
	for _, h := range r.hosts {
		if !matchFilter(h, filter) {
			continue
		}
		c := h.clone()
		c.Online = r.online(h, now)
		out = append(out, c)
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b HostInfo) int { return strings.Compare(a.Host, b.Host) })
	return out
}

func matchFilter(h *HostInfo, filter string) bool {
	if filter == "" || filter == "*" {
		return true
	}
	if k, v, ok := strings.Cut(filter, "="); ok {
		got, has := h.Labels[strings.TrimSpace(k)]
		return has && got == strings.TrimSpace(v)
	}
	ok, err := path.Match(filter, h.Host)
	return err == nil && ok
}
