package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/enrol"
	"github.com/fleetmcp/fleetmcp/gateway/internal/loglimit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/netutil"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
	"github.com/fleetmcp/fleetmcp/gateway/skills"
)

// Gateway is a running control plane: the MCP endpoint, the host registry,
// the router and, unless an external cluster is used, the NATS server.
// Its state is held in a few parts, each a struct of its own that says
// what it holds and who may touch it.
type Gateway struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	conns   natsConns
	subsys  subsystems
	calling callHandling
	serving serving
	life    lifecycle
}

// natsConns are the gateway's NATS side: the embedded server or the
// external cluster, and the gateway's connections to it. Start and the
// files of natsconnect.go set them up and stopNATS takes them down;
// everything else only uses them.
type natsConns struct {
	// embedded is the embedded NATS server (nil with an external
	// cluster); external the files of an external cluster's setup (nil
	// with the embedded server).
	embedded *natsauth.Embedded
	external *natsauth.External
	// dataLock holds DataDir for this gateway while the embedded server
	// uses it (nil with an external cluster).
	dataLock *os.File
	nc       *nats.Conn
	// sys is the system user's connection: account JWT pushes and
	// lookups.
	sys *nats.Conn
	// hostNC is the connection the gateway hears the hosts' refusal
	// reports and renewals on: a host that floods them queues nothing
	// in front of the other hosts' replies on nc.
	hostNC *nats.Conn
	// natsCA is the fleet CA when the embedded server serves TLS with a
	// certificate from it; natsCAPEM the CA agents get for the NATS
	// servers (empty: no TLS, or the system's roots), natsPin its pin
	// (empty: the embedded server serves no TLS).
	natsCA    *natsauth.CA
	natsCAPEM []byte
	natsPin   string
}

// subsystems are the parts of the gateway its own packages implement
// (gateway/access, audit, enrol, natsauth, signing, skills). Start opens
// them and stopNATS closes them; the rest of the gateway calls them
// through their methods only. access and the signing keys change on
// reload (reload.go), under lifecycle.reloadMu.
type subsystems struct {
	// authority issues agent credentials and keeps the revocations and
	// the ledger of every key ever revoked; agents are the agent
	// records, agentIndex the gateway's copy of them.
	authority  *natsauth.Authority
	agents     *enrol.Agents
	agentIndex *enrol.Index
	// enrol is enrolment: the join tokens, the request nonces, enrolment
	// over HTTPS and NATS, recovery and renewal (gateway/enrol).
	enrol *enrol.Service
	// seal authenticates the agent records and join tokens.
	seal  *recordSeal
	audit *audit.Trail
	auth  *access.Authenticator // nil with authentication off
	// access are the access rules in force; a reload swaps them.
	access atomic.Pointer[access.Rules]
	// signer is the signing key (nil: skill rollout is off); keys serves
	// agents its key sets (gateway/signing).
	signer *signing.Keys
	keys   *signing.KeyServer
	// skillStore is the skill store and rollout controller (nil without
	// a signer).
	skillStore *skills.Store
}

// callHandling is what carries the tool calls to the hosts and their
// results back: the registry of hosts, the router and the limits around
// them. Set up by startNATS (and Start); used by the MCP tools, the
// fan-out and the HTTP APIs.
type callHandling struct {
	reg    *registry
	store  *hostStore
	router *router
	// requests are the contexts of the MCP requests in flight.
	requests requestContexts
	// calls counts tool calls in progress, so that Shutdown can wait for
	// their audit records (session calls outlive their HTTP requests).
	calls callCount
	// rates holds the per-caller rate-limit buckets.
	rates access.RateLimiters
	// agentLogs limits the lines logged about what agents send wrong.
	agentLogs *loglimit.Limiter
	// identityConflictCount counts the identity conflicts found
	// (connwatch.go).
	identityConflictCount atomic.Int64
	// bounds limits what one host can make the gateway do besides its
	// calls: refusal reports, renewals (hostbounds.go), heard on
	// natsConns.hostNC.
	bounds *hostBounds
	// agentSvc audits the hosts' refusal reports (refusals.go).
	agentSvc *agentServices
	// transfers bounds the memory of large requests and results.
	transfers *transfers
	// tracing makes the spans of calls (nil: off).
	tracing *tracing
}

