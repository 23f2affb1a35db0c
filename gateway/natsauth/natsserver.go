package natsauth

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/gateway/internal/netutil"
)

// EmbeddedConfig configures the embedded NATS server.
type EmbeddedConfig struct {
	// DataDir holds the NATS keys (nats/) and the JetStream store
	// (jetstream/); the caller holds its lock.
	DataDir string
	// Listen is where agents reach the server (host:port, --nats_listen;
	// empty: in process only).
	Listen string
	// MaxPayload is the server's max_payload (0: nats-server's default).
	MaxPayload int32
	// MaxCall is how long agents may answer a call (the responses'
	// window of their permissions).
	MaxCall time.Duration
	// Cluster makes the server a node of a cluster (nil: none).
	Cluster *ClusterOptions
	Log     *slog.Logger
}

// Embedded is the embedded NATS server in operator mode, with the keys
// of the data directory, and its fleet account.
type Embedded struct {
	cfg  EmbeddedConfig
	keys *natsKeys
	acct *embeddedAccount
	srv  *server.Server
	// fatal holds the fatal errors the server's logger kept.
	fatal <-chan string
}

// OpenEmbedded reads (or on first start makes) the NATS keys in
// cfg.DataDir and builds the operator and account JWTs the server is to
// start with. A cluster node starts with the fleet account closed to
// agents until its gateway's first push (cluster.go).
func OpenEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	keys, err := loadOrCreateNATSKeys(cfg.DataDir, cfg.Log)
	if err != nil {
		return nil, err
	}
	acct, err := newEmbeddedAccount(cfg.DataDir, keys, cfg.MaxCall, cfg.Cluster != nil, cfg.Log)
	if err != nil {
		return nil, err
	}
	return &Embedded{cfg: cfg, keys: keys, acct: acct}, nil
}

// Start starts the server, with TLS on its client listener when tlsConf
// is set and routeTLS on its routes (a cluster node), and waits until it
// takes connections.
func (e *Embedded) Start(tlsConf, routeTLS *tls.Config) error {
	ns, fatal, err := startEmbedded(&e.cfg, e.acct, tlsConf, routeTLS)
	if err != nil {
		return err
	}
	e.srv, e.fatal = ns, fatal
	e.acct.setServer(ns)
	return nil
}

// InProcess returns the option that connects to the server in process.
func (e *Embedded) InProcess() nats.Option { return nats.InProcessServer(e.srv) }

// GatewayUser returns the option that connects as a user of the fleet
// account signed by the gateway signing key (anything but what
// runtimeDenied holds), made for this process only; the server never
// takes a revocation of it.
func (e *Embedded) GatewayUser() (nats.Option, error) {
	user, pub, err := scopedUser("fleet-gateway", e.keys.gatewaySigner, e.keys.accountPub)
	if err != nil {
		return nil, err
	}
	e.acct.keepOwn(pub)
	return user, nil
}

// SystemUser returns the option that connects as the gateway's user of
// the system account (the fleet account's claims and connections),
// made for this process only.
func (e *Embedded) SystemUser() (nats.Option, error) {
	user, pub, err := scopedUser("fleet-gateway system", e.keys.systemSigner, e.keys.systemPub)
	if err != nil {
		return nil, err
	}
	e.acct.keepOwn(pub)
	return user, nil
}

// Authority returns the authority of the embedded server's fleet
// account, which pushes its claims through sys (the system user's
// connection), and answers there the claims other nodes push.
// Credentials it issues are valid for ttl; log is the gateway's.
func (e *Embedded) Authority(sys *nats.Conn, ttl time.Duration, now func() time.Time, log *slog.Logger) (*Authority, error) {
	a := &Authority{log: log.With("component", "nats-auth"), accountPub: e.keys.accountPub, agentSigner: e.keys.agentSigner,
		enrolSigner: e.keys.enrolSigner, ttl: ttl, src: e.acct, now: now, sys: sys, reconcileCh: make(chan struct{}, 1), emb: e.acct}
	if _, err := e.acct.serveClaimUpdates(sys, a.LedgerRevokedAt); err != nil {
		return nil, fmt.Errorf("serve the fleet account's claim updates: %w", err)
	}
	return a, nil
}

// ClientURL returns the URL of the server's client listener.
func (e *Embedded) ClientURL() string { return e.srv.ClientURL() }

// Shutdown stops the server and waits until it has.
func (e *Embedded) Shutdown() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
}

// embeddedOptions builds the embedded server's options: operator mode
// with the accounts of auth, never an anonymous client; TLS with tlsConf
// when it is set. The server starts without listening (DontListen): the
// gateway, connected in process, gets its stores and revocations ready
// first, then lets agents in (ListenForAgents). A cluster node listens
// from the start, as its routes need (cluster.go), with routeTLS on them.
// embeddedPingInterval is how often the embedded server pings an idle
// client.
const embeddedPingInterval = 20 * time.Second

