package enrol

import (
	"context"
	"errors"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// An enrolment whose answer is lost on its way back (a connection cut, a
// proxy timing out, the host's process killed) has spent the token's use
// and written the host's record, and the host has only its key. Sent
// again, the request would be refused as token_spent, stranding the host.
// So a retry is answered instead: the same key (proved again, with a new
// nonce), with the same token (its secret checked), for the name the
// record holds, within Config.RetryWindow of the enrolment, gets a
// new credential for its record and spends nothing. A different key never
// gets anything from a spent token: it takes the ordinary path and is
// refused there; nor does a revoked host, a replaced key, or a token
// revoked or expired since.

// errNotRetry: the record does not allow a retry any more.
var errNotRetry = errors.New("not a retry of this enrolment")

// retryOf reports whether a request of key pub with join token tokenID
// is a retry of the enrolment r records, at now.
func (r *AgentRecord) retryOf(tokenID, pub string, now time.Time, window time.Duration) bool {
	return r.TokenID == tokenID && r.PublicKey == pub && !r.Revoked() &&
		!r.TokenAt.IsZero() && now.Before(r.TokenAt.Add(window))
}

// enrolAgain answers req, already checked (pin, facts, proof), when it
// is a retry of an enrolment with token id whose secret is secret; done
// is false when it is not one, and the request takes the ordinary path,
// which says why it is refused if it is.
func (s *Service) enrolAgain(ctx context.Context, id string, secret []byte, req *protocol.EnrolRequest, out *Outcome) (_ *protocol.EnrolResponse, done bool, _ *protocol.APIError) {
	// The index, as this gateway holds it: a key it does not know is
	// taken for a first enrolment, at no cost (Enrol asks again after
	// a sync when the token turns out spent). The record itself is read
	// again below.
	host, ok := s.index.KeyHost(req.PublicKey)
	if !ok {
		return nil, false, nil
	}
	now := s.now()
	if rec, ok := s.index.Record(host); !ok || !rec.retryOf(id, req.PublicKey, now, s.cfg.RetryWindow) {
		return nil, false, nil
	}
	tok, _, err := s.tokens.get(ctx, id)
	if err != nil || !tok.secretMatches(secret) || !tok.RevokedAt.IsZero() || !now.Before(tok.ExpiresAt) {
		return nil, false, nil
	}
	if name, _, aerr := tok.allowName(req.Host, req.Facts.Hostname); aerr != nil || name != host {
		return nil, false, nil
	}
	// The record read again, with compare-and-swap: a revocation or a
	// replacing enrolment meanwhile ends the retry.
	expires := now.Add(s.cfg.CredentialTTL).Truncate(time.Second)
	rec, err := s.agents.Modify(ctx, host, func(r *AgentRecord) error {
		if !r.retryOf(id, req.PublicKey, s.now(), s.cfg.RetryWindow) {
			return errNotRetry
		}
		if !expires.After(r.CredentialExpiresAt) {
			return jskv.ErrSkip
		}
		r.CredentialExpiresAt = expires
		return nil
	})
	switch {
	case errors.Is(err, errNotRetry):
		return nil, false, nil
	case err != nil:
		return nil, true, apiErr(protocol.APIUnavailable, "enrolling %s again failed on the gateway (%v): try again in a moment", host, err)
	}
	jwt, err := s.cfg.Issuer.AgentJWT(host, req.PublicKey, expires)
	if err != nil {
		return nil, true, issueError(host, err)
	}
	out.Host, out.Labels, out.Retried = host, rec.Labels, true
	s.log.Info("agent enrolled again: the same key sent the same join token (its first answer was lost); no use spent",
		"host", host, "key", req.PublicKey, "token", id, "enrolled_at", rec.TokenAt)
	d := s.dial()
	c := AgentCredentials{Host: host, JWT: jwt, Expires: expires, NATSURLs: d.NATSURLs, SigningKeys: d.SigningKeys,
		CAPEM: d.NATSCAPEM, CAPin: d.NATSCAPin, Labels: rec.Labels}
	return s.enrolResponse(&c), true, nil
}
