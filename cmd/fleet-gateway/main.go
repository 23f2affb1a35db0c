// Command fleet-gateway runs the fleetmcp control plane: the MCP endpoint AI
// clients connect to, and (unless --nats_url names an external cluster) an
// embedded NATS server that agents join. With --dev it also runs an agent
// for this machine, so one command gives a working fleet of one.
package main

import (
	"context"
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
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

func main() {
	// The in-process agent of --dev runs git through this executable.
	if code, ok := agent.RunGitGuard(os.Args); ok {
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
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "fleet-gateway:", err)
		}
		os.Exit(2)
	}
}

type options struct {
	dev        bool
	noAuth     bool
	listen     string
	dataDir    string
	natsListen string
	natsURL    string
	natsUser   string
	maxPayload int
	sessionTTL time.Duration
	agentName  string
	agentCred  string
	createCred bool
	logLevel   string
	promptFile string

	jwtIssuer, jwtAudience, jwksURI string
	jwtAlgs, scopes                 string
	jwtLeeway                       time.Duration
	resourceURL                     string
	accessFile, apiTokensFile       string
	rateLimit                       string
	newAPIToken                     string
	auditFile                       string
	auditRetention                  time.Duration
	auditReplicas                   int
	hostsRetention                  time.Duration
	hostsReplicas                   int
	hostsMaxMiB                     int64
	maxTransferMiB                  int64
	transferWait                    time.Duration
	// set holds the flags given on the command line (not defaulted from
	// the environment).
	set map[string]bool
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("fleet-gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	hostname, _ := os.Hostname()
	o := &options{}
	fs.BoolVar(&o.dev, "dev", false, "development mode: caller auth off, loopback only, plus an agent for this machine")
	fs.BoolVar(&o.noAuth, "no_auth", false, "turn caller authentication off (only allowed on a loopback --listen)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address of the MCP endpoint")
	fs.StringVar(&o.dataDir, "data_dir", defaultDataDir(getenv), "state directory for the embedded NATS server")
	fs.StringVar(&o.natsListen, "nats_listen", "127.0.0.1:4222", "where the embedded NATS server listens for agents")
	fs.StringVar(&o.natsURL, "nats_url", getenv("FLEET_NATS_URL"), "external NATS cluster URL(s), comma-separated; disables the embedded server (env FLEET_NATS_URL)")
	fs.StringVar(&o.natsUser, "nats_user", "", "user for the external cluster (password: env FLEET_NATS_PASSWORD)")
	fs.IntVar(&o.maxPayload, "nats_max_payload", 0, "embedded server's max message size in bytes (default 1 MiB)")
	fs.DurationVar(&o.sessionTTL, "session_timeout", 30*time.Minute, "close MCP sessions idle this long")
	fs.StringVar(&o.agentName, "agent_name", protocol.HostFromName(hostname), "with --dev: the name of this machine's agent")
	fs.StringVar(&o.agentCred, "agent_credential", "", "print the NATS credential with which host NAME joins the embedded server of the gateway on --data_dir, then exit")
	fs.BoolVar(&o.createCred, "create_credentials", false, "with --agent_credential: create the embedded server's credentials in --data_dir if it has none (a new fleet whose gateway has not started yet)")
	fs.StringVar(&o.logLevel, "log_level", "info", "debug, info, warn or error")
	fs.StringVar(&o.promptFile, "system_prompt", "", "text/template FILE for the resource://system-prompt resource, read on every read (default: the bundled template)")
	fs.DurationVar(&o.hostsRetention, "hosts_retention", 30*24*time.Hour, "forget hosts offline this long (0: never)")
	fs.IntVar(&o.hostsReplicas, "hosts_replicas", 1, "replicas of the hosts bucket on an external NATS cluster (3 on a 3-node cluster)")
	fs.Int64Var(&o.hostsMaxMiB, "hosts_max_mib", gateway.DefaultHostsMaxBytes>>20, "memory the host registry may take, in MiB; announces beyond it are ignored")
	fs.Int64Var(&o.maxTransferMiB, "max_transfer_mib", gateway.DefaultMaxTransferBytes>>20, "MiB of large requests and results (over 1 MiB) in flight at once; more wait, then are refused as busy")
	fs.DurationVar(&o.transferWait, "transfer_wait", 10*time.Second, "how long a large request or result may wait for room in --max_transfer_mib")
	authFlags(fs, o, getenv)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: all options are flags (see -h)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	return o, nil
}

// authFlags are the flags of caller authentication, access rules and the
// audit trail.
func authFlags(fs *flag.FlagSet, o *options, getenv func(string) string) {
	fs.StringVar(&o.jwtIssuer, "jwt_issuer", getenv("JWT_ISSUER"), "accept bearer JWTs from this issuer URL (env JWT_ISSUER)")
	fs.StringVar(&o.jwtAudience, "jwt_audience", getenv("JWT_AUDIENCE"), "audience a JWT must be issued for; required with --jwt_issuer (env JWT_AUDIENCE)")
	fs.StringVar(&o.jwksURI, "jwks_uri", getenv("JWKS_URI"), "the issuer's JSON Web Key Set URL, when it has no discovery document (env JWKS_URI)")
	fs.StringVar(&o.jwtAlgs, "jwt_algs", strings.Join(gateway.DefaultAlgorithms(), ","), "accepted JWT signature algorithms, comma-separated (never none or HMAC)")
	fs.DurationVar(&o.jwtLeeway, "jwt_leeway", 30*time.Second, "clock skew allowed on a JWT's exp, nbf and iat")
	fs.StringVar(&o.resourceURL, "resource_url", "", "the MCP endpoint's public URL (e.g. https://fleet.example.com/mcp) for the OAuth metadata; default: from each request's Host")
	fs.StringVar(&o.scopes, "scopes", "openid,profile,email", "scopes a client should request from the issuer (published as scopes_supported), comma-separated")
	fs.StringVar(&o.accessFile, "access", "", "access rules file (YAML or JSON): which caller may use which tools on which hosts")
	fs.StringVar(&o.apiTokensFile, "api_tokens", "", "static API tokens file (YAML or JSON; SHA-256 hashes with each token's own grants)")
	fs.StringVar(&o.rateLimit, "rate_limit", "", "tools/call limit per caller where its access rule or token sets no rate_limit: N/s, N/min or N/h (default: unlimited)")
	fs.StringVar(&o.newAPIToken, "new_api_token", "", "print a new API token for NAME and the line to add to the --api_tokens file, then exit")
	fs.StringVar(&o.auditFile, "audit_file", "", "also append every audit record to this file as JSON lines")
	fs.DurationVar(&o.auditRetention, "audit_retention", 90*24*time.Hour, "how long the audit stream keeps records")
	fs.IntVar(&o.auditReplicas, "audit_replicas", 1, "replicas of the audit stream on an external NATS cluster (3 on a 3-node cluster)")
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
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log_level %q: want debug, info, warn or error", o.logLevel)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if o.createCred && o.agentCred == "" {
		return errors.New("--create_credentials goes with --agent_credential NAME (a gateway creates its credentials itself when it first starts)")
	}
	if o.agentCred != "" {
		return printCredential(stdout, o)
	}
	if o.newAPIToken != "" {
		return printAPIToken(stdout, o)
	}

	cfg, err := gatewayConfig(o, getenv, log)
	if err != nil {
		return err
	}
	gw, err := gateway.Start(cfg)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	agentDone := make(chan struct{})
	if o.dev {
		a, err := devAgent(gw, o, getenv, log)
		if err != nil {
			_ = gw.Shutdown(context.Background())
			return err
		}
		g.Go(func() error {
			defer close(agentDone)
			return a.Run(gctx)
		})
		printDev(stdout, gw, o)
	} else {
		close(agentDone)
		printServing(stdout, gw, &cfg)
	}
	g.Go(func() error {
		<-gctx.Done()
		// The in-process agent drains first, while NATS is still up, so
		// its last results and its goodbye reach the gateway.
		<-agentDone
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return gw.Shutdown(sctx)
	})
	return g.Wait()
}

