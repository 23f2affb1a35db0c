package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/skills"
)

// Config configures a Gateway. Zero values mean the documented defaults;
// New validates the whole struct once.
type Config struct {
	// Listen is the HTTP address of the MCP endpoint. Default
	// 127.0.0.1:8080.
	Listen string
	// DataDir holds the embedded NATS server's state (JetStream), its
	// operator-mode keys (nats/) and the fleet CA (tls/). Required when
	// NATS is embedded.
	DataDir string

	// NATSURLs, when set, connect the gateway to an external NATS cluster
	// instead of embedding a server. Several gateways may share a cluster.
	// The cluster runs in operator mode; the four files below are then
	// required (fleet-gateway nats-setup writes them).
	NATSURLs []string
	// NATSCredsFile is the gateway's own user (a creds file: JWT and
	// seed) on the external cluster.
	NATSCredsFile string
	// NATSSystemCredsFile is a system account user, with which the
	// gateway looks up and pushes the fleet account JWT.
	NATSSystemCredsFile string
	// NATSAgentSigningKeyFile is the seed of the fleet account's scoped
	// signing key for agents.
	NATSAgentSigningKeyFile string
	// NATSOperatorSigningKeyFile is the seed of a signing key of the
	// cluster's operator, with which the gateway re-signs the fleet
	// account JWT to change its revocations. Without it, the gateway
	// asks the cluster's revoker (RunRevoker), which holds the key: the
	// operator signing key can re-sign any account, so a gateway that
	// holds it can erase the audit trail.
	NATSOperatorSigningKeyFile string
	// NATSCAFile is the CA of an external cluster's TLS certificates (PEM)
	// when the system's roots do not know it: the gateway trusts it, and
	// agents get it at enrolment.
	NATSCAFile string
	// NATSListen is where the embedded server listens for agents
	// (host:port). Empty: it listens nowhere and only in-process clients
	// connect. Default for the command line: 127.0.0.1:4222. Beyond
	// loopback it serves TLS only.
	NATSListen string
	// NATSTLS makes the embedded server serve TLS on a loopback listener
	// too.
	NATSTLS bool
	// NATSTLSCert and NATSTLSKey are the embedded server's certificate
	// chain and key (PEM files, both or neither), instead of a
	// certificate from the fleet CA in DataDir; the server serves TLS with
	// them wherever it listens. The chain's last certificate must be a CA
	// certificate: agents get it at enrolment and trust it alone for the
	// NATS servers, and a NATS join token pins it.
	NATSTLSCert, NATSTLSKey string
	// SigningKeyFile is the gateway's ed25519 signing key (every message
	// that makes an agent act, skill manifests and desired states),
	// shared by the replicas of one fleet, with its directory (key sets
	// and rotation: gateway/signing). Default: DATA_DIR/signing/gateway.key,
	// generated on first start. Required with an external cluster and no
	// DataDir.
	SigningKeyFile string
	// NATSAdvertise are the NATS URLs agents dial, as they reach this
	// gateway (a load balancer, a DNS name). Default: derived from
	// NATSListen (beyond loopback tls://ADVERTISE:PORT, ADVERTISE the
	// first of Advertise, else the hostname for every interface), or
	// NATSURLs.
	NATSAdvertise []string
	// Advertise are further names (DNS names or IP addresses) agents
	// reach this machine by, added to its certificates. The first one is
	// the host of the fleet API's URL and, for a NATS listener beyond
	// loopback, of the NATS URLs agents are given (unless NATSAdvertise
	// is set). Start refuses a name advertised for a listener beyond
	// loopback that resolves to loopback only (advertise.go).
	Advertise []string
	// NATSMaxPayload sets the embedded server's max_payload (default 1 MiB).
	NATSMaxPayload int32

	// Name is this gateway's name among its replicas (letters, digits, -
	// and _, at most 63). The MCP sessions it makes have IDs that start
	// with it (NAME.<random>), so that a load balancer can send each
	// session's requests to the gateway that holds the session; in an
	// embedded cluster it names the gateway's NATS server, which must
	// keep its name across restarts. Default: none (session IDs are
	// random); with NATSCluster, the machine's hostname.
	Name string
	// Cluster makes the embedded server a node of a NATS cluster with
	// the embedded servers of other gateways (cluster.go).
	Cluster ClusterConfig
	// APIListen is the address of the fleet API (host enrolment and
	// recovery, the admin API), always served over TLS. Empty: no fleet
	// API. Default for the command line: 127.0.0.1:8443.
	APIListen string
	// APITLSCert and APITLSKey are the fleet API's certificate chain and
	// key (PEM files, both or neither). Default: a certificate from the
	// fleet CA in DataDir. Hosts pin the last certificate of the chain.
	APITLSCert, APITLSKey string
	// TLSCert and TLSKey make the MCP endpoint serve TLS with this
	// certificate chain and key (PEM files, both or neither).
	TLSCert, TLSKey string
	// AgentCredentialTTL is how long an agent's NATS credential is valid.
	// Default 720h (30 days).
	AgentCredentialTTL time.Duration
	// EnrolRetryWindow is how long after a host enrolled with a join
	// token the same key may send the same token again and get a
	// credential, without spending a use: the answer to its first request
	// may have been lost on the way back. A token's enrol credential
	// (enrolment over NATS) stays good that long after the token is
	// spent, so that the retry can be sent. Default 10 min; 1 s to 1 h.
	EnrolRetryWindow time.Duration

	// AuthDisabled turns caller authentication off. It is only allowed on
	// a loopback listener, and then the one local caller may do
	// everything.
	AuthDisabled bool
	// Auth configures caller authentication: JWTs from an issuer, static
	// API tokens, or both. Required unless AuthDisabled.
	Auth access.AuthConfig
	// Access are the caller access rules (access.LoadRules). Required with a JWT
	// issuer; API tokens carry their own grants, and deny rules apply to
	// every caller.
	Access *access.Rules
	// RateLimit is each caller's tools/call limit where its access rule
	// or API token sets none (access.ParseRateLimit). Zero: unlimited.
	RateLimit access.RateLimit
	// Audit configures the audit trail.
	Audit audit.Config

	// MaxRequestBytes bounds one MCP request body (a write's content
	// travels in it). Default 64 MiB, the agents' default limit too.
	MaxRequestBytes int64
	// MaxTransferBytes bounds the bytes of large transfers (requests and
	// results over 1 MiB: writes, binary reads, images) the gateway holds
	// at once; each takes about two to three times its size in memory
	// while it passes. A request that does not fit waits up to
	// TransferWait, then is refused as busy; a result that does not fit
	// is fetched again from its agent once there is room, within the same
	// wait. Default 128 MiB; at least MaxRequestBytes.
	MaxTransferBytes int64
	// TransferWait is how long a large transfer may wait for room in the
	// budget. Default 10 s.
	TransferWait time.Duration

	// CORSOrigins are the browser origins (scheme://host[:port]) whose
	// pages may call the MCP endpoint: their CORS preflight is answered
	// and the MCP headers exposed. Default none.
	CORSOrigins []string

	// Metrics serves the Prometheus metrics at /metrics on the MCP
	// listener too, without authentication: only allowed on a loopback
	// Listen. MetricsListen serves them on a listener of their own
	// (host:port; empty: none), for a Prometheus server to scrape; that
	// endpoint has no authentication either, so keep it on loopback or a
	// network only the scraper reaches.
	Metrics       bool
	MetricsListen string

	// SessionTimeout closes MCP sessions idle this long. Default 30 min.
	SessionTimeout time.Duration
	// FileCallTimeout bounds file tool calls (read, write, edit, patch,
	// list, search, delete, move). Default 60 s.
	FileCallTimeout time.Duration
	// MaxCallDuration bounds any call, bash included; it is also how long an
	// agent may answer a call on NATS. Default 1 h.
	MaxCallDuration time.Duration
	// Silence is how long a call may go without any frame from its agent
	// before the gateway asks the agent for the call's state (again at
	// 1.5 × Silence); a call whose agent stays silent for 2 × Silence
	// fails. Default 5 s.
	Silence time.Duration
	// ProgressIdle is the longest a client waits for a progress
	// notification while a call runs silently (only clients that sent a
	// progress token get them). Default 5 s.
	ProgressIdle time.Duration
	// OfflineAfter is how long after its last heartbeat a host is shown
	// offline. Default 15 s (three missed 5 s heartbeats); 1 s to 10 min.
	// A host whose agent heartbeats less often than OfflineAfter/3 gets
	// three of its intervals, counting at most 1 min per interval: a host
	// that stops heartbeating is offline at most max(OfflineAfter, 3 min)
	// after its last heartbeat, on every gateway replica.
	OfflineAfter time.Duration
	// Hosts configures the hosts bucket the replicas share.
	Hosts HostsConfig

	// SystemPromptFile, when set, is a text/template that replaces the
	// bundled template of the resource://system-prompt resource. It is
	// read on every read of the resource; a file that cannot be read or
	// parsed falls back to the bundled template, with a warning logged.
	SystemPromptFile string

	// SkillSource, when set, is what the gateway serves through the MCP
	// Skills extension (skillsmcp.go) instead of its own skill store: a
	// deployment or a test that brings its skills from elsewhere.
	SkillSource skills.Source

	// TracerProvider, when set, makes a span of every tools/call and of
	// every call routed to a host, and carries the trace context to the
	// agents (trace.go). Nil: tracing is off.
	TracerProvider trace.TracerProvider

	// Logger receives the gateway's log. Default slog.Default().
	Logger *slog.Logger

	// clock, when set (tests), is the gateway's clock instead of
	// time.Now.
	clock func() time.Time
	// lookupIP, when set (tests), resolves the advertised names instead
	// of the system's resolver.
	lookupIP ipLookup
}

