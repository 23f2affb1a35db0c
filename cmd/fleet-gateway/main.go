// Command fleet-gateway runs the fleetmcp control plane: the MCP endpoint AI
// clients connect to, and (unless --nats_url names an external cluster) an
// embedded NATS server that agents join. With --dev it also runs an agent
// for this machine, so one command gives a working fleet of one.
package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/agent/statelock"
	"github.com/fleetmcp/fleetmcp/cmd/internal/configfile"
	"github.com/fleetmcp/fleetmcp/cmd/internal/filemode"
	"github.com/fleetmcp/fleetmcp/cmd/internal/profile"
	"github.com/fleetmcp/fleetmcp/cmd/internal/tracing"
	"github.com/fleetmcp/fleetmcp/cmd/internal/version"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

func main() {
	// --version, the MCP server's version and the dev agent's say the
	// same.
	agent.Version = version.Get().Version
	gateway.Version = agent.Version
	// The in-process agent of --dev runs git through this executable.
	if code, ok := agent.RunGitGuard(os.Args); ok {
		os.Exit(code)
	}
	// Its commands start through it, kept out of the agent's state and
	// the gateway's data directory.
	if code, ok := agent.RunConfined(os.Args); ok {
		os.Exit(code)
	}
	// On Windows it also wraps background tasks, recording their exit
	// status when they end.
	if code, ok := agent.RunTaskWrapper(os.Args); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // help was asked for
		}
		fmt.Fprintln(os.Stderr, "fleet-gateway:", err)
		os.Exit(2)
	}
}

