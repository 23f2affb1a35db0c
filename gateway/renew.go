package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Renewal over NATS: an agent asks for a new credential on
// protocol.RenewSubject(host) before its credential expires. Its NATS
// permissions let it publish there only for its own host, so the
// subject proves the host; the request's signature proves the key. The
// gateway replicas serve every host's subject in one queue group, so one
// of them answers each request.

// renewQueue is the queue group of the gateways serving renewals.
const renewQueue = "fleet-gateway-renew"

// renewWorkers bounds the renewals one gateway handles at once.
const renewWorkers = 16

// renewer serves renewals until stopped.
type renewer struct {
	sub  *nats.Subscription
	sem  chan struct{}
	ctx  context.Context
	stop context.CancelFunc

	// mu guards closed and the start of a renewal, so that none starts
	// once close waits for them.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// startRenewals subscribes the gateway to the renewal subjects.
func (g *Gateway) startRenewals() error {
	r := &renewer{sem: make(chan struct{}, renewWorkers)}
	r.ctx, r.stop = context.WithCancel(context.Background())
	sub, err := g.nc.QueueSubscribe(protocol.RenewSubjectAll, renewQueue, func(m *nats.Msg) {
		if host, ok := renewHost(m.Subject); !ok || !protocol.IsAgentReply(host, m.Reply) {
			// The answer goes to the agent's own inbox or nowhere.
			g.log.Warn("renewal: ignoring a request whose reply subject is not the agent's inbox", "subject", m.Subject,
				"reply", clipText(m.Reply, 120))
			return
		}
		select {
		case r.sem <- struct{}{}:
		case <-r.ctx.Done():
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.closed {
			<-r.sem
			return
		}
		r.wg.Go(func() {
			defer func() { <-r.sem }()
			g.renew(r.ctx, m)
		})
	})
	if err != nil {
		r.stop()
		return fmt.Errorf("subscribe to renewals: %w", err)
	}
	r.sub = sub
	g.renewals = r
	return nil
}

// close stops taking renewals and waits for those in progress.
func (r *renewer) close() {
	if r == nil {
		return
	}
	_ = r.sub.Unsubscribe()
	r.stop()
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wg.Wait()
}

// renewHost returns the host of a renewal subject.
func renewHost(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, strings.TrimSuffix(protocol.RenewSubjectAll, "*.renew"))
	if !ok {
		return "", false
	}
	host, ok := strings.CutSuffix(rest, ".renew")
	return host, ok && protocol.ValidateHost(host) == nil
}

// renew answers one renewal request.
func (g *Gateway) renew(ctx context.Context, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(ctx, 4*jsTimeout)
	defer cancel()
	out := enrolOutcome{}
	resp, aerr := g.renewCredential(ctx, m, &out)
	var data []byte
	if aerr != nil {
		data, _ = json.Marshal(aerr)
	} else {
		data, _ = json.Marshal(resp)
	}
	if err := m.Respond(data); err != nil {
		g.log.Warn("renewal: the answer could not be sent", "host", out.host, "err", err)
	}
	g.auditEnrolment("renew", "nats", &out, aerr)
}

func (g *Gateway) renewCredential(ctx context.Context, m *nats.Msg, out *enrolOutcome) (*protocol.RenewResponse, *protocol.APIError) {
	host, ok := renewHost(m.Subject)
	if !ok {
		return nil, apiErr(protocol.APIBadRequest, "subject %s is not a renewal subject", m.Subject)
	}
	out.host = host
	if len(m.Data) > protocol.MaxAPIRequestBytes {
		return nil, apiErr(protocol.APIBadRequest, "the request is larger than %d bytes", protocol.MaxAPIRequestBytes)
	}
	var req protocol.RenewRequest
	dec := json.NewDecoder(bytes.NewReader(m.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, apiErr(protocol.APIBadRequest, "the request is not a renewal request: %v", err)
	}
	out.key = req.PublicKey
	if req.Host != host {
		return nil, apiErr(protocol.APIBadRequest, "the request is for host %q but was sent on the subject of host %s: send it to %s", clipText(req.Host, 60), host, protocol.RenewSubject(req.Host))
	}
	if aerr := g.checkProof(ctx, &req.Proof, req.SigningBytes()); aerr != nil {
		return nil, aerr
	}
	expires := g.now().Add(g.cfg.AgentCredentialTTL).Truncate(time.Second)
	rec, err := g.agents.modify(ctx, host, func(r *AgentRecord) error {
		if err := keyHolds(r, req.PublicKey); err != nil {
			return err
		}
		if !expires.After(r.CredentialExpiresAt) {
			return errSkip
		}
		r.CredentialExpiresAt = expires
		return nil
	})
	if err != nil {
		return nil, credentialError("renewal", host, req.PublicKey, err)
	}
	out.labels = rec.Labels
	jwt, err := g.authority.AgentJWT(host, req.PublicKey, expires)
	if err != nil {
		return nil, apiErr(protocol.APIUnavailable, "the gateway could not issue a credential for %s (%v): try again later", host, err)
	}
	return &protocol.RenewResponse{JWT: jwt, Expires: expires}, nil
}