// DefaultMaxTransferBytes is the default of Config.MaxTransferBytes.
const DefaultMaxTransferBytes = 128 << 20

func (c *Config) setDefaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 64 << 20
	}
	if c.MaxTransferBytes == 0 {
		c.MaxTransferBytes = DefaultMaxTransferBytes
	}
	setDur(&c.TransferWait, 10*time.Second)
	setDur(&c.SessionTimeout, 30*time.Minute)
	setDur(&c.FileCallTimeout, 60*time.Second)
	setDur(&c.MaxCallDuration, time.Hour)
	setDur(&c.Silence, 5*time.Second)
	setDur(&c.OfflineAfter, 15*time.Second)
	setDur(&c.ProgressIdle, 5*time.Second)
	setDur(&c.AgentCredentialTTL, 720*time.Hour)
	setDur(&c.EnrolRetryWindow, 10*time.Minute)
	c.Auth.SetDefaults()
	c.Audit.SetDefaults()
	c.Hosts.setDefaults()
	c.Cluster.setDefaults(c)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

func setDur(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

func (c *Config) validate() error {
	var errs []error
	if len(c.NATSURLs) == 0 && c.DataDir == "" {
		errs = append(errs, errors.New("embedded NATS needs a data directory: set --data_dir"))
	}
	if len(c.NATSURLs) > 0 && c.DataDir == "" && c.SigningKeyFile == "" {
		errs = append(errs, errors.New("the gateway signs every call with its signing key, and an external NATS cluster keeps it nowhere: "+
			"give --signing_key FILE (fleet-gateway nats-setup writes one; every replica of the fleet the same) or --data_dir"))
	}
	for _, u := range c.NATSURLs {
		if err := protocol.ValidateNATSURL(u); err != nil {
			errs = append(errs, fmt.Errorf("--nats_url: %w", err))
		}
	}
	for _, u := range c.NATSAdvertise {
		if err := protocol.ValidateNATSURL(u); err != nil {
			errs = append(errs, fmt.Errorf("--nats_advertise: %w", err))
		}
	}
	errs = append(errs, c.validateExternal()...)
	errs = append(errs, c.validateCluster()...)
	errs = append(errs, c.validateTLS()...)
	if c.AgentCredentialTTL < time.Second || c.AgentCredentialTTL > 366*24*time.Hour {
		errs = append(errs, fmt.Errorf("agent credential TTL %s: use 1s to 8784h (a year)", c.AgentCredentialTTL))
	}
	if c.EnrolRetryWindow < time.Second || c.EnrolRetryWindow > time.Hour {
		errs = append(errs, fmt.Errorf("enrolment retry window %s: use 1s to 1h", c.EnrolRetryWindow))
	}
	errs = append(errs, c.validateAuth()...)
	errs = append(errs, validateCORSOrigins(c.CORSOrigins)...)
	if c.Metrics && !isLoopback(c.Listen) {
		errs = append(errs, fmt.Errorf("--metrics serves /metrics without authentication on the MCP endpoint, which listens beyond loopback (%s): use --metrics_listen 127.0.0.1:9464 (or an address only your Prometheus reaches) instead", c.Listen))
	}
	errs = append(errs, c.Audit.Validate()...)
	errs = append(errs, c.Hosts.validate()...)
	if c.MaxTransferBytes < c.MaxRequestBytes {
		errs = append(errs, fmt.Errorf("transfer budget %d MiB (--max_transfer_mib) is below the request limit of %d MiB: a request of that size could never be admitted",
			c.MaxTransferBytes>>20, c.MaxRequestBytes>>20))
	}
	if c.TransferWait < 0 {
		errs = append(errs, fmt.Errorf("transfer wait %s must not be negative", c.TransferWait))
	}
	if c.Silence < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("silence timeout %s is too short (minimum 100ms)", c.Silence))
	}
	if c.OfflineAfter < time.Second || c.OfflineAfter > 10*time.Minute {
		errs = append(errs, fmt.Errorf("offline-after %s: use 1s to 10m", c.OfflineAfter))
	}
	return errors.Join(errs...)
}