// serving are the gateway's listeners and what they serve: the MCP
// endpoint, the fleet API, the metrics endpoint and the readiness
// answer. Start opens them, shutdown closes them.
type serving struct {
	ln     net.Listener
	mcpTLS bool // the MCP endpoint serves TLS (Config.TLSCert)
	http   *http.Server
	// skills serves the fleet's skills through the MCP Skills extension
	// (nil: not declared); set before Handler.
	skills *skills.Catalog
	// api is the fleet API listener (enrolment and admin), apiCA the
	// fleet CA when only the fleet API uses it.
	api   *fleetAPI
	apiCA *natsauth.CA
	// readiness is the last answer of /readyz (health.go).
	readiness readiness
	// metrics are the Prometheus metrics (metrics.go); metricsSrv serves
	// them on Config.MetricsListen (nil: not there).
	metrics    *metrics
	metricsSrv *http.Server
	metricsLn  net.Listener
}

// lifecycle is the gateway's own start, reload and stop: the loops it
// runs, its shutdown and its end. Only Start, reload and Shutdown touch
// it.
type lifecycle struct {
	// stopLoops ends the loops the gateway runs, loops joins them.
	stopLoops context.CancelFunc
	loops     sync.WaitGroup
	// reloadMu makes reloads one at a time, and guards stopping: set once
	// Shutdown begins, after which Reload does nothing (it would reopen
	// the audit file the shutdown closes).
	reloadMu     sync.Mutex
	stopping     bool
	shutdownOnce sync.Once
	shutdownErr  error
	// done receives the MCP server's end.
	done chan error
}

// Start validates cfg, starts (or connects to) NATS, listens on cfg.Listen
// and serves MCP until Shutdown. ctx bounds the start only (OIDC
// discovery, the checks of an external cluster, the first reconcile of
// revocations): cancelling it makes a start in progress fail and undo
// what it began; once Start has returned, only Shutdown stops the gateway.
func Start(ctx context.Context, cfg Config) (*Gateway, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, life: lifecycle{done: make(chan error, 1)},
		subsys: subsystems{agentIndex: enrol.NewIndex()}, now: time.Now, calling: callHandling{agentLogs: loglimit.New(logEvery, 1),
			transfers: newTransfers(cfg.MaxTransferBytes, cfg.TransferWait), tracing: newTracing(cfg.TracerProvider)}}
	if cfg.clock != nil {
		g.now = cfg.clock
	}
	g.calling.bounds = newHostBounds(g.now, cfg.AgentCredentialTTL)
	for _, w := range cfg.transportWarnings() {
		g.log.Warn(w)
	}
	g.subsys.access.Store(cfg.Access)
	if cfg.SkillSource != nil {
		g.serving.skills = skills.NewCatalog(cfg.SkillSource)
	}
	lookup := cfg.lookupIP
	if lookup == nil {
		lookup = net.DefaultResolver.LookupIPAddr
	}
	if err := cfg.checkAdvertised(ctx, lookup); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	if err := g.start(ctx); err != nil {
		g.closeStarted()
		return nil, err
	}
	g.serving.http = &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { g.life.done <- g.serving.http.Serve(g.serving.ln) }()
	g.logAccess()
	g.log.Info("gateway ready", "mcp", g.MCPURL(), "nats", g.NATSURL(), "fleet_api", g.APIURL(), "agents_dial", strings.Join(g.AgentNATSURLs(), ","), "auth", !cfg.AuthDisabled)
	return g, nil
}

