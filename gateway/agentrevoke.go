package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file revokes hosts and keys whatever the agent records say. A
// record can be forged, damaged, removed or an old copy put back by any
// user of the fleet's NATS account; none of that may keep a host from
// being thrown out. So a revocation takes its keys from three places:
// the record (when its seal holds), what the gateway itself knows of the
// host (the last good record it read, every key it saw enrolled for the
// name), and the NATS servers' own list of live connections made with
// an agent credential issued for the name (natsauth.Authority.LiveKeys).
// Every such key goes into the fleet account's revocations, which the operator signs
// and no account user can change, and the servers close its connections
// at once. The record is then written again, sealed and revoked.

// RevokeAgent revokes host: its record is marked revoked (by whom, and
// when), its keys are added to the fleet account's revocations and pushed
// to the NATS servers, which close its connections at once and refuse it
// from then on. No credential is issued again for its keys, nor for its
// name without a replacing enrolment. A record that cannot be read
// (forged, damaged, removed) or an old copy does not stop it: the keys
// the gateway knows for the name and the live connections whose
// credential was issued for it are revoked, and the record is written
// again, revoked. Revoking a revoked host again pushes the revocations
// again and changes nothing else.
func (g *Gateway) RevokeAgent(ctx context.Context, host, by string) error {
	if err := protocol.ValidateHost(host); err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	now := g.now().UTC()
	rec, recErr := g.subsys.enrol.MarkRevoked(ctx, host, by, now)
	var pushErr error
	if recErr == nil {
		// The usual case first, so that its connections end at once.
		pushErr = g.subsys.authority.Revoke(ctx, rec.PublicKey)
	} else if ctx.Err() != nil {
		return fmt.Errorf("revoke %s: %w", host, recErr)
	}
	// Whatever the record said: every key the gateway saw enrolled for
	// the name (at once), then the keys of the live connections issued
	// for it.
	var extra []string
	revokeMore := func(keys []string) {
		keys = slices.DeleteFunc(keys, func(k string) bool {
			return slices.Contains(extra, k) || recErr == nil && (k == rec.PublicKey || rec.RevokesKey(k))
		})
		if len(keys) == 0 {
			return
		}
		extra = append(extra, keys...)
		if err := g.subsys.authority.RevokeKeys(ctx, now, keys...); err != nil {
			pushErr = errors.Join(pushErr, err)
		}
	}
	revokeMore(g.subsys.agentIndex.KeysOf(host))
	live, liveErr := g.subsys.authority.LiveKeys(ctx, func(c natsauth.LiveConn) bool { return c.Host == host })
	if liveErr != nil {
		g.log.Warn("revoke: the NATS servers' list of live connections is incomplete", "host", host, "err", liveErr)
	}
	var liveKeys []string
	for _, c := range live {
		liveKeys = append(liveKeys, c.Key)
	}
	slices.Sort(liveKeys)
	revokeMore(slices.Compact(liveKeys))
	if recErr != nil && len(extra) == 0 {
		if errors.Is(recErr, ErrUnknownAgent) {
			return fmt.Errorf("revoke %s: %w (no key was ever enrolled for it on this gateway, and no credential issued for it is connected)", host, recErr)
		}
		return fmt.Errorf("revoke %s: %w; and no key is known for it, nor connected: revoke by key (fleetctl agent revoke --key)", host, recErr)
	}
	if err := g.subsys.enrol.RecordRevoked(ctx, host, recErr, rec, extra, now, by); err != nil {
		g.log.Error("revoke: the keys are revoked on the NATS servers, but the host's record could not be written revoked", "host", host, "err", err)
	}
	if pushErr != nil {
		g.reconcileSoon()
		return fmt.Errorf("revoke %s: the NATS servers have not taken the revocation yet (retrying in the background): %w", host, pushErr)
	}
	if recErr != nil {
		g.log.Warn("agent revoked although its record could not be read; the record is written again, revoked", "host", host, "keys", extra,
			"record_err", recErr, "by", by)
	} else {
		g.log.Info("agent revoked", "host", host, "key", rec.PublicKey, "also", extra, "by", by)
	}
	return nil
}

// RevokeKey revokes the agent key pub, whatever any record says: it goes
// into the fleet account's revocations and its connections end. When it
// is the key a host holds now (its record's, or with no record its live
// connection's, or the only key ever seen for the name), the host is
// revoked; an earlier key of a host is added to the host's record. It
// returns the host ("" when none is known).
func (g *Gateway) RevokeKey(ctx context.Context, pub, by string) (string, error) {
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("%w: %q is not an agent's public key (an nkey user key, U...)", errBadAdminRequest, protocol.Ellipsis(pub, 60))
	}
	live, err := g.subsys.authority.LiveKeys(ctx, func(c natsauth.LiveConn) bool { return c.Key == pub })
	if err != nil {
		g.log.Warn("revoke key: the NATS servers' list of live connections is incomplete", "key", pub, "err", err)
	}
	host, ok := g.subsys.agentIndex.KeyHost(pub)
	if !ok && len(live) > 0 {
		host = live[0].Host
	}
	if protocol.ValidateHost(host) != nil {
		host = ""
	}
	if host != "" && g.subsys.agentIndex.HoldsKey(host, pub, len(live) > 0) {
		if err := g.RevokeAgent(ctx, host, by); err != nil {
			return host, err
		}
		return host, g.subsys.authority.RevokeKeys(ctx, g.now().UTC(), pub)
	}
	now := g.now().UTC()
	if err := g.subsys.authority.RevokeKeys(ctx, now, pub); err != nil {
		g.reconcileSoon()
		return host, fmt.Errorf("revoke key %s: the NATS servers have not taken the revocation yet (retrying in the background): %w", pub, err)
	}
	if host != "" {
		// An earlier key of a host that holds another now.
		rec, _, err := g.subsys.agents.Get(ctx, host)
		if err == nil {
			err = g.subsys.enrol.RecordRevoked(ctx, host, nil, rec, []string{pub}, now, by)
		}
		if err != nil {
			g.log.Error("revoke key: the key is revoked on the NATS servers, but its host's record does not say so (revoke the host by name to write it again)",
				"host", host, "key", pub, "err", err)
		}
	}
	g.log.Info("agent key revoked", "key", pub, "host", host, "by", by)
	return host, nil
}
