package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/enrol"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
)

// This file wires enrolment (gateway/enrol) into the gateway: the
// credentials it hands out, the revocations its records hold, the audit
// of its requests and the bounds of renewals.

// Enrolment's names, as the gateway's API gives them.
type (
	// AgentRecord is an enrolled host.
	AgentRecord = enrol.AgentRecord
	// RevokedKey is a key a host no longer uses.
	RevokedKey = enrol.RevokedKey
	// RecordedConflict is an identity conflict as a host's record keeps
	// it.
	RecordedConflict = enrol.RecordedConflict
	// AgentCredentials are what an enrolled agent needs to join the
	// fleet.
	AgentCredentials = enrol.AgentCredentials
	// EnrolOption adjusts a local enrolment.
	EnrolOption = enrol.Option
)

// Errors of enrolment and revocation (see gateway/enrol).
var (
	ErrUnknownAgent = enrol.ErrUnknownAgent
	ErrHostRevoked  = enrol.ErrHostRevoked
	ErrNameTaken    = enrol.ErrNameTaken
	ErrKeyRevoked   = enrol.ErrKeyRevoked
	ErrKeyInUse     = enrol.ErrKeyInUse
)

// ReplaceHost lets an enrolment take over the host name from another
// key, even a revoked one: the old key is revoked.
func ReplaceHost() EnrolOption { return enrol.ReplaceHost() }

// WithFacts records what the host is (OS, architecture, hostname), as a
// host that enrols over the network says of itself.
func WithFacts(f protocol.AgentFacts) EnrolOption { return enrol.WithFacts(f) }

// EnrolLocal enrols host with the public key userPub (an nkey user key
// whose seed the agent keeps) and labels, and issues its credential. It
// is the enrolment of agents the gateway's operator starts itself (the
// agent of --dev, tests, load tools). A host already enrolled with the
// same key is enrolled again (its labels replaced); another key for an
// enrolled or revoked host name is refused unless ReplaceHost is given,
// and a revoked key is always refused.
func (g *Gateway) EnrolLocal(ctx context.Context, host, userPub string, labels map[string]string, opts ...EnrolOption) (AgentCredentials, error) {
	return g.subsys.enrol.EnrolLocal(ctx, host, userPub, labels, opts...)
}

// SetAgentLabels sets the labels in set and removes those named in remove
// from host's record, and returns the host's labels after the change.
// Access rules and selectors see the new labels at once.
func (g *Gateway) SetAgentLabels(ctx context.Context, host string, set map[string]string, remove []string) (map[string]string, error) {
	return g.subsys.enrol.SetAgentLabels(ctx, host, set, remove)
}

// Agents returns every agent record, sorted by host.
func (g *Gateway) Agents(ctx context.Context) ([]AgentRecord, error) {
	return g.subsys.enrol.Agents(ctx)
}

// Agent returns host's record as stored now.
func (g *Gateway) Agent(ctx context.Context, host string) (AgentRecord, error) {
	return g.subsys.enrol.Agent(ctx, host)
}

// AllowRecovery lets host recover its credential count more times (it
// may then get a new credential with its key alone, once expired).
func (g *Gateway) AllowRecovery(ctx context.Context, host string, count int) error {
	return g.subsys.enrol.AllowRecovery(ctx, host, count)
}

// JoinTokens describes every join token kept, oldest first.
func (g *Gateway) JoinTokens(ctx context.Context) ([]protocol.TokenInfo, error) {
	return g.subsys.enrol.JoinTokens(ctx)
}

// RevokeJoinToken revokes join token id, as by: no host can enrol with
// it any more.
func (g *Gateway) RevokeJoinToken(ctx context.Context, id, by string) error {
	_, _, err := g.subsys.enrol.RevokeJoinToken(ctx, id, by)
	return err
}

// CreateJoinToken creates a join token as req says, made by by, and
// returns it with the commands that join a host with it.
func (g *Gateway) CreateJoinToken(ctx context.Context, req *protocol.TokenCreateRequest, by string) (*protocol.TokenCreateResponse, error) {
	return g.subsys.enrol.CreateJoinToken(ctx, req, by)
}

// enrolConfig wires enrolment to the rest of the gateway.
func (g *Gateway) enrolConfig() enrol.Config {
	return enrol.Config{
		Log: g.log, Now: g.now, CredentialTTL: g.cfg.AgentCredentialTTL, RetryWindow: g.cfg.EnrolRetryWindow, Replicas: g.cfg.Hosts.Replicas,
		Issuer: enrolIssuer{g.subsys.authority}, Dial: g.enrolDial,
		Reconcile: g.subsys.authority.Reconcile, ReconcileSoon: g.reconcileSoon, ReconcileAt: g.reconcileAt,
		Record:  g.auditEnrolment,
		Allowed: func(src string, now time.Time) (time.Duration, bool) { return g.serving.api.failures.allowed(src, now) },
		Fail:    func(src string, now time.Time) { g.serving.api.failures.fail(src, now) },
		HandOut: g.checkHandOut,
		Bounds:  renewalBounds{b: g.calling.bounds, log: g.log}, HostConn: g.conns.hostNC,
	}
}