// start brings up every part of the gateway but the MCP server, in
// order. A part it starts is recorded in g as soon as it runs, so that on
// failure closeStarted stops exactly what was started.
func (g *Gateway) start(ctx context.Context) error {
	if !g.cfg.AuthDisabled {
		a, err := access.NewAuthenticator(ctx, g.cfg.Auth, g.log.With("component", "auth"))
		if err != nil {
			return fmt.Errorf("caller authentication: %w", err)
		}
		g.subsys.auth = a
	}
	// The MCP address is taken first: a busy one fails at once, before
	// NATS and JetStream start.
	ln, err := netutil.Listen(g.cfg.Listen, "the MCP endpoint", "another fleet-gateway or web server", "--listen")
	if err != nil {
		return err
	}
	g.serving.ln = ln
	steps := []func() error{
		// The signing key is made before NATS starts: the router signs
		// calls with it, and a cluster's other gateways' data
		// directories can be seeded with it while this one waits for
		// JetStream (clusterseed.go).
		g.openSigningKey,
		func() error { return g.startNATS(ctx) },
		func() (err error) {
			g.resolveReplicas()
			patience := audit.StreamPatience
			if g.cfg.clustered() {
				patience = g.cfg.Cluster.Wait
			}
			seal, err := g.recordSeal()
			if err != nil {
				return err
			}
			g.subsys.audit, err = audit.Open(g.conns.nc, g.cfg.Audit, audit.Options{Name: g.cfg.Name, MaxCall: g.cfg.MaxCallDuration, Patience: patience,
				Admin: g.auditStreamAdmin(), Seal: auditSeal{seal}, Log: g.log.With("component", "audit")})
			return err
		},
		func() (err error) {
			g.calling.store, err = openHostStore(g.conns.nc, g.calling.reg, g.cfg.Hosts, g.log.With("component", "hosts"))
			return err
		},
		func() error { return g.openAgents(ctx) },
		g.openSkills,
		func() error {
			if g.serving.skills == nil && g.subsys.skillStore != nil {
				// The fleet's skills, as rolled out, are what the MCP
				// Skills extension serves.
				g.serving.skills = skills.NewCatalog(g.subsys.skillStore)
			}
			return nil
		},
		g.startEnrolment,
		func() error {
			if err := g.watchAuthErrors(); err != nil {
				g.log.Warn("refused NATS connections will not be logged", "err", err)
			}
			return nil
		},
		g.listenForAgents,
		g.mcpListenerTLS,
		func() error {
			g.serving.metrics = newMetrics(g)
			return g.serveMetrics()
		},
	}
	for _, step := range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("gateway start: %w", context.Cause(ctx))
		}
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// closeStarted undoes a start that failed part way: it stops, in the
// reverse order of start, every part that start got to (each stop does
// nothing for a part never started).
func (g *Gateway) closeStarted() {
	if g.serving.metricsSrv != nil {
		_ = g.serving.metricsSrv.Close()
	}
	if g.serving.ln != nil {
		g.serving.ln.Close()
	}
	_ = g.stopFleetAPI(context.Background())
	if g.subsys.audit != nil {
		_ = g.subsys.audit.Close(context.Background())
	}
	g.stopNATS()
}

// listenForAgents opens the embedded server's client port to agents, when
// there is one; a cluster node's listens from the start, as its routes
// need (package natsauth).
func (g *Gateway) listenForAgents() error {
	if g.conns.embedded == nil {
		return nil
	}
	return g.conns.embedded.ListenForAgents()
}

