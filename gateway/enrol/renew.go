package enrol

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

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
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

// renewer serves the requests of one subject in a queue group (the
// renewals, the enrolments over NATS), a bounded number at a time, until
// stopped.
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

// StartRenewals subscribes the gateway to the renewal subjects.
func (s *Service) StartRenewals() error {
	r, err := s.serveQueue(protocol.RenewSubjectAll, renewQueue, s.screenRenewal, s.renew)
	if err != nil {
		return fmt.Errorf("subscribe to renewals: %w", err)
	}
	s.renewals = r
	return nil
}

// serveQueue serves the requests on subject in queue with serve,
// renewWorkers at a time. screen, when not nil, sees each request first,
// on the subscription's goroutine, and answers itself (false) those that
// must cost no worker: it must not block.
func (s *Service) serveQueue(subject, queue string, screen func(*nats.Msg) bool, serve func(context.Context, *nats.Msg)) (*renewer, error) {
	r := &renewer{sem: make(chan struct{}, renewWorkers)}
	r.ctx, r.stop = context.WithCancel(context.Background())
	// On the connection of host requests: a host that floods them
	// delays nothing on the main connection.
	sub, err := s.cfg.HostConn.QueueSubscribe(subject, queue, func(m *nats.Msg) {
		if m.Reply == "" || screen != nil && !screen(m) {
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
			serve(r.ctx, m)
		})
	})
	if err != nil {
		r.stop()
		return nil, err
	}
	r.sub = sub
	return r, nil
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

// decodeNATSRequest decodes a request sent over NATS into v, a what: one
// JSON object of known fields, at most protocol.MaxAPIRequestBytes.
func decodeNATSRequest(data []byte, what string, v any) *protocol.APIError {
	if len(data) > protocol.MaxAPIRequestBytes {
		return apiErr(protocol.APIBadRequest, "the request is larger than %d bytes", protocol.MaxAPIRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiErr(protocol.APIBadRequest, "the request is not %s: %v", what, err)
	}
	if dec.More() {
		return apiErr(protocol.APIBadRequest, "the request is not %s: data after the JSON object", what)
	}
	return nil
}

// renewDueAt returns when a credential that expires at expires, issued
// for ttl, may be renewed: once half of ttl is left. The zero time
// (a record that does not say) is always due.
func renewDueAt(expires time.Time, ttl time.Duration) time.Time {
	if expires.IsZero() {
		return time.Time{}
	}
	return expires.Add(-ttl / 2)
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

// badReply is the refusal (audited, not sent) of a request whose reply
// subject is not under inboxPrefix.
func badReply(reply, inboxPrefix string) *protocol.APIError {
	return apiErr(protocol.APIBadRequest, "the reply subject %q is not under the sender's inbox prefix %s: no answer is sent", protocol.Ellipsis(reply, 80), inboxPrefix)
}

// screenRenewal answers at once, without a worker, a nonce, a record
// update or an audit record, the renewal requests of a host whose
// credential is not past half its life yet, and those beyond the host's
// bound (Config.Bounds); each is counted, and logged at most once a
// minute per host. It reports whether the request goes on to renew.
func (s *Service) screenRenewal(m *nats.Msg) bool {
	host, ok := renewHost(m.Subject)
	if !ok {
		return true // renew refuses it, and records why
	}
	b := s.cfg.Bounds
	var aerr *protocol.APIError
	if rec, ok := s.index.Record(host); ok && !rec.Revoked() {
		if due := renewDueAt(rec.CredentialExpiresAt, s.cfg.CredentialTTL); s.now().Before(due) {
			b.Early(host, due)
			aerr = apiErr(protocol.APITooEarly, "the credential of %s is renewed once past half its life, from %s (gateway time); until then it keeps the one it has: ask again then",
				host, due.UTC().Format(time.RFC3339))
		}
	}
	if aerr == nil {
		ok, wait, limit := b.AllowRenewal(host)
		if ok {
			return true
		}
		b.RateLimited(host, limit)
		aerr = apiErr(protocol.APIRateLimited, "host %s asked for more renewals than the gateway takes (%s): ask again in %s",
			host, limit, wait.Round(time.Second))
	}
	if protocol.IsAgentReply(host, m.Reply) {
		data, _ := json.Marshal(aerr)
		_ = m.Respond(data)
	}
	return false
}

// renew answers one renewal request.
func (s *Service) renew(ctx context.Context, m *nats.Msg) {
	ctx, cancel := context.WithTimeout(ctx, 4*jskv.Timeout)
	defer cancel()
	out := Outcome{}
	if host, ok := renewHost(m.Subject); !ok || !protocol.IsAgentReply(host, m.Reply) {
		out.Host = host
		s.cfg.Record("renew", "nats", &out, badReply(m.Reply, protocol.AgentInboxPrefix(host)))
		return
	}
	resp, aerr := s.renewCredential(ctx, m, &out)
	var data []byte
	if aerr != nil {
		data, _ = json.Marshal(aerr)
	} else {
		data, _ = json.Marshal(resp)
	}
	if err := m.Respond(data); err != nil {
		s.log.Warn("renewal: the answer could not be sent", "host", out.Host, "err", err)
	}
	s.cfg.Record("renew", "nats", &out, aerr)
}

func (s *Service) renewCredential(ctx context.Context, m *nats.Msg, out *Outcome) (*protocol.RenewResponse, *protocol.APIError) {
	host, ok := renewHost(m.Subject)
	if !ok {
		return nil, apiErr(protocol.APIBadRequest, "subject %s is not a renewal subject", m.Subject)
	}
	out.Host = host
	var req protocol.RenewRequest
	if aerr := decodeNATSRequest(m.Data, "a renewal request", &req); aerr != nil {
		return nil, aerr
	}
	out.Key = req.PublicKey
	if req.Host != host {
		return nil, apiErr(protocol.APIBadRequest, "the request is for host %q but was sent on the subject of host %s: send it to %s", protocol.Ellipsis(req.Host, 60), host, protocol.RenewSubject(req.Host))
	}
	if aerr := s.checkProof(ctx, &req.Proof, req.SigningBytes()); aerr != nil {
		return nil, aerr
	}
	expires := s.now().Add(s.cfg.CredentialTTL).Truncate(time.Second)
	rec, err := s.agents.Modify(ctx, host, func(r *AgentRecord) error {
		if err := keyHolds(r, req.PublicKey); err != nil {
			return err
		}
		if !expires.After(r.CredentialExpiresAt) {
			return jskv.ErrSkip
		}
		r.CredentialExpiresAt = expires
		return nil
	})
	if err != nil {
		return nil, credentialError("renewal", host, req.PublicKey, err)
	}
	out.Labels = rec.Labels
	jwt, err := s.cfg.Issuer.AgentJWT(host, req.PublicKey, expires)
	if err != nil {
		return nil, issueError(host, err)
	}
	return &protocol.RenewResponse{JWT: jwt, Expires: expires}, nil
}
