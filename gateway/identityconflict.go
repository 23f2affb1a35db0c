package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
)

// The gateway's side of the watch of agent connections
// (natsauth.Authority.WatchConnections): a host whose identity two live
// NATS connections use is marked, its calls refused, the conflict
// audited and kept in its record.

// watchConnections starts the watch of the fleet's agent connections,
// run until ctx ends by the gateway's loops.
func (g *Gateway) watchConnections(ctx context.Context) error {
	run, err := g.subsys.authority.WatchConnections(g.conns.nc, g.log.With("component", "connwatch"), natsauth.WatchHooks{
		HostOf: g.subsys.agentIndex.KeyHost,
		SilentAfter: func(host string) time.Duration {
			hb := natsauth.DefaultAgentHeartbeat
			if h, ok := g.calling.reg.get(host); ok && h.HeartbeatMS > 0 {
				hb = min(time.Duration(h.HeartbeatMS)*time.Millisecond, maxHeartbeat)
			}
			return 2*hb + time.Second
		},
		Standing: g.calling.reg.identityConflicted,
		Found:    g.identityConflictFound,
	})
	if err != nil {
		return fmt.Errorf("watch the fleet's NATS connections: %w", err)
	}
	g.life.loops.Go(func() { run(ctx) })
	return nil
}

// identityConflictFound marks host conflicting, and the first time logs,
// counts and audits it and keeps it in the host's record.
func (g *Gateway) identityConflictFound(ctx context.Context, host string, conns []natsauth.Conn) {
	key := conns[len(conns)-1].User
	if rec, ok := g.subsys.agentIndex.Record(host); ok {
		for _, c := range conns {
			if c.User == rec.PublicKey {
				key = c.User
			}
		}
	}
	detail := natsauth.ConflictDetail(conns)
	if !g.calling.reg.markIdentityConflict(host, key, detail) {
		return
	}
	g.calling.identityConflictCount.Add(1)
	g.log.Error("two live NATS connections on one host's identity: calls to it are refused until an operator revokes it or re-enrols it with --replace",
		"host", host, "key", key, "connections", len(conns), "detail", detail)
	list := make([]any, len(conns))
	for i := range conns {
		list[i] = map[string]any{"server": conns[i].Server, "cid": conns[i].CID, "ip": conns[i].IP, "start": conns[i].Start.UTC().Format(time.RFC3339Nano)}
	}
	// The record's facts are the servers', read by the gateway: nothing
	// in it comes from either connection.
	rec := &audit.Record{Time: g.now().UTC(), CallID: newCallID(), Tool: auditIdentityConflict, Hosts: []string{host},
		Caller:   audit.Caller{Kind: string(access.KindUnverified), Subject: "nats key " + key},
		Decision: audit.DecisionDenied, Rule: "one live connection per host identity", Outcome: audit.OutcomeRefused,
		Reason: "two live NATS connections on the host's identity", Error: detail,
		Source: "the NATS servers' connections", Args: map[string]any{"connections": list}}
	g.subsys.audit.Write(rec)
	if err := g.keepIdentityConflict(ctx, host, key, detail); err != nil {
		g.log.Error("the identity conflict is refused here, but could not be kept in the host's record: other gateways and this one after a restart do not know it; revoke the host",
			"host", host, "err", err)
	}
}

// conflictWriteTimeout bounds the write of a conflict into a host's
// record, which holds up the connection watch.
const conflictWriteTimeout = 10 * time.Second

// keepIdentityConflict writes the conflict found on host's key into its
// record, once: a record that keeps one for its key already, is revoked
// or holds another key is left as it is.
func (g *Gateway) keepIdentityConflict(ctx context.Context, host, key, detail string) error {
	ctx, cancel := context.WithTimeout(ctx, conflictWriteTimeout)
	defer cancel()
	now := g.now().UTC()
	_, err := g.subsys.agents.Modify(ctx, host, func(r *AgentRecord) error {
		if _, ok := r.ConflictStands(); ok || r.Revoked() || r.PublicKey != key {
			return jskv.ErrSkip
		}
		r.IdentityConflict = &RecordedConflict{PublicKey: key, FoundAt: now, Detail: detail}
		return nil
	})
	if err != nil {
		return fmt.Errorf("keep the identity conflict of %s: %w", host, err)
	}
	return nil
}

// auditIdentityConflict is the tool name of an identity conflict's audit
// record.
const auditIdentityConflict = "identity_conflict"
