package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
)

// Enrolment over NATS, for hosts that reach the NATS servers but not the
// fleet API. A join token made with NATS set comes with an enrol
// credential: a user JWT for a throw-away key (whose seed goes to the
// operator with the token, and is never stored), signed by the fleet
// account's scoped enrol signing key, whose template allows publishing
// on the token's enrolment subject and subscribing to its private inbox
// prefix, nothing else, with a small payload and subscription limit;
// the credential names its token in a tag and carries the token's
// expiry. It is not a bearer token (the account allows none): the host
// signs the server's nonce with the seed.
//
// The gateways serve protocol.EnrolSubjectAll in a queue group and answer
// each request with enrolHost, the very checks of the fleet API, audited
// the same way. Once the token is revoked, or spent and the enrolment
// retry window over (a host whose answer was lost may ask again, see
// enrolretry.go), the enrol credential's key is revoked in the fleet
// account like a revoked host's (tokenStore.RevokedKeys feeds the same
// reconcile).

// natsEnrolQueue is the queue group of the gateways serving enrolments
// over NATS.
const natsEnrolQueue = "fleet-gateway-enrol"

// RevokedKeys returns the enrol credentials' keys of the tokens that
// stopped working before they expired: revoked, or spent longer ago than
// the enrolment retry window. Their entries go once the token has
// expired, when the credential has too.
func (s *tokenStore) RevokedKeys(ctx context.Context) ([]natsauth.RevokedKey, error) {
	all, err := s.all(ctx)
	if err != nil {
		return nil, err
	}
	now := s.now()
	var out []natsauth.RevokedKey
	for _, e := range all {
		if e.putBack && e.rec.EnrolKey != "" {
			// The token is refused for good: so is its enrol credential,
			// every one issued until it expires.
			out = append(out, natsauth.RevokedKey{Pub: e.rec.EnrolKey, RevokedAt: e.rec.ExpiresAt, Expires: e.rec.ExpiresAt, Exact: true})
			continue
		}
		at := e.rec.enrolKeyRevokedAt()
		if at.IsZero() || e.rec.RevokedAt.IsZero() && now.Before(at.Add(s.retryWindow)) {
			// A spent token's credential stays good for the retry
			// window: a host whose answer was lost can ask again.
			continue
		}
		out = append(out, natsauth.RevokedKey{Pub: e.rec.EnrolKey, RevokedAt: at, Expires: e.rec.ExpiresAt, Exact: true})
	}
	return out, nil
}

// enrolKeyRevokedAt is when the token's enrol credential must stop
// working: when it was revoked or spent (zero: it has none, or the
// token still works until it expires).
func (t *tokenRecord) enrolKeyRevokedAt() time.Time {
	if t.EnrolKey == "" {
		return time.Time{}
	}
	var at time.Time
	if t.Used >= t.Uses {
		at = cmpOr(t.SpentAt, t.CreatedAt)
	}
	if !t.RevokedAt.IsZero() && (at.IsZero() || t.RevokedAt.Before(at)) {
		at = t.RevokedAt
	}
	return at
}

// natsJoinToken gives the new token t an enrol credential, and returns
// the NATS join token that holds it and token, and the URLs to dial.
func (g *Gateway) natsJoinToken(t *tokenRecord, token string) (string, []string, error) {
	urls := g.AgentNATSURLs()
	if g.NATSCAPin() == "" || len(urls) == 0 {
		return "", nil, fmt.Errorf("%w: nats: enrolment over NATS needs the embedded NATS server serving TLS (--nats_listen on a non-loopback address, or --nats_tls)", errBadAdminRequest)
	}
	for _, u := range urls {
		if !strings.HasPrefix(u, "tls://") {
			return "", nil, fmt.Errorf("%w: nats: the NATS URL %s agents are given is not tls://: set --nats_advertise tls://HOST:PORT", errBadAdminRequest, u)
		}
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	defer kp.Wipe()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	cred, err := g.authority.EnrolJWT(t.ID, pub, t.ExpiresAt)
	if err != nil {
		return "", nil, fmt.Errorf("%w: nats: %w", errBadAdminRequest, err)
	}
	t.EnrolKey = pub
	nt := protocol.NATSJoinToken{Token: token, JWT: cred, Seed: string(seed)}
	return nt.Encode(), urls, nil
}

// startNATSEnrolment subscribes the gateway to the enrolment subjects.
func (g *Gateway) startNATSEnrolment() error {
	r, err := g.serveQueue(protocol.EnrolSubjectAll, natsEnrolQueue, nil, g.enrolOverNATS)
	if err != nil {
		return fmt.Errorf("subscribe to enrolments over NATS: %w", err)
	}
	g.natsEnrolments = r
	return nil
}

// enrolOverNATS answers one enrolment request sent over NATS, as the
// fleet API answers one sent over HTTPS.
func (g *Gateway) enrolOverNATS(ctx context.Context, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(ctx, 4*jskv.Timeout)
	defer cancel()
	out := enrolOutcome{}
	id, ok := protocol.TokenIDOfEnrolSubject(m.Subject)
	src := "nats:" + id
	if !ok || !protocol.IsReplyUnder(protocol.EnrolInboxPrefix(id), m.Reply) {
		out.tokenID = id
		g.api.failures.fail(src, g.now())
		g.auditEnrolment("enrol", "nats", &out, badReply(m.Reply, protocol.EnrolInboxPrefix(id)))
		return
	}
	var resp *protocol.EnrolResponse
	var aerr *protocol.APIError
	if wait, ok := g.api.failures.allowed(src, g.now()); !ok {
		aerr = apiErr(protocol.APIUnavailable, "too many refused requests for join token %s: wait %s and check the token, name and clock before trying again", id, wait.Round(time.Second))
	} else {
		resp, aerr = g.enrolNATSRequest(ctx, m, id, &out)
	}
	var data []byte
	if aerr != nil {
		if aerr.Code != protocol.APIUnavailable {
			g.api.failures.fail(src, g.now())
		}
		data, _ = json.Marshal(aerr)
	} else {
		data, _ = json.Marshal(resp)
	}
	if err := m.Respond(data); err != nil {
		g.log.Warn("enrolment over NATS: the answer could not be sent", "host", out.host, "token", id, "err", err)
	}
	g.auditEnrolment("enrol", "nats", &out, aerr)
	if out.tokenStopped {
		// The credential that asked is revoked (which closes its
		// connection) once a retry may no longer come.
		g.reconcileAt(g.now().Add(g.cfg.EnrolRetryWindow))
	}
}

func (g *Gateway) enrolNATSRequest(ctx context.Context, m *nats.Msg, id string, out *enrolOutcome) (*protocol.EnrolResponse, *protocol.APIError) {
	out.tokenID = id
	if id == "" {
		return nil, apiErr(protocol.APIBadRequest, "subject %s is not an enrolment subject", m.Subject)
	}
	var req protocol.EnrolRequest
	if aerr := decodeNATSRequest(m.Data, "an enrolment request", &req); aerr != nil {
		return nil, aerr
	}
	if tid, _, err := protocol.ParseJoinToken(req.Token); err == nil && tid != id {
		out.key = req.PublicKey
		return nil, apiErr(protocol.APIBadRequest, "the request carries join token %s but was sent on the subject of token %s: send it to %s", tid, id, protocol.EnrolSubject(tid))
	}
	return g.enrolHost(ctx, &req, out)
}
