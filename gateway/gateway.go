package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Gateway is a running control plane: the MCP endpoint, the host registry,
// the router and, unless an external cluster is used, the NATS server.
type Gateway struct {
	cfg Config
	log *slog.Logger

	ns    *server.Server // nil with an external cluster
	creds Credentials
	// dataLock holds DataDir for this gateway while the embedded server
	// uses it (nil with an external cluster).
	dataLock *os.File
	nc       *nats.Conn
	reg      *registry
	store    *hostStore
	router   *router
	auth     *authenticator // nil with authentication off
	audit    *auditor

	requests requestContexts
	// calls counts tool calls in progress, so that Shutdown can wait for
	// their audit records (session calls outlive their HTTP requests).
	calls        sync.WaitGroup
	shutdownOnce sync.Once
	shutdownErr  error
	// rates holds the per-caller rate-limit buckets.
	rates rateLimiters
	// agentLogs limits the lines logged about what agents send wrong.
	agentLogs *logLimiter
	// transfers bounds the memory of large requests and results.
	transfers *transfers

	ln   net.Listener
	http *http.Server
	done chan error
}

// Start validates cfg, starts (or connects to) NATS, listens on cfg.Listen
// and serves MCP until Shutdown.
func Start(cfg Config) (*Gateway, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, done: make(chan error, 1), agentLogs: newLogLimiter(logEvery, 1),
		transfers: newTransfers(cfg.MaxTransferBytes, cfg.TransferWait)}
	if !cfg.AuthDisabled {
		a, err := newAuthenticator(cfg.Auth, g.log.With("component", "auth"))
		if err != nil {
			return nil, fmt.Errorf("caller authentication: %w", err)
		}
		g.auth = a
	}
	// The MCP address is taken first: a busy one fails at once, before
	// NATS and JetStream start.
	ln, err := listen(cfg.Listen, "the MCP endpoint", "another fleet-gateway or web server", "--listen")
	if err != nil {
		return nil, err
	}
	if err := g.startNATS(); err != nil {
		ln.Close()
		g.stopNATS()
		return nil, err
	}
	a, err := newAuditor(g.nc, cfg.Audit, cfg.MaxCallDuration, g.log.With("component", "audit"))
	if err != nil {
		ln.Close()
		g.stopNATS()
		return nil, err
	}
	g.audit = a
	if g.store, err = openHostStore(g.nc, g.reg, cfg.Hosts, g.log.With("component", "hosts")); err != nil {
		ln.Close()
		_ = g.audit.close(context.Background())
		g.stopNATS()
		return nil, err
	}
	g.ln = ln
	g.http = &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { g.done <- g.http.Serve(ln) }()
	g.logAccess()
	g.log.Info("gateway ready", "mcp", g.MCPURL(), "nats", g.NATSURL(), "auth", !cfg.AuthDisabled)
	return g, nil
}

func (g *Gateway) startNATS() error {
	opts := []nats.Option{
		nats.Name("fleet-gateway"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.PingInterval(10 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			g.log.Info("NATS reconnected", "url", nc.ConnectedUrlRedacted())
			_ = nc.Publish(protocol.DiscoverSubject(), nil)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				g.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			g.log.Warn("NATS error", "err", err)
		}),
	}
	var url string
	if len(g.cfg.NATSURLs) > 0 {
		url = strings.Join(g.cfg.NATSURLs, ",")
		if g.cfg.NATSUser != "" {
			opts = append(opts, nats.UserInfo(g.cfg.NATSUser, g.cfg.NATSPassword))
		}
	} else {
		// Nothing in the data directory is touched before it is ours.
		var err error
		if g.dataLock, err = lockDataDir(g.cfg.DataDir); err != nil {
			return err
		}
		creds, err := CreateCredentials(g.cfg.DataDir)
		if err != nil {
			return err
		}
		g.creds = creds
		if g.ns, err = startEmbedded(&g.cfg, creds); err != nil {
			return err
		}
		opts = append(opts, nats.InProcessServer(g.ns), nats.UserInfo(gatewayUser, creds.GatewayPassword))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", url, err)
	}
	g.nc = nc
	g.reg = newRegistry(g.log, g.cfg.OfflineAfter)
	g.reg.maxBytes = g.cfg.Hosts.MaxBytes
	if _, err := nc.Subscribe(protocol.PresenceWildcard(), g.reg.onPresence); err != nil {
		return fmt.Errorf("subscribe presence: %w", err)
	}
	if g.router, err = newRouter(nc, g.reg, g.log, g.cfg.Silence, g.transfers); err != nil {
		return err
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("NATS: %w", err)
	}
	// Ask every agent to announce itself now rather than at its next
	// heartbeat.
	return nc.Publish(protocol.DiscoverSubject(), nil)
}

