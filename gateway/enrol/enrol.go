package enrol

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file is enrolment over the network: a host proves it holds its
// key (a signature over the request's canonical bytes, a fresh nonce, the
// time) and presents a join token (enrol) or its still-enrolled key
// (recover); the gateway checks, in this order, the request, the token,
// the name rules, consumes one use of the token, writes the agent record
// and mints the credential, giving the use back if the record step fails.
// A retry of an enrolment whose answer was lost is answered without
// spending another use (enrolretry.go).

const (
	noncesBucket = "fleet_nonces"
	// nonceTTL is how long a nonce is remembered: longer than the window
	// of times a request may carry (MaxClockSkew each way).
	nonceTTL = 15 * time.Minute
	// maxFactLen bounds each reported fact.
	maxFactLen = 256
)

// nonceStore remembers the nonces of requests seen, so none is accepted
// twice.
type nonceStore struct{ kv jetstream.KeyValue }

func openNonceStore(js jetstream.JetStream, replicas int) (*nonceStore, error) {
	kv, err := jskv.EnsureBucket(js, LoadTimeout, jetstream.KeyValueConfig{
		Bucket:      noncesBucket,
		Description: "fleetmcp request nonces seen in the last 15 minutes (replay protection)",
		History:     1,
		TTL:         nonceTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxBytes:    256 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("request nonces: %w", err)
	}
	return &nonceStore{kv: kv}, nil
}

// record remembers nonce; a nonce seen before is refused as replayed.
//
// While JetStream does not answer (a leader election) the write is tried
// again. A write that was stored although its answer was lost then finds
// the nonce taken: each request writes a mark of its own as the value, so
// finding its own mark there is no replay.
func (s *nonceStore) record(ctx context.Context, nonce string) *protocol.APIError {
	mark := []byte(protocol.NewNonce())
	unanswered := false
	_, err := jskv.Retry(ctx, func(ctx context.Context) (uint64, error) {
		rev, err := s.kv.Create(ctx, nonce, mark)
		if errors.Is(err, jetstream.ErrKeyExists) && unanswered {
			e, gerr := s.kv.Get(ctx, nonce)
			switch {
			case gerr == nil && bytes.Equal(e.Value(), mark):
				return e.Revision(), nil
			case gerr != nil && jskv.Unanswered(gerr):
				return 0, gerr
			}
		}
		unanswered = unanswered || jskv.Unanswered(err)
		return rev, err
	})
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return apiErr(protocol.APIReplayed, "this request was sent before (its nonce was seen): a request is accepted once; make a new one (a new nonce, the time now) and sign it again")
	case err != nil:
		return apiErr(protocol.APIUnavailable, "the gateway could not record the request's nonce (%v): try again in a moment", err)
	}
	return nil
}

// checkProof verifies the proof of possession of a request whose
// canonical bytes are signing: the key's signature, the time, and that
// its nonce is new.
func (s *Service) checkProof(ctx context.Context, p *protocol.Proof, signing []byte) *protocol.APIError {
	if aerr := checkProofShape(p); aerr != nil {
		return aerr
	}
	sig, err := base64.RawURLEncoding.DecodeString(p.Signature)
	if err != nil {
		return apiErr(protocol.APIBadSignature, "the signature is not base64url without padding: sign the request's signing bytes with the agent's key")
	}
	kp, err := nkeys.FromPublicKey(p.PublicKey)
	if err != nil || kp.Verify(signing, sig) != nil {
		return apiErr(protocol.APIBadSignature, "the signature does not verify with public key %s over this request: the request was changed on its way, or signed with another key; sign it again with the agent's key", p.PublicKey)
	}
	if err := p.CheckTime(s.now()); err != nil {
		return apiErr(protocol.APIClockSkew, "%v", err)
	}
	return s.nonces.record(ctx, p.Nonce)
}