// validateTLS checks the certificate settings of the listeners.
func (c *Config) validateTLS() []error {
	var errs []error
	for _, p := range []struct{ cert, key, certFlag, keyFlag string }{
		{c.APITLSCert, c.APITLSKey, "--api_tls_cert", "--api_tls_key"}, {c.TLSCert, c.TLSKey, "--tls_cert", "--tls_key"},
		{c.NATSTLSCert, c.NATSTLSKey, "--nats_tls_cert", "--nats_tls_key"},
	} {
		if (p.cert == "") != (p.key == "") {
			errs = append(errs, fmt.Errorf("%s and %s go together: give both (the certificate chain and its key, PEM files) or neither", p.certFlag, p.keyFlag))
		}
	}
	if c.APIListen != "" {
		if _, _, err := net.SplitHostPort(c.APIListen); err != nil {
			errs = append(errs, fmt.Errorf("--api_listen %q is not host:port (\"off\" turns the fleet API off): %w", c.APIListen, err))
		}
		if c.APITLSCert == "" && c.DataDir == "" {
			errs = append(errs, errors.New("the fleet API (--api_listen) serves TLS with a certificate from the fleet CA in --data_dir: give --data_dir (every replica the same CA), or --api_tls_cert and --api_tls_key"))
		}
	} else if c.APITLSCert != "" {
		errs = append(errs, errors.New("--api_tls_cert is for the fleet API, which is off: give --api_listen too"))
	}
	if c.NATSTLSCert != "" && len(c.NATSURLs) == 0 && c.NATSListen == "" {
		errs = append(errs, errors.New("--nats_tls_cert is for the embedded NATS server's listener, which is off: give --nats_listen too"))
	}
	return errs
}