// mcpListenerTLS makes the MCP listener serve TLS when Config.TLSCert is
// set.
func (g *Gateway) mcpListenerTLS() error {
	if g.cfg.TLSCert == "" {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(g.cfg.TLSCert, g.cfg.TLSKey)
	if err != nil {
		return fmt.Errorf("MCP endpoint TLS (--tls_cert %s, --tls_key %s): %w", g.cfg.TLSCert, g.cfg.TLSKey, err)
	}
	g.serving.mcpTLS = true
	g.serving.ln = tls.NewListener(g.serving.ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return nil
}

// startEnrolment opens the join tokens and nonces, serves renewals,
// starts the token sweeper and the fleet API listener.
func (g *Gateway) startEnrolment() error {
	js, err := jetstream.New(g.conns.nc)
	if err != nil {
		return fmt.Errorf("enrolment: %w", err)
	}
	seal, err := g.recordSeal()
	if err != nil {
		return err
	}
	g.subsys.enrol = enrol.New(g.enrolConfig(), g.subsys.agentIndex, g.subsys.agents)
	if err := g.subsys.enrol.Open(js, seal.s, g.streamAdmin("KV_"+protocol.TokensBucket)); err != nil {
		return err
	}
	// The enrol credentials of spent and revoked join tokens are revoked
	// like the keys of revoked hosts.
	g.subsys.authority.SetRecords(natsauth.KeySources{agentRevocations{g.subsys.agents}, tokenRevocations{g.subsys.enrol}})
	g.reconcileSoon()
	if err := g.subsys.enrol.StartRenewals(); err != nil {
		return err
	}
	lctx, stop := context.WithCancel(context.Background())
	prev := g.life.stopLoops
	g.life.stopLoops = func() { stop(); prev() }
	g.life.loops.Go(func() { g.subsys.enrol.SweepLoop(lctx) })
	if err := g.startFleetAPI(); err != nil {
		return err
	}
	if err := g.subsys.enrol.StartNATSEnrolment(); err != nil {
		_ = g.stopFleetAPI(context.Background())
		return err
	}
	if err := g.startAgentServices(); err != nil {
		_ = g.stopFleetAPI(context.Background())
		return err
	}
	return nil
}

// SecretPaths are the files and directories that hold the gateway's
// secrets and state, which no agent running in the gateway's process may
// let its tools reach: its data directory (JetStream, the agent records)
// and in it the NATS keys (nats/: operator, accounts, the agent signing
// key, the account JWT) and the fleet CA's key. With an external cluster,
// the files of its setup: the creds and signing key seeds, and the fleet
// CA's key when the fleet API uses it. Always the keys of the fleet API's
// and the MCP endpoint's own certificates (--api_tls_key, --tls_key), and
// the gateway's own signing key.
func (g *Gateway) SecretPaths() []string {
	abs := func(p string) string {
		if a, err := filepath.Abs(p); err == nil {
			return a
		}
		return p
	}
	var out []string
	// The private keys of the listeners' own certificates.
	for _, f := range []string{g.cfg.APITLSKey, g.cfg.TLSKey, g.cfg.NATSTLSKey} {
		if f != "" {
			out = append(out, abs(f))
		}
	}
	if p := signing.KeyPath(g.cfg.SigningKeyFile, g.cfg.DataDir); p != "" {
		out = append(out, abs(p))
	}
	if g.conns.embedded == nil {
		for _, f := range []string{g.cfg.NATSCredsFile, g.cfg.NATSSystemCredsFile, g.cfg.NATSAgentSigningKeyFile, g.cfg.NATSOperatorSigningKeyFile} {
			if f != "" {
				out = append(out, abs(f))
			}
		}
		if g.serving.apiCA != nil {
			// The fleet CA of the fleet API, in the data directory.
			out = append(out, natsauth.CAKeyPath(abs(g.cfg.DataDir)))
		}
		return out
	}
	dir := abs(g.cfg.DataDir)
	out = append(out, dir, filepath.Join(dir, natsauth.KeysDir), natsauth.CAKeyPath(dir))
	return append(out, natsauth.KeyFiles(dir)...)
}

// logAccess summarises who may do what, once at startup.
func (g *Gateway) logAccess() {
	if g.subsys.auth == nil {
		g.log.Warn("caller authentication is OFF: the local caller may use every tool on every host")
		return
	}
	a := g.cfg.Auth
	if a.Issuer != "" {
		g.log.Info("JWT callers", "issuer", a.Issuer, "audience", a.Audience, "algorithms", strings.Join(a.Algorithms, ","), "leeway", a.Leeway)
	}
	g.logGrants()
}

// logGrants logs the API tokens' grants and the access rules in force.
func (g *Gateway) logGrants() {
	if g.subsys.auth == nil {
		return
	}
	if tokens := g.subsys.auth.Tokens(); tokens != nil {
		for _, line := range tokens.Summary() {
			g.log.Info("API token", "grant", line)
		}
	}
	if rules := g.subsys.access.Load(); rules != nil {
		g.log.Info("access rules", "file", rules.Source, "rules", rules.Len())
		for _, line := range rules.Summary() {
			g.log.Info("access rule", "rule", line)
		}
	}
}

// Handler returns the gateway's HTTP handler: the MCP endpoint at /mcp,
// health checks at /healthz and /readyz (health.go) and, with
// authentication on, the
// protected-resource metadata under /.well-known/oauth-protected-resource.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	var mcpHandler http.Handler = g.mcpHandler(g.newMCPServer())
	if g.subsys.auth != nil {
		mcpHandler = g.subsys.auth.Protect(mcpHandler)
		mux.Handle(access.MetadataPath, g.subsys.auth.Metadata())
		mux.Handle(access.MetadataPath+"/mcp", g.subsys.auth.Metadata())
	}
	mux.Handle("/mcp", mcpHandler)
	g.healthHandlers(mux)
	if g.cfg.Metrics {
		mux.Handle("GET /metrics", g.serving.metrics.handler())
	}
	return cors(g.cfg.CORSOrigins, mux)
}

// Addr returns the address the MCP endpoint listens on.
func (g *Gateway) Addr() string { return g.serving.ln.Addr().String() }

// MCPURL returns the URL an MCP client connects to.
func (g *Gateway) MCPURL() string {
	if g.serving.mcpTLS {
		return "https://" + g.Addr() + "/mcp"
	}
	return "http://" + g.Addr() + "/mcp"
}

// NATSURL returns the URL of the NATS servers as this machine reaches
// them: the embedded server's client address (tls:// when it serves
// TLS), or the external cluster's URLs.
func (g *Gateway) NATSURL() string {
	if g.conns.embedded == nil {
		return strings.Join(g.cfg.NATSURLs, ",")
	}
	if g.cfg.NATSListen == "" {
		return ""
	}
	return g.conns.embedded.ClientURL()
}

// AgentNATSURLs returns the URLs agents dial: NATSAdvertise when set;
// else the external cluster's URLs, or the embedded server's address,
// beyond loopback with the first Advertise name, or the machine's
// hostname when it listens on every interface.
func (g *Gateway) AgentNATSURLs() []string {
	if len(g.cfg.NATSAdvertise) > 0 {
		return slices.Clone(g.cfg.NATSAdvertise)
	}
	if g.conns.embedded == nil {
		return slices.Clone(g.cfg.NATSURLs)
	}
	raw := g.NATSURL()
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return []string{raw}
	}
	if !isLoopback(g.cfg.NATSListen) {
		// One --advertise names the fleet API and the NATS URLs both.
		u.Host = net.JoinHostPort(advertiseHost(g.cfg.NATSListen, g.cfg.Advertise), u.Port())
	}
	return []string{u.String()}
}