func embeddedOptions(cfg *EmbeddedConfig, auth *embeddedAccount, tlsConf, routeTLS *tls.Config) (*server.Options, error) {
	opts := &server.Options{
		ServerName: "fleet-gateway",
		NoSigs:     true,
		NoLog:      true,
		DontListen: true,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "jetstream"),
		MaxPayload: cfg.MaxPayload,
		// A fleet reconnecting at once queues for the server's lock while
		// each credential is checked; a client cut off after the default
		// 2 s would come back and queue again.
		AuthTimeout: authTimeout.Seconds(),
		// The server's first PING to a client comes 2 s after its
		// CONNECT began by default. A fleet reconnecting at once queues
		// for the server's lock longer than that, and a client that
		// gets the PING before the PONG of its handshake fails it: the
		// server's work is lost and the client comes back to queue
		// again. The first PING comes at the ping interval instead.
		DisableShortFirstPing: true,
		// A link that died without closing (a host that lost its
		// network) is closed after MaxPingsOut unanswered pings. At
		// nats-server's default (2 minutes) it stays six minutes, and
		// for that long a silent copy of a host's credential beside it
		// can pass for it (connwatch.go); at 20 s, about a minute, for
		// one ping a connection every 20 s.
		PingInterval: embeddedPingInterval,
		MaxPingsOut:  server.DEFAULT_PING_MAX_OUT,
	}
	auth.configure(opts)
	if cfg.Listen == "" {
		return opts, nil
	}
	host, port, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("--nats_listen %q: want host:port (%w)", cfg.Listen, err)
	}
	opts.Host = host
	if opts.Port, err = strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("--nats_listen %q: bad port", cfg.Listen)
	}
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	if tlsConf != nil {
		opts.TLSConfig = tlsConf
		opts.TLS = true
		opts.TLSTimeout = 5
	}
	if cfg.Cluster != nil {
		if err := clusterOptions(cfg.Cluster, opts, routeTLS); err != nil {
			return nil, err
		}
	}
	return opts, nil
}

// startEmbedded starts the embedded NATS server and waits until it takes
// connections. A listen address another process holds is reported as
// such, at once.
func startEmbedded(cfg *EmbeddedConfig, auth *embeddedAccount, tlsConf, routeTLS *tls.Config) (*server.Server, <-chan string, error) {
	opts, err := embeddedOptions(cfg, auth, tlsConf, routeTLS)
	if err != nil {
		return nil, nil, err
	}
	// The server would only log that it cannot listen, and never become
	// ready: try the addresses first.
	if cfg.Listen != "" && opts.Port != server.RANDOM_PORT {
		ln, err := netutil.Listen(net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), "the embedded NATS server", "another fleet-gateway or NATS server", "--nats_listen")
		if err != nil {
			return nil, nil, err
		}
		ln.Close()
	}
	if cfg.Cluster != nil && opts.Cluster.Port != server.RANDOM_PORT {
		ln, err := netutil.Listen(net.JoinHostPort(opts.Cluster.Host, strconv.Itoa(opts.Cluster.Port)), "the embedded NATS server's routes", "another fleet-gateway or NATS server", "--nats_cluster_listen")
		if err != nil {
			return nil, nil, err
		}
		ln.Close()
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded NATS: %w", err)
	}
	failed := &fatalLogger{msgs: make(chan string, 1)}
	ns.SetLogger(failed, false, false)
	ns.Start()
	if err := awaitReady(ns, failed.msgs, readyTimeout); err != nil {
		ns.Shutdown()
		return nil, nil, fmt.Errorf("embedded NATS server (listen %s): %w", cfg.Listen, err)
	}
	return ns, failed.msgs, nil
}

// ListenForAgents opens the embedded server's client listener (a
// cluster node's listens from the start). Until then only in-process
// clients (the gateway) reach it: a fleet that reconnects at once after
// a restart finds the gateway ready, with the revocations in place.
func (e *Embedded) ListenForAgents() error {
	if e.cfg.Listen == "" || e.cfg.Cluster != nil {
		return nil
	}
	listen := e.cfg.Listen
	ready := make(chan struct{})
	go e.srv.AcceptLoop(ready)
	<-ready
	if e.srv.Addr() == nil {
		msg := "it did not listen"
		select {
		case msg = <-e.fatal:
		default:
		}
		return fmt.Errorf("embedded NATS server cannot listen on %s: %s; if another process holds the address, choose another with --nats_listen", listen, msg)
	}
	return nil
}

// authTimeout is how long the embedded server waits for a client's
// credential: as long as agents wait for their handshake
// (agent.HandshakeTimeout).
const authTimeout = 20 * time.Second

// readyTimeout bounds how long the embedded server may take to start.
const readyTimeout = 10 * time.Second

// awaitReady waits until ns takes connections, it reports a fatal error
// (as when it cannot listen) or timeout passes.
func awaitReady(ns *server.Server, fatal <-chan string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if ns.ReadyForConnections(50 * time.Millisecond) {
			return nil
		}
		select {
		case msg := <-fatal:
			return fmt.Errorf("it could not start: %s; if another process holds the address, choose another with --nats_listen", msg)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("it did not become ready within %s", timeout)
		}
	}
}

// fatalLogger is the embedded server's logger: it keeps the first fatal
// error, which the server otherwise only logs, and drops the rest as the
// server's own logging is off.
type fatalLogger struct{ msgs chan string }

func (l *fatalLogger) Fatalf(format string, v ...any) {
	select {
	case l.msgs <- fmt.Sprintf(format, v...):
	default:
	}
}

func (*fatalLogger) Noticef(string, ...any) {}
func (*fatalLogger) Warnf(string, ...any)   {}
func (*fatalLogger) Errorf(string, ...any)  {}
func (*fatalLogger) Debugf(string, ...any)  {}
func (*fatalLogger) Tracef(string, ...any)  {}