type options struct {
	// values are every flag's value, for the --config file's changes at
	// a SIGHUP (configChanges).
	values     map[string]string
	dev        bool
	devToken   bool
	noAuth     bool
	listen     string
	dataDir    string
	natsListen string
	natsTLS    bool
	natsURL    string
	maxPayload int
	sessionTTL time.Duration
	agentName  string
	agentTTL   time.Duration
	logLevel   string
	promptFile string

	apiListen, apiTLSCert, apiTLSKey string
	tlsCert, tlsKey                  string
	natsTLSCert, natsTLSKey          string

	natsAdvertise, advertise        string
	name                            string
	natsCluster, natsClusterListen  string
	natsRoutes                      string
	routeCert, routeKey, routeCA    string
	clusterWait                     time.Duration
	natsCreds, natsSysCreds, natsCA string
	natsAgentKey, natsOperatorKey   string

	jwtIssuer, jwtAudience, jwksURI string
	jwtAlgs, scopes                 string
	jwtLeeway                       time.Duration
	groupsClaim                     string
	resourceURL                     string
	accessFile, apiTokensFile       string
	rateLimit                       string
	newAPIToken                     string
	adminToken                      bool
	auditFile                       string
	auditRetention                  time.Duration
	auditReplicas                   int
	hostsRetention                  time.Duration
	hostsReplicas                   int
	hostsMaxMiB                     int64
	maxTransferMiB                  int64
	maxRequestMiB                   int64
	transferWait                    time.Duration
	version                         bool
	corsOrigins                     string
	metrics                         bool
	metricsListen                   string
	configFile                      string
	signingKey                      string
	otlpEndpoint                    string
	// set holds the flags given on the command line (not defaulted from
	// the environment).
	set map[string]bool
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("fleet-gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { printUsage(stderr, fs) }
	hostname, _ := os.Hostname()
	o := &options{}
	fs.BoolVar(&o.dev, "dev", false, "development mode: caller auth off, loopback only, plus an agent for this machine")
	fs.BoolVar(&o.devToken, "dev_join_token", false, "with --dev: also print a join token for one more host (one use, valid 15 minutes, revoked when the gateway stops)")
	fs.BoolVar(&o.noAuth, "no_auth", false, "turn caller authentication off (only allowed on a loopback --listen)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address of the MCP endpoint")
	fs.StringVar(&o.dataDir, "data_dir", defaultDataDir(getenv), "state directory for the embedded NATS server")
	fs.StringVar(&o.natsListen, "nats_listen", "127.0.0.1:4222", "where the embedded NATS server listens for agents (TLS beyond loopback)")
	fs.StringVar(&o.apiListen, "api_listen", "127.0.0.1:8443", `address of the fleet API (host enrolment and the admin API; always TLS); "off" turns it off`)
	fs.StringVar(&o.apiTLSCert, "api_tls_cert", "", "certificate chain (PEM) of the fleet API (default: issued from the fleet CA in --data_dir); hosts pin its last certificate")
	fs.StringVar(&o.apiTLSKey, "api_tls_key", "", "private key (PEM) of --api_tls_cert")
	fs.StringVar(&o.tlsCert, "tls_cert", "", "certificate chain (PEM): the MCP endpoint serves HTTPS with it (with --tls_key)")
	fs.StringVar(&o.tlsKey, "tls_key", "", "private key (PEM) of --tls_cert")
	fs.BoolVar(&o.natsTLS, "nats_tls", false, "the embedded NATS server serves TLS on a loopback --nats_listen too")
	fs.StringVar(&o.natsTLSCert, "nats_tls_cert", "", "certificate chain (PEM) of the embedded NATS server, ending with its CA's certificate (default: issued from the fleet CA in --data_dir); agents trust and pin that CA")
	fs.StringVar(&o.natsTLSKey, "nats_tls_key", "", "private key (PEM) of --nats_tls_cert")
	fs.StringVar(&o.natsAdvertise, "nats_advertise", "", "NATS URL(s) agents dial, comma-separated, overriding --advertise for NATS (default: from --nats_listen, tls://ADVERTISE:PORT beyond loopback, or --nats_url)")
	fs.StringVar(&o.advertise, "advertise", "", "names or addresses other machines reach this one by, comma-separated: the first is the host of the fleet API's URL and of the NATS URLs agents get; all go into the TLS certificates (default: the listeners' addresses, or the hostname for 0.0.0.0; one that resolves to loopback is refused)")
	fs.StringVar(&o.name, "name", "", "this gateway's name among its replicas (letters, digits, -, _): its MCP session IDs start with it, for a load balancer's session routing, and it names its NATS server in a cluster (default with --nats_cluster: the hostname)")
	fs.StringVar(&o.natsCluster, "nats_cluster", "", "make the embedded NATS server a node of the cluster NAME, with the other gateways' servers (--nats_routes); give every node a --data_dir seeded from the first (fleet-gateway replica-seed)")
	fs.StringVar(&o.natsClusterListen, "nats_cluster_listen", "0.0.0.0:6222", "with --nats_cluster: where this node listens for the other nodes' routes (TLS)")
	fs.StringVar(&o.natsRoutes, "nats_routes", "", "with --nats_cluster: the route URLs of the cluster's nodes, comma-separated, e.g. nats-route://gw1:6222,nats-route://gw2:6222,nats-route://gw3:6222")
	fs.StringVar(&o.routeCert, "nats_route_cert", "", "with --nats_cluster: this node's route certificate chain (PEM), for server and client authentication (default: issued from the fleet CA at every start)")
	fs.StringVar(&o.routeKey, "nats_route_key", "", "private key (PEM) of --nats_route_cert")
	fs.StringVar(&o.routeCA, "nats_route_ca", "", "CA (PEM) the other nodes' route certificates must chain to, with --nats_route_cert")
	fs.DurationVar(&o.clusterWait, "nats_cluster_wait", 2*time.Minute, "with --nats_cluster: how long to wait at start for a quorum of the nodes (at the first start, all of them)")
	fs.StringVar(&o.natsURL, "nats_url", getenv("FLEET_NATS_URL"), "external NATS cluster URL(s), comma-separated; disables the embedded server (env FLEET_NATS_URL)")
	fs.StringVar(&o.natsCreds, "nats_creds", "", "external cluster: the gateway's user creds file")
	fs.StringVar(&o.natsSysCreds, "nats_system_creds", "", "external cluster: a system account user's creds file (account JWT lookups and pushes)")
	fs.StringVar(&o.natsAgentKey, "nats_agent_signing_key", "", "external cluster: seed file of the fleet account's scoped agent signing key")
	fs.StringVar(&o.natsOperatorKey, "nats_operator_signing_key", "", "external cluster: seed file of an operator signing key (re-signs the account JWT for revocations); without it the cluster's revoker does (fleet-gateway nats-revoker), and the gateway holds no key that can re-sign an account")
	fs.StringVar(&o.natsCA, "nats_ca", "", "external cluster: CA certificate (PEM) of its TLS certificates, when the system's roots do not know it")
	fs.IntVar(&o.maxPayload, "nats_max_payload", 0, "embedded server's max message size in bytes (default 1 MiB)")
	fs.StringVar(&o.signingKey, "signing_key", "", "the gateway's signing key FILE (calls, skills), shared by the replicas of a fleet with its directory (default: DATA_DIR/signing/gateway.key, made on first start; required with --nats_url and no --data_dir)")
	fs.DurationVar(&o.agentTTL, "agent_credential_ttl", 720*time.Hour, "how long an agent's NATS credential is valid")
	fs.DurationVar(&o.sessionTTL, "session_timeout", 30*time.Minute, "close MCP sessions idle this long")
	fs.StringVar(&o.agentName, "agent_name", protocol.HostFromName(hostname), "with --dev: the name of this machine's agent")
	fs.StringVar(&o.logLevel, "log_level", "info", "debug, info, warn or error")
	fs.StringVar(&o.promptFile, "system_prompt", "", "text/template FILE for the resource://system-prompt resource, read on every read (default: the bundled template)")
	fs.DurationVar(&o.hostsRetention, "hosts_retention", 30*24*time.Hour, "forget hosts offline this long (0: never)")
	fs.IntVar(&o.hostsReplicas, "hosts_replicas", 0, "replicas of the shared buckets (hosts, agents, join tokens, nonces, skills); 0: 3 on a NATS cluster, else 1")
	fs.Int64Var(&o.hostsMaxMiB, "hosts_max_mib", gateway.DefaultHostsMaxBytes>>20, "memory the host registry may take, in MiB; announces beyond it are ignored")
	fs.Int64Var(&o.maxRequestMiB, "max_request_mib", 64, "largest MCP request body in MiB, 1 to 1024 (a write's content travels in it; agents take 64 MiB by default); a proxy in front must allow as much")
	fs.Int64Var(&o.maxTransferMiB, "max_transfer_mib", gateway.DefaultMaxTransferBytes>>20, "MiB of large requests and results (over 1 MiB) in flight at once; more wait, then are refused as busy")
	fs.DurationVar(&o.transferWait, "transfer_wait", 10*time.Second, "how long a large request or result may wait for room in --max_transfer_mib")
	fs.StringVar(&o.corsOrigins, "cors_origins", "", "browser origins whose pages may call the MCP endpoint (CORS), comma-separated, e.g. https://app.example.com (default: none)")
	fs.StringVar(&o.configFile, "config", "", "YAML FILE of settings, one key per flag (its name without dashes); flags on the command line win")
	fs.BoolVar(&o.metrics, "metrics", false, "serve Prometheus metrics at /metrics on a loopback --listen too (no authentication)")
	fs.StringVar(&o.otlpEndpoint, "otlp_endpoint", "", "send OpenTelemetry spans of tool calls to this OTLP/HTTP collector URL, e.g. http://127.0.0.1:4318; agents that trace add theirs to the same traces (default: OTEL_EXPORTER_OTLP_ENDPOINT, else off)")
	fs.StringVar(&o.metricsListen, "metrics_listen", "", "serve Prometheus metrics at /metrics on this address, e.g. 127.0.0.1:9464 (no authentication: keep it on loopback or a network only Prometheus reaches)")
	authFlags(fs, o, getenv)
	fs.BoolVar(&o.version, "version", false, "print the version, commit, build date and Go version, then exit")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: all options are flags (see -h)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if o.configFile != "" {
		if err := configfile.Apply(fs, o.configFile, o.set, "new_api_token", "admin"); err != nil {
			return nil, err
		}
		fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	}
	o.values = configfile.Values(fs)
	switch {
	case o.devToken && !o.dev:
		return nil, errors.New("--dev_join_token is for --dev: a gateway in production makes join tokens with fleetctl token create")
	case o.adminToken && o.newAPIToken == "":
		return nil, errors.New("--admin goes with --new_api_token NAME: it makes an admin's token")
	}
	return o, nil
}

// authFlags are the flags of caller authentication, access rules and the
// audit trail.
func authFlags(fs *flag.FlagSet, o *options, getenv func(string) string) {
	fs.StringVar(&o.jwtIssuer, "jwt_issuer", getenv("JWT_ISSUER"), "accept bearer JWTs from this issuer URL (env JWT_ISSUER)")
	fs.StringVar(&o.jwtAudience, "jwt_audience", getenv("JWT_AUDIENCE"), "audience a JWT must be issued for; required with --jwt_issuer (env JWT_AUDIENCE)")
	fs.StringVar(&o.jwksURI, "jwks_uri", getenv("JWKS_URI"), "the issuer's JSON Web Key Set URL, when it has no discovery document (env JWKS_URI)")
	fs.StringVar(&o.jwtAlgs, "jwt_algs", strings.Join(access.DefaultAlgorithms(), ","), "accepted JWT signature algorithms, comma-separated (never none or HMAC)")
	fs.DurationVar(&o.jwtLeeway, "jwt_leeway", 30*time.Second, "clock skew allowed on a JWT's exp, nbf and iat")
	fs.StringVar(&o.groupsClaim, "groups_claim", "groups", "the JWT claim that lists a caller's groups, which calls carry to hosts signed (host policies' callers: groups)")
	fs.StringVar(&o.resourceURL, "resource_url", "", "the MCP endpoint's public URL (e.g. https://fleet.example.com/mcp) for the OAuth metadata; default: from each request's Host")
	fs.StringVar(&o.scopes, "scopes", "openid,profile,email", "scopes a client should request from the issuer (published as scopes_supported), comma-separated")
	fs.StringVar(&o.accessFile, "access", "", "access rules file (YAML or JSON): which caller may use which tools on which hosts")
	fs.StringVar(&o.apiTokensFile, "api_tokens", "", "static API tokens file (YAML or JSON; SHA-256 hashes with each token's own grants)")
	fs.StringVar(&o.rateLimit, "rate_limit", "", "tools/call limit per caller where its access rule or token sets no rate_limit: N/s, N/min or N/h (default: unlimited)")
	fs.StringVar(&o.newAPIToken, "new_api_token", "", "print a new API token for NAME and the line to add to the --api_tokens file, then exit")
	fs.BoolVar(&o.adminToken, "admin", false, "with --new_api_token: an admin's token (every tool, every host, the admin API fleetctl uses), and the fleetctl login command for it")
	fs.StringVar(&o.auditFile, "audit_file", "", "also append every audit record to this file as JSON lines")
	fs.DurationVar(&o.auditRetention, "audit_retention", 90*24*time.Hour, "how long the audit stream keeps records")
	fs.IntVar(&o.auditReplicas, "audit_replicas", 0, "replicas of the audit stream; 0: 3 on a NATS cluster, else 1")
}

func defaultDataDir(getenv func(string) string) string {
	if d := getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "fleetmcp")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "fleetmcp")
	}
	return "fleetmcp-data"
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	// SIGHUP reloads (see reloadOnHangup); it never ends the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if len(args) > 0 && args[0] == "nats-setup" {
		return runNATSSetup(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "nats-revoker" {
		return runNATSRevoker(ctx, args[1:], stderr)
	}
	if len(args) > 0 && args[0] == "signing-key" {
		return runSigningKey(args[1:], getenv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "replica-seed" {
		return runReplicaSeed(args[1:], getenv, stdout, stderr)
	}
	if len(args) == 1 && args[0] == "help" {
		// Asked for: the whole text on stdout, and no error.
		_, err := parseFlags([]string{"-h"}, getenv, stdout)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	if o.version {
		version.Print(stdout, "fleet-gateway")
		return nil
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log_level %q: want debug, info, warn or error", o.logLevel)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if o.newAPIToken != "" {
		return printAPIToken(stdout, o)
	}

	cfg, err := gatewayConfig(o, getenv, log)
	if err != nil {
		return err
	}
	if err := checkModes(cfg.Paths()); err != nil {
		return err
	}
	hostname, _ := os.Hostname()
	tp, err := tracing.Start(tracing.Config{Endpoint: o.otlpEndpoint, Service: "fleet-gateway", Version: gateway.Version, Host: hostname, Logger: log}, getenv)
	if err != nil {
		return err
	}
	defer flushSpans(tp, log)
	if tp != nil {
		log.Info("tracing: spans of tool calls go to the collector", "endpoint", tp.Endpoint())
	}
	cfg.TracerProvider = tp.TracerProvider()
	gw, err := gateway.Start(ctx, cfg)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	agentDone := make(chan struct{})
	var devToken string
	if o.dev {
		a, err := devAgent(ctx, gw, o, getenv, log, cfg.TracerProvider)
		if err != nil {
			_ = gw.Shutdown(context.Background())
			return err
		}
		g.Go(func() error {
			defer close(agentDone)
			return a.Run(gctx)
		})
		devToken = printDev(ctx, stdout, gw, o, getenv, log)
	} else {
		close(agentDone)
		printServing(stdout, gw, &cfg)
	}
	changes := configChanges(o, args, getenv)
	g.Go(func() error { reloadOnHangup(gctx, hup, gw, changes, log); return nil })
	g.Go(func() error {
		<-gctx.Done()
		// The in-process agent drains first, while NATS is still up, so
		// its last results and its goodbye reach the gateway.
		<-agentDone
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if devToken != "" {
			// The token printed is good only while this gateway runs.
			if err := gw.RevokeJoinToken(sctx, devToken, "dev"); err != nil {
				log.Debug("dev: the printed join token was not revoked", "token", devToken, "err", err)
			}
		}
		return gw.Shutdown(sctx)
	})
	return g.Wait()
}

// flushSpans sends the spans still queued, for a few seconds at most.
func flushSpans(tp *tracing.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("spans lost at exit", "err", err)
	}
}

// reloadOnHangup reloads the access rules, the API tokens and the audit
// file on each SIGHUP until ctx ends. The gateway logs what it refused.
func reloadOnHangup(ctx context.Context, hup <-chan os.Signal, gw *gateway.Gateway, changes func() ([]string, error), log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_ = gw.Reload()
			configfile.LogChanges(changes, log, ", not at a reload")
		}
	}
}

