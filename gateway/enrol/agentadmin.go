package enrol

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// This file enrols and labels agents: it writes the agent records
// (agents.go) and issues credentials (Issuer). EnrolLocal is
// the enrolment of the dev agent, tests and load tools; enrolment over the
// network calls enrol after its own checks (token, proof of possession).

// Errors of enrolment and revocation; the messages they wrap say what to
// do.
var (
	// ErrHostRevoked: the host name was revoked; only a replacing
	// enrolment may take it again, with another key.
	ErrHostRevoked = errors.New("host revoked")
	// ErrNameTaken: another active key holds the host name.
	ErrNameTaken = errors.New("host name taken")
	// ErrKeyRevoked: the key was revoked; no credential is ever issued
	// for it again.
	ErrKeyRevoked = errors.New("key revoked")
	// ErrKeyInUse: the key is enrolled under another host name.
	ErrKeyInUse = errors.New("key enrolled under another name")
	// ErrBadRequest marks an admin request that cannot be done as asked.
	ErrBadRequest = errors.New("bad request")
)

// AgentCredentials are what an enrolled agent needs to join the fleet.
type AgentCredentials struct {
	Host string
	// JWT is the agent's NATS user JWT; it is worth nothing without the
	// agent's seed.
	JWT     string
	Expires time.Time
	// NATSURLs are the URLs agents dial.
	NATSURLs []string
	// CAPEM is the CA that signs the NATS servers' certificates (empty
	// when NATS does not use TLS); CAPin is its pin.
	CAPEM []byte
	CAPin string
	// Labels are the host's labels as recorded.
	Labels map[string]string
	// SigningKeys are the gateway keys the agent trusts for calls, skill
	// manifests and desired states (Gateway.SigningKeys), and
	// SigningKeySerial the key set they come from.
	SigningKeys      []string
	SigningKeySerial uint64
}

// Option adjusts a local enrolment.
type Option func(*enrolment)

// ReplaceHost lets an enrolment take over the host name from another
// key, even a revoked one: the old key is revoked.
func ReplaceHost() Option { return func(e *enrolment) { e.replace = true } }

// WithFacts records what the host is (OS, architecture, hostname), as a
// host that enrols over the network says of itself.
func WithFacts(f protocol.AgentFacts) Option { return func(e *enrolment) { e.facts = f } }

// enrolment is one request to enrol a host's key.
type enrolment struct {
	host, userPub string
	labels        map[string]string
	tokenID       string
	facts         protocol.AgentFacts
	// replace lets the key take the name from another key, revoked or
	// not; by is who asked (for the revocation of the old key).
	replace bool
	by      string
}

// EnrolLocal enrols host with the public key userPub (an nkey user key
// whose seed the agent keeps) and labels, and issues its credential. It
// is the enrolment of agents the gateway's operator starts itself (the
// agent of --dev, tests, load tools). A host already enrolled with the
// same key is enrolled again (its labels replaced); another key for an
// enrolled or revoked host name is refused unless ReplaceHost is given,
// and a revoked key is always refused.
func (s *Service) EnrolLocal(ctx context.Context, host, userPub string, labels map[string]string, opts ...Option) (AgentCredentials, error) {
	e := enrolment{host: host, userPub: userPub, labels: labels, by: "local"}
	for _, o := range opts {
		o(&e)
	}
	return s.enrol(ctx, e)
}