// gatewayConfig turns the flags (and the environment) into the gateway's
// config.
func gatewayConfig(o *options, getenv func(string) string, log *slog.Logger) (gateway.Config, error) {
	cfg := gateway.Config{
		Listen: o.listen, DataDir: o.dataDir, NATSListen: o.natsListen,
		NATSMaxPayload: int32(o.maxPayload), AuthDisabled: o.dev || o.noAuth,
		SessionTimeout: o.sessionTTL, Logger: log, SystemPromptFile: o.promptFile,
		MaxTransferBytes: o.maxTransferMiB << 20, TransferWait: o.transferWait,
		Audit: gateway.AuditConfig{File: o.auditFile, Retention: o.auditRetention, Replicas: o.auditReplicas},
		Hosts: gateway.HostsConfig{Retention: o.hostsRetention, Replicas: o.hostsReplicas, MaxBytes: o.hostsMaxMiB << 20},
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
		cfg.NATSUser, cfg.NATSPassword = o.natsUser, getenv("FLEET_NATS_PASSWORD")
		if cfg.NATSUser != "" && cfg.NATSPassword == "" {
			return cfg, errors.New("--nats_user is set but FLEET_NATS_PASSWORD is empty: set the external cluster's password for that user")
		}
	}
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
	cfg.Auth = gateway.AuthConfig{
		Issuer: o.jwtIssuer, Audience: o.jwtAudience, JWKSURL: o.jwksURI,
		Algorithms: splitList(o.jwtAlgs), Leeway: o.jwtLeeway, ResourceURL: o.resourceURL,
		Scopes: splitList(o.scopes),
	}
	var err error
	if cfg.RateLimit, err = gateway.ParseRateLimit(o.rateLimit); err != nil {
		return fmt.Errorf("--rate_limit: %w", err)
	}
	if o.apiTokensFile != "" {
		if cfg.Auth.APITokens, err = gateway.LoadAPITokens(o.apiTokensFile); err != nil {
			return err
		}
	}
	if o.accessFile != "" {
		if cfg.Access, err = gateway.LoadAccess(o.accessFile); err != nil {
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
	token, line, err := gateway.NewAPIToken(o.newAPIToken)
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
Add this entry under "tokens:" in %s, narrow or widen hosts and tools, and restart the gateway:

  %s
`, o.newAPIToken, token, file, line)
	return nil
}

// printServing tells how to reach a gateway that is not in --dev mode.
func printServing(w io.Writer, gw *gateway.Gateway, cfg *gateway.Config) {
	fmt.Fprintf(w, "fleetmcp gateway %s\n  MCP endpoint: %s\n", gateway.Version, gw.MCPURL())
	if len(cfg.NATSURLs) == 0 {
		fmt.Fprintf(w, "  NATS:         %s (agents join with the credential --data_dir %s --agent_credential NAME prints)\n", gw.NATSURL(), cfg.DataDir)
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

// printCredential prints how host o.agentCred joins the embedded server.
// The credential derives from the key in --data_dir: a directory without
// one is refused (unless --create_credentials), since a key made up here
// would give a password the running gateway rejects.
func printCredential(w io.Writer, o *options) error {
	if err := protocol.ValidateHost(o.agentCred); err != nil {
		return fmt.Errorf("--agent_credential: %w", err)
	}
	load := gateway.LoadCredentials
	if o.createCred {
		load = gateway.CreateCredentials
	}
	creds, err := load(o.dataDir)
	if errors.Is(err, gateway.ErrNoCredentials) {
		return fmt.Errorf("--agent_credential: %w. A host's credential derives from the key of the gateway that runs on a data directory: "+
			"give that gateway's --data_dir (it names it at start), or add --create_credentials to create the credentials of a new fleet whose gateway has not started yet",
			err)
	}
	if err != nil {
		return fmt.Errorf("--agent_credential: %w", err)
	}
	fmt.Fprintf(w, "FLEET_NATS_PASSWORD=%s fleet-agent --nats NATS_URL --nats_user %s --name %s\n",
		creds.AgentPassword(o.agentCred), o.agentCred, o.agentCred)
	return nil
}

func devAgent(gw *gateway.Gateway, o *options, getenv func(string) string, log *slog.Logger) (*agent.Agent, error) {
	user, pass := gw.AgentCredentials(o.agentName)
	self, _ := os.Executable() // without it, git is refused under command rules
	return agent.New(agent.Config{
		GitGuard: self, TaskWrapper: self,
		Servers:  []string{gw.NATSURL()},
		Name:     o.agentName,
		User:     user,
		Password: pass,
		StateDir: filepath.Join(o.dataDir, "agent"),
		// The agent's tools must not reach the gateway's state and
		// secrets (the master key of every agent's credential).
		ProtectedPaths: gw.SecretPaths(),
		Home:           getenv("HOME"),
		Labels:         map[string]string{"dev": "true"},
		Logger:         log.With("component", "agent"),
	})
}

func printDev(w io.Writer, gw *gateway.Gateway, o *options) {
	other := otherName(o.agentName)
	user, pass := gw.AgentCredentials(other)
	natsURL, reach := joinURL(gw.NATSURL())
	fmt.Fprintf(w, `fleetmcp gateway %s — development mode (caller authentication OFF, loopback only)

  MCP endpoint:  %s
  This machine:  host %q (agent running in this process)
  Data:          %s

Connect an MCP client:
  claude mcp add --transport http fleet %s
  npx @modelcontextprotocol/inspector   (Streamable HTTP, URL above)

Join another agent as host %q (%s):
  FLEET_NATS_PASSWORD=%s go run ./cmd/fleet-agent --nats %s --nats_user %s --name %s
Each host has its own credential; for another name:
  go run ./cmd/fleet-gateway --data_dir %s --agent_credential NAME

`, gateway.Version, gw.MCPURL(), o.agentName, o.dataDir, gw.MCPURL(), other, reach, pass, natsURL, user, other, o.dataDir)
}

// otherName suggests a host name for a second agent.
func otherName(name string) string {
	if len(name) > protocol.MaxHostLen-2 {
		name = name[:protocol.MaxHostLen-2]
	}
	return name + "-2"
}

// joinURL turns the embedded server's client URL into one an agent can
// dial, and says who can reach it.
func joinURL(raw string) (string, string) {
	u, err := url.Parse(raw)
	if err != nil {
		return raw, "from this machine"
	}
	host := u.Hostname()
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil {
			u.Host = net.JoinHostPort(name, u.Port())
		}
		return u.String(), "from any machine that reaches this one"
	}
	if ip := net.ParseIP(host); (ip != nil && ip.IsLoopback()) || host == "localhost" {
		return u.String(), "from this machine; --nats_listen 0.0.0.0:4222 lets other machines join"
	}
	return u.String(), "from machines that reach " + host
}