// checkProofShape checks the fields of a proof that need no key.
func checkProofShape(p *protocol.Proof) *protocol.APIError {
	switch {
	case !nkeys.IsValidPublicUserKey(p.PublicKey):
		return apiErr(protocol.APIBadRequest, "public_key %q is not an nkey user public key (U...): send the public key of the agent's key", protocol.Ellipsis(p.PublicKey, 60))
	case p.Time.IsZero():
		return apiErr(protocol.APIBadRequest, "time is missing: send the time of the request (RFC 3339, UTC)")
	case p.Signature == "":
		return apiErr(protocol.APIBadSignature, "signature is missing: sign the request's signing bytes with the agent's key")
	}
	if err := protocol.CheckNonce(p.Nonce); err != nil {
		return apiErr(protocol.APIBadRequest, "%v: send protocol.NewNonce()", err)
	}
	return nil
}

// checkPin refuses a pin other than the gateway's own: the agent checked
// the certificate of another CA (a man in the middle, or another fleet).
func (s *Service) checkPin(pin string) *protocol.APIError {
	if !protocol.ValidCAPin(pin) {
		return apiErr(protocol.APIBadRequest, "ca_pin %q is not sha256:<64 lowercase hex digits>: copy it from fleetctl token create", protocol.Ellipsis(pin, 80))
	}
	d := s.dial()
	for _, p := range d.APIPins {
		if p == pin {
			return nil
		}
	}
	if p := d.NATSCAPin; p == pin {
		// The host verified the NATS server's certificate (enrolment
		// over NATS).
		return nil
	}
	return apiErr(protocol.APIWrongCA, "ca_pin %s is not the pin of this gateway's CA (%s): the connection went to another server than the one the token is for; check the URL and the pin", pin, cmpOrString(d.APIPin, d.NATSCAPin))
}

func cmpOrString(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

// checkFacts bounds the facts a host reports.
func checkFacts(f *protocol.AgentFacts) *protocol.APIError {
	for name, v := range map[string]string{"os": f.OS, "arch": f.Arch, "hostname": f.Hostname, "kernel": f.Kernel} {
		if len(v) > maxFactLen || !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return apiErr(protocol.APIBadRequest, "fact %s is longer than %d bytes or holds control characters", name, maxFactLen)
		}
	}
	return nil
}

// Enrol handles an enrolment request.
func (s *Service) Enrol(ctx context.Context, req *protocol.EnrolRequest, out *Outcome) (*protocol.EnrolResponse, *protocol.APIError) {
	out.Key, out.Host = req.PublicKey, req.Host
	id, secret, err := protocol.ParseJoinToken(req.Token)
	if err != nil {
		return nil, apiErr(protocol.APIBadRequest, "%v", err)
	}
	out.TokenID = id
	if req.Host != "" {
		if err := protocol.ValidateHost(req.Host); err != nil {
			return nil, apiErr(protocol.APINameNotAllowed, "%v", err)
		}
	}
	if aerr := checkFacts(&req.Facts); aerr != nil {
		return nil, aerr
	}
	if aerr := s.checkPin(req.CAPin); aerr != nil {
		return nil, aerr
	}
	if aerr := s.checkProof(ctx, &req.Proof, req.SigningBytes()); aerr != nil {
		return nil, aerr
	}
	if resp, done, aerr := s.enrolAgain(ctx, id, secret, req, out); done {
		return resp, aerr
	}
	var host string
	var replace bool
	tok, aerr := s.tokens.consume(ctx, id, secret, s.now, func(t *tokenRecord) *protocol.APIError {
		var aerr *protocol.APIError
		host, replace, aerr = t.allowName(req.Host, req.Facts.Hostname)
		return aerr
	})
	if aerr != nil && aerr.Code == protocol.APITokenSpent && s.agents.sync(ctx) == nil {
		// A retry this gateway's index had not seen yet.
		if resp, done, rerr := s.enrolAgain(ctx, id, secret, req, out); done {
			return resp, rerr
		}
	}
	if aerr != nil {
		return nil, aerr
	}
	out.Host, out.Labels = host, tok.Labels
	creds, err := s.enrol(ctx, enrolment{host: host, userPub: req.PublicKey, labels: tok.Labels, tokenID: id, facts: req.Facts,
		replace: replace, by: "token " + id})
	if err != nil {
		s.giveBackUse(ctx, id, host, err)
		return nil, enrolError(host, err)
	}
	out.TokenStopped = !tok.enrolKeyRevokedAt().IsZero()
	return s.enrolResponse(&creds), nil
}