// configChanges returns how to find the settings of the --config file
// (read again with the same command line and environment) that differ
// from those the gateway runs with; nil without --config.
func configChanges(o *options, args []string, getenv func(string) string) func() ([]string, error) {
	if o.configFile == "" {
		return nil
	}
	return func() ([]string, error) {
		again, err := parseFlags(args, getenv, io.Discard)
		if err != nil {
			return nil, err
		}
		return configfile.Changed(o.values, again.values), nil
	}
}

// gatewayConfig turns the flags (and the environment) into the gateway's
// config.
func gatewayConfig(o *options, getenv func(string) string, log *slog.Logger) (gateway.Config, error) {
	cfg := gateway.Config{
		Listen: o.listen, DataDir: o.dataDir, NATSListen: o.natsListen, NATSTLS: o.natsTLS, NATSTLSCert: o.natsTLSCert, NATSTLSKey: o.natsTLSKey,
		NATSAdvertise: splitList(o.natsAdvertise), Advertise: splitList(o.advertise), AgentCredentialTTL: o.agentTTL,
		NATSMaxPayload: int32(o.maxPayload), AuthDisabled: o.dev || o.noAuth,
		SessionTimeout: o.sessionTTL, Logger: log, SystemPromptFile: o.promptFile,
		MaxRequestBytes: o.maxRequestMiB << 20, MaxTransferBytes: o.maxTransferMiB << 20, TransferWait: o.transferWait, CORSOrigins: splitList(o.corsOrigins),
		Metrics: o.metrics, MetricsListen: o.metricsListen, SigningKeyFile: o.signingKey,
		Audit:     audit.Config{File: o.auditFile, Retention: o.auditRetention, Replicas: o.auditReplicas},
		Hosts:     gateway.HostsConfig{Retention: o.hostsRetention, Replicas: o.hostsReplicas, MaxBytes: o.hostsMaxMiB << 20},
		APIListen: o.apiListen, APITLSCert: o.apiTLSCert, APITLSKey: o.apiTLSKey, TLSCert: o.tlsCert, TLSKey: o.tlsKey,
	}
	if o.maxRequestMiB < 1 || o.maxRequestMiB > 1024 {
		return cfg, fmt.Errorf("--max_request_mib %d: use 1 to 1024 (MiB)", o.maxRequestMiB)
	}
	cfg.Name = o.name
	if o.natsCluster != "" {
		cfg.Cluster = gateway.ClusterConfig{Name: o.natsCluster, Listen: o.natsClusterListen, Routes: splitList(o.natsRoutes),
			RouteCert: o.routeCert, RouteKey: o.routeKey, RouteCA: o.routeCA, Wait: o.clusterWait}
	} else if o.natsRoutes != "" || o.routeCert != "" || o.routeKey != "" || o.routeCA != "" {
		return cfg, errors.New("--nats_routes and the route certificates are for a cluster of embedded servers: give --nats_cluster NAME too")
	}
	if strings.EqualFold(strings.TrimSpace(o.apiListen), "off") {
		cfg.APIListen = ""
	}
	if o.hostsRetention == 0 {
		cfg.Hosts.Retention = -1 // never; zero would mean the default
	}
	if err := authConfig(&cfg, o, log); err != nil {
		return cfg, err
	}
	if o.natsURL != "" {
		if o.dev {
			return cfg, errors.New("--dev runs its own NATS server; drop --nats_url")
		}
		cfg.NATSURLs = splitList(o.natsURL)
	}
	cfg.NATSCredsFile, cfg.NATSSystemCredsFile, cfg.NATSCAFile = o.natsCreds, o.natsSysCreds, o.natsCA
	cfg.NATSAgentSigningKeyFile, cfg.NATSOperatorSigningKeyFile = o.natsAgentKey, o.natsOperatorKey
	return cfg, nil
}