// NATSCAPEM returns the CA (PEM) that signs the NATS servers'
// certificates, for agents to trust; empty when NATS does not use TLS or
// the system's roots know its CA.
func (g *Gateway) NATSCAPEM() []byte { return slices.Clone(g.conns.natsCAPEM) }

// NATSCAPin returns the pin (protocol.CAPin) of the CA agents trust for
// the embedded server: the fleet CA, or the last certificate of
// NATSTLSCert; empty when the embedded server does not serve TLS.
func (g *Gateway) NATSCAPin() string { return g.conns.natsPin }

// advertisedNames are the names agents reach this machine by: Advertise
// and the hosts of NATSAdvertise.
func (g *Gateway) advertisedNames() []string {
	names := slices.Clone(g.cfg.Advertise)
	for _, a := range g.cfg.NATSAdvertise {
		full := a
		if !strings.Contains(a, "://") {
			full = "nats://" + a
		}
		if u, err := url.Parse(full); err == nil && u.Hostname() != "" {
			names = append(names, u.Hostname())
		}
	}
	return names
}

// Shutdown stops accepting requests, waits for in-flight ones until ctx
// ends, then closes NATS. Later calls return the first call's result.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.life.shutdownOnce.Do(func() { g.life.shutdownErr = g.shutdown(ctx) })
	return g.life.shutdownErr
}

func (g *Gateway) shutdown(ctx context.Context) error {
	g.life.reloadMu.Lock()
	g.life.stopping = true
	g.life.reloadMu.Unlock()
	err := g.serving.http.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = g.serving.http.Close()
	}
	err = errors.Join(err, g.stopFleetAPI(ctx))
	if g.serving.metricsSrv != nil {
		err = errors.Join(err, g.serving.metricsSrv.Close())
	}
	if serr := <-g.life.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	select {
	case <-g.calling.calls.drain():
	case <-ctx.Done():
		g.log.Warn("shutting down with tool calls still running; their audit records may be lost")
	}
	// Queued audit records are stored while NATS is still up.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	aerr := g.subsys.audit.Close(actx)
	g.stopNATS()
	return errors.Join(err, aerr)
}

// TransferBytesInUse returns how much of the budget for large transfers
// (Config.MaxTransferBytes) requests and results in flight hold now.
func (g *Gateway) TransferBytesInUse() int64 { return g.calling.transfers.inUse.Load() }

// Host returns what the gateway knows about host.
func (g *Gateway) Host(host string) (HostInfo, bool) { return g.calling.reg.get(host) }