// enrol writes the host's record and issues its credential.
func (s *Service) enrol(ctx context.Context, e enrolment) (AgentCredentials, error) {
	if err := protocol.ValidateHost(e.host); err != nil {
		return AgentCredentials{}, fmt.Errorf("enrol: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(e.userPub) {
		return AgentCredentials{}, fmt.Errorf("enrol %s: %q is not an nkey user public key (U...)", e.host, e.userPub)
	}
	if err := protocol.ValidateLabels(e.labels); err != nil {
		return AgentCredentials{}, fmt.Errorf("enrol %s: %w", e.host, err)
	}
	if err := s.agents.sync(ctx); err != nil {
		return AgentCredentials{}, fmt.Errorf("enrol %s: %w", e.host, err)
	}
	if err := s.checkKey(e.host, e.userPub); err != nil {
		return AgentCredentials{}, err
	}
	expires := s.now().Add(s.cfg.CredentialTTL).Truncate(time.Second)
	rec, revokedOld, err := s.writeEnrolment(ctx, &e, expires)
	if err != nil {
		return AgentCredentials{}, err
	}
	if revokedOld {
		// The key the host name had is revoked in the record; its
		// connections end now (or at the next reconcile if this fails).
		if err := s.cfg.Reconcile(ctx); err != nil {
			s.log.Error("enrol: the replaced key of the host is revoked in its record but not yet on the NATS servers; retrying in the background",
				"host", e.host, "err", err)
			s.cfg.ReconcileSoon()
		}
	}
	token, err := s.cfg.Issuer.AgentJWT(e.host, e.userPub, expires)
	if err != nil {
		return AgentCredentials{}, maybeStored{err} // the record is stored
	}
	d := s.dial()
	s.log.Info("agent enrolled", "host", e.host, "key", e.userPub, "labels", textutil.FormatLabels(rec.Labels), "expires", expires, "by", e.by)
	return AgentCredentials{
		Host: e.host, JWT: token, Expires: expires, NATSURLs: d.NATSURLs, SigningKeys: d.SigningKeys, SigningKeySerial: d.SigningKeySerial,
		CAPEM: d.NATSCAPEM, CAPin: d.NATSCAPin, Labels: maps.Clone(rec.Labels),
	}, nil
}

// checkKey refuses a key that was revoked as another host, or that
// another host uses (the host's own record is checked when it is
// written).
func (s *Service) checkKey(host, pub string) error {
	other, ok := s.index.KeyHost(pub)
	if !ok || other == host {
		return nil
	}
	rec, ok := s.index.Record(other)
	if !ok {
		return nil
	}
	for _, k := range rec.Revocations() {
		if k.Key == pub {
			return fmt.Errorf("enrol %s: %w: key %s was revoked on %s (as host %s); the agent must make a new key",
				host, ErrKeyRevoked, pub, k.RevokedAt.UTC().Format(time.RFC3339), other)
		}
	}
	if rec.PublicKey == pub {
		return fmt.Errorf("enrol %s: %w: key %s is enrolled as host %s; one key serves one host name (revoke %s first, or give this host its own state directory)",
			host, ErrKeyInUse, pub, other, other)
	}
	return nil
}

// writeEnrolment creates or updates host's record for e (with
// compare-and-swap, again as often as another writer comes first). It
// reports whether it revoked the key the host had.
func (s *Service) writeEnrolment(ctx context.Context, e *enrolment, expires time.Time) (*AgentRecord, bool, error) {
	for {
		now := s.now().UTC()
		rec, rev, err := s.agents.Get(ctx, e.host)
		wrote := false
		if errors.Is(err, ErrUnknownAgent) {
			if err := s.cfg.Issuer.CheckIssuable(e.userPub); err != nil {
				return nil, false, fmt.Errorf("enrol %s: %w", e.host, err)
			}
			rec = &AgentRecord{Host: e.host, PublicKey: e.userPub, Labels: maps.Clone(e.labels), TokenID: e.tokenID,
				EnrolledAt: now, CredentialExpiresAt: expires, Facts: e.facts}
			if e.tokenID != "" {
				rec.TokenAt = now
			}
			if _, err = s.agents.create(ctx, rec); err == nil {
				return rec, false, nil
			}
			wrote = true
		} else if err == nil {
			var revokedOld bool
			if revokedOld, err = e.apply(rec, now, expires); err != nil {
				return nil, false, err
			}
			// What the record allows, the fleet account's revocations may
			// still refuse (a record put back from before a revocation).
			if err := s.cfg.Issuer.CheckIssuable(e.userPub); err != nil {
				return nil, false, fmt.Errorf("enrol %s: %w", e.host, err)
			}
			if _, err = s.agents.update(ctx, rec, rev); err == nil {
				return rec, revokedOld, nil
			}
			wrote = true
		}
		if errors.Is(err, errRecordChanged) && ctx.Err() == nil {
			continue // another writer came first: not written
		}
		err = fmt.Errorf("enrol %s: %w", e.host, err)
		if wrote && !errors.Is(err, errRecordChanged) {
			// A write whose answer did not come may be stored.
			err = maybeStored{err}
		}
		return nil, false, err
	}
}

// maybeStored is an enrolment's failure after its record may have been
// stored: a write whose answer was lost (JetStream electing a leader), or
// a failure after the write. The token's use it spent must not go back:
// the host may be enrolled. If it is, a retry with the same key and token
// is answered without spending another once the gateway has read the
// record (enrolretry.go); if not, the retry spends one more.
type maybeStored struct{ error }

func (e maybeStored) Unwrap() error { return e.error }

// apply turns rec, host's record, into the record after e. It refuses
// what e may not do, and reports whether it revoked the host's key.
func (e *enrolment) apply(rec *AgentRecord, now, expires time.Time) (revokedOld bool, err error) {
	for _, k := range rec.RevokedKeys {
		if k.PublicKey == e.userPub {
			return false, fmt.Errorf("enrol %s: %w: key %s was revoked on %s; the agent must make a new key",
				e.host, ErrKeyRevoked, e.userPub, k.RevokedAt.Format(time.RFC3339))
		}
	}
	switch {
	case rec.PublicKey == e.userPub && rec.Revoked():
		return false, fmt.Errorf("enrol %s: %w (and %w): the host and its key were revoked on %s by %s; the agent must make a new key, and re-enrolling the name needs a token made with --replace %s",
			e.host, ErrHostRevoked, ErrKeyRevoked, rec.RevokedAt.Format(time.RFC3339), rec.RevokedBy, e.host)
	case rec.PublicKey == e.userPub:
		// The same agent again: new labels, a new credential.
		rec.Labels, rec.Facts = maps.Clone(e.labels), e.facts
		if e.tokenID != "" {
			rec.TokenID, rec.TokenAt = e.tokenID, now
		}
		if expires.After(rec.CredentialExpiresAt) {
			rec.CredentialExpiresAt = expires
		}
		return false, nil
	case !e.replace && rec.Revoked():
		return false, fmt.Errorf("enrol %s: %w: it was revoked on %s by %s; re-enrolling the name needs a token made with --replace %s",
			e.host, ErrHostRevoked, rec.RevokedAt.Format(time.RFC3339), rec.RevokedBy, e.host)
	case !e.replace:
		return false, fmt.Errorf("enrol %s: %w: host %s is enrolled with another key (since %s); choose another name, or revoke it and enrol with a token made with --replace %s",
			e.host, ErrNameTaken, e.host, rec.EnrolledAt.Format(time.RFC3339), e.host)
	}
	// Another key takes the name over: the old key joins the revoked
	// ones (it may be revoked already).
	old := RevokedKey{PublicKey: rec.PublicKey, RevokedAt: rec.RevokedAt, RevokedBy: rec.RevokedBy, CredentialExpiresAt: rec.CredentialExpiresAt}
	if !rec.Revoked() {
		old.RevokedAt, old.RevokedBy, revokedOld = now, e.by+" (replaced)", true
	}
	*rec = AgentRecord{Host: e.host, PublicKey: e.userPub, Labels: maps.Clone(e.labels), TokenID: e.tokenID,
		EnrolledAt: now, CredentialExpiresAt: expires, Facts: e.facts, RevokedKeys: append(rec.RevokedKeys, old), Gen: rec.Gen}
	if e.tokenID != "" {
		rec.TokenAt = now
	}
	return revokedOld, nil
}

// SetAgentLabels sets the labels in set and removes those named in remove
// from host's record, and returns the host's labels after the change.
// Access rules and selectors see the new labels at once.
func (s *Service) SetAgentLabels(ctx context.Context, host string, set map[string]string, remove []string) (map[string]string, error) {
	if err := protocol.ValidateHost(host); err != nil {
		return nil, fmt.Errorf("labels: %w", err)
	}
	if err := protocol.ValidateLabels(set); err != nil {
		return nil, fmt.Errorf("labels of %s: %w", host, err)
	}
	rec, err := s.agents.Modify(ctx, host, func(r *AgentRecord) error {
		labels := maps.Clone(r.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, set)
		for _, k := range remove {
			delete(labels, k)
		}
		if maps.Equal(labels, r.Labels) {
			return jskv.ErrSkip
		}
		if err := protocol.ValidateLabels(labels); err != nil {
			return err
		}
		r.Labels = labels
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("labels of %s: %w", host, err)
	}
	return maps.Clone(rec.Labels), nil
}

// AllowRecovery lets host recover its credential count more times (it
// may then get a new credential with its key alone, once expired).
func (s *Service) AllowRecovery(ctx context.Context, host string, count int) error {
	if count < 1 || count > 100 {
		return fmt.Errorf("%w: count %d: use 1 to 100", ErrBadRequest, count)
	}
	_, err := s.agents.Modify(ctx, host, func(r *AgentRecord) error {
		if r.Revoked() {
			return fmt.Errorf("%w: %s was revoked; a revoked host never recovers (enrol a new key with a token made with --replace %s)", ErrRevoked, host, host)
		}
		r.RecoveriesLeft = count
		return nil
	})
	if err != nil {
		return fmt.Errorf("allow recovery of %s: %w", host, err)
	}
	s.log.Info("agent may recover its credential", "host", host, "count", count)
	return nil
}

// Agents returns every agent record, sorted by host.
func (s *Service) Agents(ctx context.Context) ([]AgentRecord, error) {
	if err := s.agents.sync(ctx); err != nil {
		return nil, err
	}
	return s.index.All(), nil
}

// Agent returns host's record as stored now.
func (s *Service) Agent(ctx context.Context, host string) (AgentRecord, error) {
	rec, _, err := s.agents.Get(ctx, host)
	if err != nil {
		return AgentRecord{}, err
	}
	return *rec, nil
}