// authConfig fills in caller authentication and access rules. With
// --dev or --no_auth, JWT settings that came from the environment (as
// other servers' users have them set) are ignored; given as flags they
// are a contradiction that Config validation names.
func authConfig(cfg *gateway.Config, o *options, log *slog.Logger) error {
	if cfg.AuthDisabled {
		for _, f := range []struct {
			flag, env string
			value     *string
		}{
			{"jwt_issuer", "JWT_ISSUER", &o.jwtIssuer}, {"jwt_audience", "JWT_AUDIENCE", &o.jwtAudience}, {"jwks_uri", "JWKS_URI", &o.jwksURI},
		} {
			if *f.value != "" && !o.set[f.flag] {
				log.Info("caller authentication is off; ignoring "+f.env+" from the environment", "value", *f.value)
				*f.value = ""
			}
		}
	}
	cfg.Auth = access.AuthConfig{
		Issuer: o.jwtIssuer, Audience: o.jwtAudience, JWKSURL: o.jwksURI,
		Algorithms: splitList(o.jwtAlgs), Leeway: o.jwtLeeway, GroupsClaim: o.groupsClaim, ResourceURL: o.resourceURL,
		Scopes: splitList(o.scopes),
	}
	var err error
	if cfg.RateLimit, err = access.ParseRateLimit(o.rateLimit); err != nil {
		return fmt.Errorf("--rate_limit: %w", err)
	}
	if o.apiTokensFile != "" {
		if cfg.Auth.APITokens, err = access.LoadAPITokens(o.apiTokensFile); err != nil {
			return err
		}
	}
	if o.accessFile != "" {
		if cfg.Access, err = access.LoadRules(o.accessFile); err != nil {
			return err
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// printAPIToken prints a new API token and its line for the tokens file.
func printAPIToken(w io.Writer, o *options) error {
	newToken := access.NewAPIToken
	if o.adminToken {
		newToken = access.NewAdminAPIToken
	}
	token, line, err := newToken(o.newAPIToken)
	if err != nil {
		return fmt.Errorf("--new_api_token: %w", err)
	}
	file := o.apiTokensFile
	if file == "" {
		file = "the --api_tokens file"
	}
	fmt.Fprintf(w, `API token for %s (shown only now; the gateway keeps only its hash):

  %s

Clients send it as the header "Authorization: Bearer <token>".
Add this entry under "tokens:" in %s, narrow or widen hosts and tools, and reload the gateway (kill -HUP its process) or restart it:

  %s
`, o.newAPIToken, token, file, line)
	if o.adminToken {
		fmt.Fprintf(w, `
Then, where fleetctl runs, save it in fleetctl's profile (paste the token when asked):

  %s
`, fleetctlLogin(o))
	}
	return nil
}

// fleetctlLogin is the fleetctl login command for this gateway's fleet
// API: its address from --api_listen (this machine's name when it
// listens on every address), its CA pin from the fleet CA in --data_dir
// (PIN before the gateway's first start made it).
func fleetctlLogin(o *options) string {
	host, port, err := net.SplitHostPort(o.apiListen)
	if err != nil {
		host, port = "GATEWAY", "8443"
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host, _ = os.Hostname()
	}
	if adv := splitList(o.advertise); len(adv) > 0 {
		host = adv[0]
	}
	pin := "PIN"
	if data, err := os.ReadFile(filepath.Join(o.dataDir, "tls", "ca.pem")); err == nil {
		if block, _ := pem.Decode(data); block != nil {
			if cert, err := x509.ParseCertificate(block.Bytes); err == nil {
				pin = protocol.CAPin(cert)
			}
		}
	}
	return fmt.Sprintf("fleetctl login --gateway https://%s --ca_pin %s --api_token_file -", net.JoinHostPort(host, port), pin)
}

// printServing tells how to reach a gateway that is not in --dev mode.
func printServing(w io.Writer, gw *gateway.Gateway, cfg *gateway.Config) {
	fmt.Fprintf(w, "fleetmcp gateway %s\n  MCP endpoint: %s\n", gateway.Version, gw.MCPURL())
	fmt.Fprintf(w, "  NATS:         %s (agents dial %s)\n", gw.NATSURL(), strings.Join(gw.AgentNATSURLs(), ","))
	if u := gw.APIURL(); u != "" {
		fmt.Fprintf(w, "  Fleet API:    %s (enrolment, admin; CA pin %s)\n", u, gw.APICAPin())
	}
	if pin := gw.NATSCAPin(); pin != "" {
		fmt.Fprintf(w, "  CA pin:       %s\n", pin)
	}
	switch {
	case cfg.AuthDisabled:
		fmt.Fprintln(w, "  Callers:      authentication OFF (loopback only)")
	default:
		if cfg.Auth.ResourceURL != "" {
			fmt.Fprintf(w, "  Public URL:   %s\n", cfg.Auth.ResourceURL)
		}
		if cfg.Auth.Issuer != "" {
			fmt.Fprintf(w, "  Callers:      bearer JWTs from %s for audience %s\n", cfg.Auth.Issuer, cfg.Auth.Audience)
		}
		if cfg.Auth.APITokens != nil {
			fmt.Fprintf(w, "  API tokens:   %s\n", cfg.Auth.APITokens.Source)
		}
		if cfg.Access != nil {
			fmt.Fprintf(w, "  Access rules: %s\n", cfg.Access.Source)
		}
	}
}

// checkModes refuses to start with a data directory others may write,
// or a key or credential others may read (cmd/internal/filemode).
func checkModes(p gateway.StatePaths) error {
	var rules []filemode.Rule
	for _, d := range p.Dirs {
		rules = append(rules, filemode.Rule{Path: d, Dir: true})
	}
	for _, f := range p.Own {
		rules = append(rules, filemode.Rule{Path: f, Deny: filemode.Private})
	}
	for _, f := range p.Provided {
		rules = append(rules, filemode.Rule{Path: f, Deny: filemode.NotWorld})
	}
	return filemode.Check(rules...)
}

// devAgent enrols this machine's agent with the gateway in process (its
// key is made once in its state directory under --data_dir) and returns
// it, ready to run.
func devAgent(ctx context.Context, gw *gateway.Gateway, o *options, getenv func(string) string, log *slog.Logger, tp trace.TracerProvider) (*agent.Agent, error) {
	stateDir := filepath.Join(o.dataDir, "agent")
	// Its identity is written under the state directory's lock, which
	// the agent then keeps.
	lock, err := statelock.Acquire(stateDir)
	if err != nil {
		return nil, fmt.Errorf("dev agent: %w", err)
	}
	id, err := enrolDevAgent(ctx, gw, stateDir, o.agentName)
	if err != nil {
		lock.Release()
		return nil, err
	}
	self, _ := os.Executable() // without it, git is refused under command rules
	cfg := devAgentConfig(o.dataDir, id)
	cfg.GitGuard, cfg.TaskWrapper, cfg.ConfineHelper = self, self, self
	cfg.Name, cfg.StateLock = o.agentName, lock
	// The agent's tools must not reach the gateway's state and secrets
	// (the NATS keys and the CA key among them).
	cfg.ProtectedPaths = gw.SecretPaths()
	cfg.Home, cfg.Logger, cfg.TracerProvider = getenv("HOME"), log.With("component", "agent"), tp
	return agent.New(cfg)
}

// devAgentConfig is the dev agent's configuration of identity id: its
// state, and the skills the fleet rolls out to it, in the data directory,
// never in the working directory's .agents/skills (often a checkout,
// whose skills stay the host's own).
func devAgentConfig(dataDir string, id *identity.Identity) agent.Config {
	stateDir := filepath.Join(dataDir, "agent")
	return agent.Config{
		Servers:     id.Enrolment.NATSURLs,
		Credentials: agent.Credentials{JWT: id.JWT, Seed: id.Seed, CA: []byte(id.Enrolment.NATSCA)},
		GatewayKeys: id.GatewayKeys().Keys, GatewayKeySerial: id.GatewayKeys().Serial, KeyStore: id,
		StateDir:       stateDir,
		FleetSkillsDir: filepath.Join(stateDir, "skills"),
	}
}

// enrolDevAgent enrols the agent of stateDir as host name, with a key
// made for that name: an agent renamed with --agent_name gets a new key.
func enrolDevAgent(ctx context.Context, gw *gateway.Gateway, stateDir, name string) (*identity.Identity, error) {
	store := identity.Open(stateDir)
	if e, err := store.LoadEnrolment(); err == nil && e.Host != name {
		if err := store.RemoveKey(); err != nil {
			return nil, fmt.Errorf("dev agent: %w", err)
		}
	}
	kp, err := store.LoadOrCreateKey()
	if err != nil {
		return nil, fmt.Errorf("dev agent: %w", err)
	}
	pub, _ := kp.PublicKey()
	kp.Wipe()
	hostname, _ := os.Hostname()
	creds, err := gw.EnrolLocal(ctx, name, pub, map[string]string{"dev": "true"},
		gateway.WithFacts(protocol.AgentFacts{OS: runtime.GOOS, Arch: runtime.GOARCH, Hostname: hostname}))
	if err != nil {
		return nil, fmt.Errorf("dev agent: %w", err)
	}
	urls := make([]string, 0, 1)
	if raw := gw.NATSURL(); raw != "" {
		urls = append(urls, loopbackURL(raw))
	}
	if len(urls) == 0 {
		return nil, errors.New("dev agent: the embedded NATS server listens nowhere; give --nats_listen")
	}
	if err := store.SaveJWT(creds.JWT); err != nil {
		return nil, fmt.Errorf("dev agent: %w", err)
	}
	if err := store.SaveEnrolment(&identity.Enrolment{Host: name, CAPin: creds.CAPin, NATSURLs: urls, NATSCA: string(creds.CAPEM),
		Labels: creds.Labels, SigningKeys: creds.SigningKeys, SigningKeySerial: creds.SigningKeySerial, EnrolledAt: time.Now().UTC(), Expires: creds.Expires}); err != nil {
		return nil, fmt.Errorf("dev agent: %w", err)
	}
	return identity.Load(stateDir)
}

// loopbackURL turns a URL of the embedded server into one this machine
// dials over loopback (the server's certificate names 127.0.0.1).
func loopbackURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
		u.Host = net.JoinHostPort("127.0.0.1", u.Port())
	}
	return u.String()
}

// printDev prints how to use the --dev gateway: the MCP endpoint, how to
// reach it with fleetctl (whose profile it saves for this user), and what
// another host needs to join; with --dev_join_token also a join token,
// whose id it returns.
func printDev(ctx context.Context, w io.Writer, gw *gateway.Gateway, o *options, getenv func(string) string, log *slog.Logger) string {
	urls := gw.AgentNATSURLs()
	reach := whoReaches(gw.NATSURL())
	fmt.Fprintf(w, `fleetmcp gateway %s — development mode (caller authentication OFF, loopback only)

  MCP endpoint:  %s
  This machine:  host %q (agent running in this process)
  Data:          %s

Connect an MCP client:
  claude mcp add --transport http fleet %s
  npx @modelcontextprotocol/inspector   (Streamable HTTP, URL above)
  (Cursor, VS Code: see "Connecting an MCP client" in the README)
`, gateway.Version, gw.MCPURL(), o.agentName, o.dataDir, gw.MCPURL())
	if api := gw.APIURL(); api != "" {
		fmt.Fprintf(w, "\nManage the fleet with fleetctl (%s), or in another shell:\n  export FLEET_GATEWAY=%s FLEET_CA_PIN=%s\n",
			saveDevProfile(gw, getenv, log), api, gw.APICAPin())
	}
	fmt.Fprintf(w, "\nJoin another agent (%s):\n  NATS URL:      %s\n", reach, strings.Join(urls, ","))
	if pin := gw.NATSCAPin(); pin != "" {
		fmt.Fprintf(w, "  CA pin:        %s\n", pin)
	} else {
		fmt.Fprintln(w, "  TLS:           off on loopback (--nats_tls turns it on; beyond loopback it is always on)")
	}
	const howto = "Each agent enrols with its own key and gets its own credential;\nfleetctl token create prints the command that joins a host.\n"
	if gw.APIURL() == "" {
		fmt.Fprint(w, "  Fleet API:     off (--api_listen); hosts cannot join over the network\n\n"+howto)
		return ""
	}
	hint := ""
	if ip := net.ParseIP(strings.Trim(hostOf(gw.APIURL()), "[]")); ip != nil && ip.IsLoopback() {
		hint = "; --api_listen 0.0.0.0:8443 lets other machines enrol"
	}
	fmt.Fprintf(w, "  Fleet API:     %s (CA pin %s%s)\n\n", gw.APIURL(), gw.APICAPin(), hint)
	if !o.devToken {
		fmt.Fprint(w, howto)
		return ""
	}
	tok, err := gw.CreateJoinToken(ctx, &protocol.TokenCreateRequest{TTL: "15m", Uses: 1, Labels: map[string]string{"dev": "true"}}, "dev")
	if err != nil {
		log.Warn("dev: no join token made", "err", err)
		fmt.Fprint(w, howto)
		return ""
	}
	fmt.Fprintf(w, "Join one more host with this token (one use, valid 15 minutes, revoked when this gateway stops):\n  token:   %s\n  command: %s\n\n%s",
		tok.Token, tok.JoinCommand, howto)
	return tok.Info.ID
}

// saveDevProfile saves fleetctl's profile for this gateway for the user
// running it (never over a profile of another gateway), and says where.
func saveDevProfile(gw *gateway.Gateway, getenv func(string) string, log *slog.Logger) string {
	path, err := profile.Path(getenv)
	if err != nil {
		log.Warn("dev: fleetctl's profile not saved", "err", err)
		return "its profile was not saved: " + err.Error()
	}
	old, err := profile.Load(path)
	switch {
	case err != nil:
		log.Warn("dev: fleetctl's profile not saved", "err", err)
		return "its profile was not saved: " + err.Error()
	case old != nil && !old.Dev:
		return "your profile " + path + " is another gateway's: give the settings below, or --gateway and --ca_pin"
	}
	if err := profile.Save(path, &profile.Profile{Gateway: gw.APIURL(), CAPin: gw.APICAPin(), Dev: true}); err != nil {
		log.Warn("dev: fleetctl's profile not saved", "err", err)
		return "its profile was not saved: " + err.Error()
	}
	return "its profile for this gateway is saved in " + path
}

// hostOf returns the host of a URL ("" if it does not parse).
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// whoReaches says who can reach the embedded server's client URL.
func whoReaches(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "from this machine"
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "from any machine that reaches this one"
	}
	if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
		return "from this machine; --nats_listen 0.0.0.0:4222 lets other machines join"
	}
	return "from machines that reach " + host
}