// giveBackUse gives the use of token id that a failed enrolment of host
// spent back, unless the enrolment may be stored (maybeStored): then
// the use stays spent, or the token would count one enrolment fewer than
// it made. A context that ended must not keep the use from going back.
func (s *Service) giveBackUse(ctx context.Context, id, host string, err error) {
	var stored maybeStored
	if errors.As(err, &stored) {
		s.log.Warn("enrol: the enrolment failed but may be stored; the use of the join token it spent stays spent (if it is stored, the host's retry with the same key and token spends no other)",
			"token", id, "host", host, "err", err)
		return
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*jskv.Timeout)
	defer cancel()
	if berr := s.tokens.giveBack(bctx, id); berr != nil {
		s.log.Error("enrol: a use of the join token was spent on a failed enrolment and could not be given back", "token", id, "err", berr)
	}
}

// issueError turns an error of AgentJWT into the API error the host
// gets: a key the fleet account holds revoked is refused for good.
func issueError(host string, err error) *protocol.APIError {
	if errors.Is(err, ErrKeyRevoked) {
		return apiErr(protocol.APIKeyRevoked, "%v", err)
	}
	return apiErr(protocol.APIUnavailable, "the gateway could not issue a credential for %s (%v): try again in a moment", host, err)
}

// enrolError turns an error of enrol into the API error the host gets.
func enrolError(host string, err error) *protocol.APIError {
	switch {
	case errors.Is(err, ErrKeyRevoked):
		return apiErr(protocol.APIKeyRevoked, "%v", err)
	case errors.Is(err, ErrHostRevoked):
		return apiErr(protocol.APIHostRevoked, "%v", err)
	case errors.Is(err, ErrNameTaken):
		return apiErr(protocol.APINameTaken, "%v", err)
	case errors.Is(err, ErrKeyInUse):
		return apiErr(protocol.APINameTaken, "%v", err)
	}
	return apiErr(protocol.APIUnavailable, "enrolling %s failed on the gateway (%v): try again in a moment", host, err)
}

func (s *Service) enrolResponse(c *AgentCredentials) *protocol.EnrolResponse {
	urls := c.NATSURLs
	if urls == nil {
		urls = []string{}
	}
	keys := c.SigningKeys
	if keys == nil {
		keys = []string{}
	}
	return &protocol.EnrolResponse{Host: c.Host, JWT: c.JWT, Expires: c.Expires, NATSURLs: urls, NATSCA: string(c.CAPEM),
		Labels: c.Labels, SigningKeys: keys, SigningKeySerial: c.SigningKeySerial}
}

// Errors of recovery and renewal.
var (
	errNotTheKey  = errors.New("not the host's key")
	errNoRecovery = errors.New("no recovery allowed")
	// ErrRevoked: a request for a revoked host's record (a recovery, a
	// renewal, an operator allowing a recovery).
	ErrRevoked = errors.New("host revoked")
)