func (g *Gateway) stopNATS() {
	if g.store != nil {
		g.store.close()
	}
	if g.router != nil {
		g.router.close()
	}
	if g.nc != nil {
		g.nc.Close()
	}
	if g.ns != nil {
		g.ns.Shutdown()
		g.ns.WaitForShutdown()
	}
	if g.dataLock != nil {
		g.dataLock.Close()
	}
}

// SecretPaths are the files and directories that hold the gateway's
// secrets and state: its data directory (JetStream, the embedded
// server's credentials) and the credentials file itself, which no agent
// running in the gateway's process may let its tools reach. Empty with
// an external cluster.
func (g *Gateway) SecretPaths() []string {
	if g.ns == nil {
		return nil
	}
	dir, err := filepath.Abs(g.cfg.DataDir)
	if err != nil {
		dir = g.cfg.DataDir
	}
	return []string{dir, filepath.Join(dir, credentialsFile)}
}

// logAccess summarises who may do what, once at startup.
func (g *Gateway) logAccess() {
	if g.auth == nil {
		g.log.Warn("caller authentication is OFF: the local caller may use every tool on every host")
		return
	}
	a := g.cfg.Auth
	if a.Issuer != "" {
		g.log.Info("JWT callers", "issuer", a.Issuer, "audience", a.Audience, "algorithms", strings.Join(a.Algorithms, ","), "leeway", a.Leeway)
	}
	if a.APITokens != nil {
		for _, line := range a.APITokens.Summary() {
			g.log.Info("API token", "grant", line)
		}
	}
	if g.cfg.Access != nil {
		g.log.Info("access rules", "file", g.cfg.Access.Source, "rules", len(g.cfg.Access.rules))
		for _, line := range g.cfg.Access.Summary() {
			g.log.Info("access rule", "rule", line)
		}
	}
}

// Handler returns the gateway's HTTP handler: the MCP endpoint at /mcp, a
// health check at /healthz and, with authentication on, the
// protected-resource metadata under /.well-known/oauth-protected-resource.
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	var mcpHandler http.Handler = g.mcpHandler(g.newMCPServer())
	if g.auth != nil {
		mcpHandler = g.auth.protect(mcpHandler)
		mux.Handle(wellKnownResource, g.auth.metadata())
		mux.Handle(wellKnownResource+"/mcp", g.auth.metadata())
	}
	mux.Handle("/mcp", mcpHandler)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !g.nc.IsConnected() {
			http.Error(w, "NATS not connected", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// Addr returns the address the MCP endpoint listens on.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// MCPURL returns the URL an MCP client connects to.
func (g *Gateway) MCPURL() string { return "http://" + g.Addr() + "/mcp" }

// NATSURL returns the URL agents dial: the embedded server's client
// address, or the external cluster's URLs.
func (g *Gateway) NATSURL() string {
	if g.ns == nil {
		return strings.Join(g.cfg.NATSURLs, ",")
	}
	if g.cfg.NATSListen == "" {
		return ""
	}
	return g.ns.ClientURL()
}

// AgentCredentials returns the NATS user and password with which the agent
// of host joins the embedded server (empty with an external cluster, which
// has its own users).
func (g *Gateway) AgentCredentials(host string) (user, password string) {
	if g.ns == nil {
		return "", ""
	}
	return host, g.creds.AgentPassword(host)
}

// Shutdown stops accepting requests, waits for in-flight ones until ctx
// ends, then closes NATS. Later calls return the first call's result.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.shutdownOnce.Do(func() { g.shutdownErr = g.shutdown(ctx) })
	return g.shutdownErr
}

func (g *Gateway) shutdown(ctx context.Context) error {
	err := g.http.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = g.http.Close()
	}
	if serr := <-g.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	drained := make(chan struct{})
	go func() { g.calls.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-ctx.Done():
		g.log.Warn("shutting down with tool calls still running; their audit records may be lost")
	}
	// Queued audit records are stored while NATS is still up.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	aerr := g.audit.close(actx)
	g.stopNATS()
	return errors.Join(err, aerr)
}

// TransferBytesInUse returns how much of the budget for large transfers
// (Config.MaxTransferBytes) requests and results in flight hold now.
func (g *Gateway) TransferBytesInUse() int64 { return g.transfers.inUse.Load() }

// Host returns what the gateway knows about host.
func (g *Gateway) Host(host string) (HostInfo, bool) { return g.reg.get(host) }