// validateExternal checks the files an external cluster needs, and that
// the embedded server's settings are not given with one.
func (c *Config) validateExternal() []error {
	files := []struct{ flag, value string }{
		{"--nats_creds", c.NATSCredsFile}, {"--nats_system_creds", c.NATSSystemCredsFile},
		{"--nats_agent_signing_key", c.NATSAgentSigningKeyFile},
	}
	var errs []error
	if len(c.NATSURLs) == 0 {
		for _, f := range append(files, struct{ flag, value string }{"--nats_ca", c.NATSCAFile},
			struct{ flag, value string }{"--nats_operator_signing_key", c.NATSOperatorSigningKeyFile}) {
			if f.value != "" {
				errs = append(errs, fmt.Errorf("%s is for an external NATS cluster (--nats_url); the embedded server makes its own keys in --data_dir", f.flag))
			}
		}
		return errs
	}
	var missing []string
	for _, f := range files {
		if f.value == "" {
			missing = append(missing, f.flag)
		}
	}
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("an external NATS cluster (--nats_url) runs in operator mode and needs %s: fleet-gateway nats-setup --out DIR writes them with the cluster's configuration (see deploy/nats/README.md)",
			strings.Join(missing, ", ")))
	}
	if c.NATSTLS {
		errs = append(errs, errors.New("--nats_tls is for the embedded server; an external cluster's URLs say whether it uses TLS (tls://)"))
	}
	if c.NATSTLSCert != "" {
		errs = append(errs, errors.New("--nats_tls_cert is for the embedded server; an external cluster's servers have their own certificates (give their CA with --nats_ca)"))
	}
	return errs
}

