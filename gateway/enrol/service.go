package enrol

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// Issuer issues the credentials enrolment hands out and says which keys
// may have one (the fleet's NATS authority).
type Issuer interface {
	// AgentJWT issues host's credential for its key userPub, valid
	// until expires. A key the fleet account holds revoked is refused
	// with an error that is an ErrKeyRevoked.
	AgentJWT(host, userPub string, expires time.Time) (string, error)
	// EnrolJWT issues the enrol credential of join token tokenID for
	// the throw-away key userPub, valid until expires.
	EnrolJWT(tokenID, userPub string, expires time.Time) (string, error)
	// CheckIssuable refuses a key the fleet account holds revoked (an
	// ErrKeyRevoked).
	CheckIssuable(userPub string) error
}

// Dial is what the gateway hands out to hosts, and the pins of the
// certificates they may have checked, as they are now.
type Dial struct {
	// NATSURLs are the URLs agents dial; NATSCAPEM the CA of the NATS
	// servers' certificates (empty: no TLS, or the system's roots), and
	// NATSCAPin its pin (empty: the NATS servers serve no TLS).
	NATSURLs  []string
	NATSCAPEM []byte
	NATSCAPin string
	// SigningKeys are the gateway keys agents trust, from the key set
	// SigningKeySerial.
	SigningKeys      []string
	SigningKeySerial uint64
	// APIURL is the fleet API's URL ("" when it is off); APIPins the
	// pins a request's ca_pin may carry for it (every certificate of its
	// chain), and APIPin the one to show.
	APIURL  string
	APIPins []string
	APIPin  string
}

// Outcome is what the audit and the log say about one enrolment,
// recovery, locate or renewal request.
type Outcome struct {
	Host, Key, TokenID string
	Labels             map[string]string
	// TokenStopped: the enrolment spent the token's last use, and it has
	// an enrol credential to revoke once the retry window has passed.
	TokenStopped bool
	// Retried: the request was a retry of an enrolment whose answer was
	// lost (enrolretry.go); it spent nothing.
	Retried bool
}

// Recorder audits and logs one request: what it was (enrol, recover,
// locate, renew), from where (src), its outcome and the refusal (nil:
// done).
type Recorder func(what, src string, out *Outcome, aerr *protocol.APIError)

// Bounds limits the renewals one host may ask for, and counts and logs
// those refused before they cost a worker.
type Bounds interface {
	// AllowRenewal takes one renewal of host from its bucket; when none
	// is left it says how long to wait, and the limit as text.
	AllowRenewal(host string) (ok bool, wait time.Duration, limit string)
	// Early counts and logs a renewal asked for before due.
	Early(host string, due time.Time)
	// RateLimited counts and logs a renewal beyond the host's limit.
	RateLimited(host, limit string)
}

// Config is what a Service is built from; the gateway wires it.
type Config struct {
	Log *slog.Logger
	Now func() time.Time
	// CredentialTTL is how long an agent credential is valid;
	// RetryWindow how long a host whose enrolment's answer was lost may
	// ask again with the same key and token.
	CredentialTTL time.Duration
	RetryWindow   time.Duration
	Replicas      int

	Issuer Issuer
	Dial   func() Dial
	// Reconcile brings the NATS servers' revocations in step with the
	// records now; ReconcileSoon asks for that in the background, and
	// ReconcileAt at t.
	Reconcile     func(context.Context) error
	ReconcileSoon func()
	ReconcileAt   func(t time.Time)
	// Record audits each request; Allowed and Fail are the limiter of
	// refused requests per source (Allowed says how long to wait).
	Record  Recorder
	Allowed func(src string, now time.Time) (time.Duration, bool)
	Fail    func(src string, now time.Time)
	// HandOut refuses, for a request from src, the NATS URLs the
	// gateway would hand out when they cannot serve it (nil: never).
	HandOut func(ctx context.Context, src string) *protocol.APIError
	Bounds  Bounds
	// HostConn is the connection the gateway hears hosts' requests on.
	HostConn *nats.Conn
}

// Service is enrolment: the agent records (with their index), the join
// tokens, the request nonces, and the requests that use them (enrol,
// recover, locate, renew, local enrolment, admin edits).
type Service struct {
	cfg    Config
	log    *slog.Logger
	now    func() time.Time
	index  *Index
	agents *Agents
	tokens *tokenStore
	nonces *nonceStore

	renewals, natsEnrolments *renewer
}

// New returns the service over the agent records agents (and their
// index), whose join tokens and nonces Open opens.
func New(cfg Config, index *Index, agents *Agents) *Service {
	return &Service{cfg: cfg, log: cfg.Log, now: cfg.Now, index: index, agents: agents}
}

// Open opens (or makes) the join tokens' and nonces' buckets with js;
// admin, when not nil, acts on the tokens' stream with the rights the
// gateway's own user lacks.
func (s *Service) Open(js jetstream.JetStream, seal *Seal, admin jskv.Admin) error {
	var err error
	if s.tokens, err = openTokenStore(js, seal, s.cfg.Replicas, s.now, s.cfg.RetryWindow, admin, s.log.With("component", "tokens")); err != nil {
		return err
	}
	if s.nonces, err = openNonceStore(js, s.cfg.Replicas); err != nil {
		return err
	}
	return nil
}

// MaxTokenTTL is the longest a join token (and so its enrol credential)
// is valid.
const MaxTokenTTL = maxTokenTTL

// Close stops serving renewals and enrolments over NATS and waits for
// those in progress.
func (s *Service) Close() {
	if s == nil {
		return
	}
	s.renewals.close()
	s.natsEnrolments.close()
}

func (s *Service) dial() Dial { return s.cfg.Dial() }

// apiErr builds an API error with a formatted message.
func apiErr(code protocol.APICode, format string, args ...any) *protocol.APIError {
	return &protocol.APIError{Code: code, Message: fmt.Sprintf(format, args...)}
}
