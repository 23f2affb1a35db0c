package enrol

import (
	"context"
	"slices"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// A revocation takes its keys from the record, from what the gateway
// knows of the host, and from the NATS servers' live connections (the
// gateway does that); this file writes what it found into the host's
// record, sealed and revoked.

// MarkRevoked marks host's record revoked at now by by (a revoked record
// is left as it is), and returns the record.
func (s *Service) MarkRevoked(ctx context.Context, host, by string, now time.Time) (*AgentRecord, error) {
	return s.agents.Modify(ctx, host, func(r *AgentRecord) error {
		if r.Revoked() {
			return jskv.ErrSkip
		}
		r.RevokedAt, r.RevokedBy = now, by
		return nil
	})
}

// RecordRevoked writes host's record so that it names keys revoked at
// now by by: over the record read (rec, when recErr is nil), or, when it
// could not be read, over whatever the bucket holds, from the last good
// record the gateway held (or a new one).
func (s *Service) RecordRevoked(ctx context.Context, host string, recErr error, rec *AgentRecord, keys []string, now time.Time, by string) error {
	expires := now.Add(s.cfg.CredentialTTL)
	add := func(r *AgentRecord) bool {
		changed := false
		for _, k := range keys {
			if k == r.PublicKey || r.RevokesKey(k) {
				continue
			}
			r.RevokedKeys = append(r.RevokedKeys, RevokedKey{PublicKey: k, RevokedAt: now, RevokedBy: by + " (revoked with the host)", CredentialExpiresAt: expires})
			changed = true
		}
		return changed
	}
	if recErr == nil {
		if len(keys) == 0 {
			return nil
		}
		_, err := s.agents.Modify(ctx, host, func(r *AgentRecord) error {
			if !add(r) {
				return jskv.ErrSkip
			}
			return nil
		})
		return err
	}
	var r AgentRecord
	if held, ok := s.index.Record(host); ok {
		r = held.Clone()
	} else {
		r = AgentRecord{Host: host, PublicKey: keys[0], CredentialExpiresAt: expires}
	}
	if !r.Revoked() {
		r.RevokedAt, r.RevokedBy = now, by
	}
	add(&r)
	return s.agents.putOver(ctx, &r)
}

// HoldsKey reports whether pub is the key host holds now, as far as the
// index knows: its record's key; with no record, a key connected as host
// (live), or the only key ever seen for the name.
func (x *Index) HoldsKey(host, pub string, live bool) bool {
	if held, ok := x.Record(host); ok {
		return held.PublicKey == pub
	}
	return live || slices.Equal(x.KeysOf(host), []string{pub})
}