func (c *Config) validateAuth() []error {
	var errs []error
	if c.AuthDisabled {
		if !isLoopback(c.Listen) {
			errs = append(errs, fmt.Errorf("caller authentication is off, so the MCP endpoint may only listen on loopback, not %q: use --listen 127.0.0.1:PORT, or configure authentication (--jwt_issuer and --jwt_audience, or --api_tokens) instead of --no_auth/--dev", c.Listen))
		}
		if c.Auth.Configured() {
			errs = append(errs, errors.New("caller authentication is off (--dev or --no_auth), yet JWT or API-token settings are given: drop one or the other"))
		}
		if c.Access != nil {
			errs = append(errs, errors.New("access rules apply to authenticated callers, and authentication is off (--dev or --no_auth), where the local caller may do everything: drop --access or turn authentication on"))
		}
		return errs
	}
	if !c.Auth.Configured() {
		return append(errs, errors.New("caller authentication is not configured: set --jwt_issuer and --jwt_audience (or JWT_ISSUER and JWT_AUDIENCE), or --api_tokens FILE; "+
			"for this machine only, --dev or --no_auth on a loopback listener"))
	}
	errs = append(errs, c.Auth.Validate()...)
	if c.Auth.Issuer != "" && c.Access == nil {
		errs = append(errs, errors.New("JWT callers need access rules: set --access FILE (a caller no rule matches may do nothing)"))
	}
	return errs
}

// transportWarnings says which of the configured hops leave this machine
// without TLS: the MCP endpoint beyond loopback without TLSCert (callers'
// bearer tokens, and every tool's arguments and results, cross the
// network in the clear), and NATS URLs of an external cluster (or given
// to agents) that are plain nats:// to another machine (every call, file
// and output between the gateway and its agents does). Both are warned
// of, not refused: either hop is often protected by something the
// gateway cannot see (a TLS-terminating reverse proxy in front of the MCP
// endpoint, as deploy/proxy shows; a private network, WireGuard or a
// service mesh between the NATS servers and their clients), and a flag
// that such a deployment had to set to start would be set by every other
// one too, without a thought.
func (c *Config) transportWarnings() []string {
	var out []string
	if c.TLSCert == "" && !isLoopback(c.Listen) {
		out = append(out, fmt.Sprintf("the MCP endpoint listens beyond loopback (%s) without TLS: callers' bearer tokens and every tool's arguments and results "+
			"cross the network in the clear unless a TLS-terminating reverse proxy or a protected network carries them; give --tls_cert and --tls_key, "+
			"or keep --listen on loopback behind the proxy (deploy/proxy)", c.Listen))
	}
	for _, list := range []struct {
		flag string
		urls []string
	}{{"--nats_url", c.NATSURLs}, {"--nats_advertise", c.NATSAdvertise}} {
		for _, raw := range list.urls {
			if host, plain := plainNATSHost(raw); plain && !isLoopback(net.JoinHostPort(host, "0")) {
				out = append(out, fmt.Sprintf("%s %s is plain nats:// to another machine: every call, file and output between the gateway and its agents "+
					"crosses the network in the clear unless the network itself is protected; use tls:// with the servers serving TLS (deploy/nats)", list.flag, raw))
			}
		}
	}
	return out
}

// plainNATSHost returns the host of a NATS URL and whether it is plain
// (nats:// or no scheme; not tls://, wss://).
func plainNATSHost(raw string) (string, bool) {
	full := strings.TrimSpace(raw)
	if !strings.Contains(full, "://") {
		full = "nats://" + full
	}
	u, err := url.Parse(full)
	if err != nil || u.Hostname() == "" {
		return "", false
	}
	switch strings.ToLower(u.Scheme) {
	case "nats", "ws":
		return u.Hostname(), true
	}
	return u.Hostname(), false
}

// isLoopback reports whether addr (host:port) can only be reached from this
// machine.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