// Recover handles a recovery: an enrolled key whose credential expired
// gets a new one, if the operator allowed a recovery.
func (s *Service) Recover(ctx context.Context, req *protocol.RecoverRequest, out *Outcome) (*protocol.EnrolResponse, *protocol.APIError) {
	out.Key, out.Host = req.PublicKey, req.Host
	if err := protocol.ValidateHost(req.Host); err != nil {
		return nil, apiErr(protocol.APIBadRequest, "%v", err)
	}
	if aerr := s.checkPin(req.CAPin); aerr != nil {
		return nil, aerr
	}
	if aerr := s.checkProof(ctx, &req.Proof, req.SigningBytes()); aerr != nil {
		return nil, aerr
	}
	expires := s.now().Add(s.cfg.CredentialTTL).Truncate(time.Second)
	rec, err := s.agents.Modify(ctx, req.Host, func(r *AgentRecord) error {
		if err := keyHolds(r, req.PublicKey); err != nil {
			return err
		}
		if r.RecoveriesLeft <= 0 {
			return errNoRecovery
		}
		r.RecoveriesLeft--
		if expires.After(r.CredentialExpiresAt) {
			r.CredentialExpiresAt = expires
		}
		return nil
	})
	if err != nil {
		return nil, credentialError("recover", req.Host, req.PublicKey, err)
	}
	out.Labels = rec.Labels
	jwt, err := s.cfg.Issuer.AgentJWT(req.Host, req.PublicKey, expires)
	if err != nil {
		if _, gerr := s.agents.Modify(context.WithoutCancel(ctx), req.Host, func(r *AgentRecord) error { r.RecoveriesLeft++; return nil }); gerr != nil {
			s.log.Error("recover: a recovery was spent on a credential that could not be issued", "host", req.Host, "err", gerr)
		}
		return nil, issueError(req.Host, err)
	}
	d := s.dial()
	c := AgentCredentials{Host: req.Host, JWT: jwt, Expires: expires, NATSURLs: d.NATSURLs, CAPEM: d.NATSCAPEM, Labels: rec.Labels}
	return s.enrolResponse(&c), nil
}

// keyHolds refuses a request for host's record r made with another key
// than r's, or for a revoked host.
func keyHolds(r *AgentRecord, pub string) error {
	if r.PublicKey != pub {
		return errNotTheKey
	}
	if r.Revoked() {
		return ErrRevoked
	}
	return nil
}

// credentialError turns an error of recovery or renewal into an API
// error.
func credentialError(what, host, pub string, err error) *protocol.APIError {
	switch {
	case errors.Is(err, ErrUnknownAgent):
		return apiErr(protocol.APIUnknownHost, "host %s is not enrolled on this gateway: join it with a token (fleet-agent join)", host)
	case errors.Is(err, errNotTheKey):
		return apiErr(protocol.APIForbidden, "key %s is not the key host %s is enrolled with: %s is refused; join again with a token (an operator may need --replace %s)", pub, host, what, host)
	case errors.Is(err, ErrRevoked):
		return apiErr(protocol.APIHostRevoked, "host %s was revoked: no credential is issued for its key again; join with a new key and a token made with --replace %s", host, host)
	case errors.Is(err, errNoRecovery):
		return apiErr(protocol.APINoRecovery, "host %s may not recover its credential: an operator must allow it first (fleetctl agent allow-recovery %s), or join again with a token", host, host)
	}
	return apiErr(protocol.APIUnavailable, "%s of %s failed on the gateway (%v): try again in a moment", what, host, err)
}

// Locate answers a host that asks, with its enrolled key, for the NATS
// URLs to dial now: those it stored no longer answer (the gateway's
// addresses changed, or were wrong when it enrolled). It is given no
// credential, so it needs no recovery allowed. src is where the request
// came from, for Config.HandOut.
func (s *Service) Locate(ctx context.Context, req *protocol.LocateRequest, src string, out *Outcome) (*protocol.LocateResponse, *protocol.APIError) {
	out.Key, out.Host = req.PublicKey, req.Host
	if err := protocol.ValidateHost(req.Host); err != nil {
		return nil, apiErr(protocol.APIBadRequest, "%v", err)
	}
	if aerr := s.checkPin(req.CAPin); aerr != nil {
		return nil, aerr
	}
	if aerr := s.checkProof(ctx, &req.Proof, req.SigningBytes()); aerr != nil {
		return nil, aerr
	}
	rec, _, err := s.agents.Get(ctx, req.Host)
	if err == nil {
		err = keyHolds(rec, req.PublicKey)
	}
	if err != nil {
		return nil, credentialError("locate", req.Host, req.PublicKey, err)
	}
	out.Labels = rec.Labels
	if s.cfg.HandOut != nil {
		if aerr := s.cfg.HandOut(ctx, src); aerr != nil {
			return nil, aerr
		}
	}
	d := s.dial()
	urls := d.NATSURLs
	if urls == nil {
		urls = []string{}
	}
	return &protocol.LocateResponse{Host: req.Host, NATSURLs: urls, NATSCA: string(d.NATSCAPEM)}, nil
}