// enrolDial is what enrolment hands out, as it is now.
func (g *Gateway) enrolDial() enrol.Dial {
	d := enrol.Dial{NATSURLs: g.AgentNATSURLs(), NATSCAPEM: g.NATSCAPEM(), NATSCAPin: g.NATSCAPin(), SigningKeys: g.SigningKeys(),
		SigningKeySerial: g.SigningKeySerial(), APIURL: g.APIURL(), APIPin: g.APICAPin()}
	if g.serving.api != nil {
		d.APIPins = g.serving.api.pins
	}
	return d
}

// enrolIssuer issues enrolment's credentials with the authority; a key
// the authority refuses as revoked is refused with an error that is
// enrolment's ErrKeyRevoked as well as the authority's.
type enrolIssuer struct{ a *natsauth.Authority }

func (i enrolIssuer) AgentJWT(host, userPub string, expires time.Time) (string, error) {
	token, err := i.a.AgentJWT(host, userPub, expires)
	return token, asEnrolRevoked(err)
}

func (i enrolIssuer) EnrolJWT(tokenID, userPub string, expires time.Time) (string, error) {
	token, err := i.a.EnrolJWT(tokenID, userPub, expires)
	return token, asEnrolRevoked(err)
}

func (i enrolIssuer) CheckIssuable(userPub string) error {
	return asEnrolRevoked(i.a.CheckIssuable(userPub))
}

// asEnrolRevoked is err, as a keyRevokedError when the authority refused
// a revoked key.
func asEnrolRevoked(err error) error {
	if errors.Is(err, natsauth.ErrKeyRevoked) {
		return keyRevokedError{err}
	}
	return err
}

// keyRevokedError is the authority's refusal of a revoked key, which is
// also enrolment's ErrKeyRevoked.
type keyRevokedError struct{ err error }

func (e keyRevokedError) Error() string        { return e.err.Error() }
func (e keyRevokedError) Unwrap() error        { return e.err }
func (e keyRevokedError) Is(target error) bool { return target == enrol.ErrKeyRevoked }

// renewalBounds are the hosts' renewal bounds (hostbounds.go) as
// enrolment screens renewals with them.
type renewalBounds struct {
	b   *hostBounds
	log *slog.Logger
}

func (r renewalBounds) AllowRenewal(host string) (bool, time.Duration, string) {
	ok, wait := r.b.allowRenewal(host)
	if ok {
		return true, 0, "" // the text is for refusals only
	}
	return false, wait, r.b.renewLimitText()
}

func (r renewalBounds) Early(host string, due time.Time) {
	r.b.counts.renewalsEarly.Add(1)
	r.b.log(r.log, slog.LevelInfo, host, "renew-early", "renewal refused: the credential is not past half its life", "due", due.UTC())
}

func (r renewalBounds) RateLimited(host, limit string) {
	r.b.counts.renewalsRateLimited.Add(1)
	r.b.log(r.log, slog.LevelWarn, host, "renew-rate", "renewal refused: more renewals from the host than it may ask for", "limit", limit)
}

// agentRevocations are the keys the agent records hold revoked.
type agentRevocations struct{ a *enrol.Agents }

func (r agentRevocations) RevokedKeys(ctx context.Context) ([]natsauth.RevokedKey, error) {
	keys, err := r.a.Revocations(ctx)
	return fromRevocations(keys), err
}

// tokenRevocations are the enrol credentials' keys of the join tokens
// that stopped working.
type tokenRevocations struct{ s *enrol.Service }

func (r tokenRevocations) RevokedKeys(ctx context.Context) ([]natsauth.RevokedKey, error) {
	keys, err := r.s.TokenRevocations(ctx)
	return fromRevocations(keys), err
}

func fromRevocations(keys []enrol.Revocation) []natsauth.RevokedKey {
	var out []natsauth.RevokedKey
	for _, k := range keys {
		out = append(out, natsauth.RevokedKey{Pub: k.Key, RevokedAt: k.RevokedAt, Expires: k.Expires, Exact: k.Exact})
	}
	return out
}

// apiErr builds an API error with a formatted message.
func apiErr(code protocol.APICode, format string, args ...any) *protocol.APIError {
	return &protocol.APIError{Code: code, Message: fmt.Sprintf(format, args...)}
}
