package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// embeddedOptions builds the embedded server's options: operator mode
// with the accounts of auth, never an anonymous client; TLS with tlsConf
// when it is set. The server starts without listening (DontListen): the
// gateway, connected in process, gets its stores and revocations ready
// first, then lets agents in (listenForAgents). A cluster node listens
// from the start, as its routes need (cluster.go), with routeTLS on them.
// embeddedPingInterval is how often the embedded server pings an idle
// client.
const embeddedPingInterval = 20 * time.Second

func embeddedOptions(cfg *Config, auth *embeddedAccount, tlsConf, routeTLS *tls.Config) (*server.Options, error) {
	opts := &server.Options{
		ServerName: "fleet-gateway",
		NoSigs:     true,
		NoLog:      true,
		DontListen: true,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "jetstream"),
		MaxPayload: cfg.NATSMaxPayload,
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
	if cfg.NATSListen == "" {
		return opts, nil
	}
	host, port, err := net.SplitHostPort(cfg.NATSListen)
	if err != nil {
		return nil, fmt.Errorf("--nats_listen %q: want host:port (%w)", cfg.NATSListen, err)
	}
	opts.Host = host
	if opts.Port, err = strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("--nats_listen %q: bad port", cfg.NATSListen)
	}
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	if tlsConf != nil {
		opts.TLSConfig = tlsConf
		opts.TLS = true
		opts.TLSTimeout = 5
	}
	if cfg.clustered() {
		if err := clusterOptions(cfg, opts, routeTLS); err != nil {
			return nil, err
		}
	}
	return opts, nil
}

// startEmbedded starts the embedded NATS server and waits until it takes
// connections. A listen address another process holds is reported as
// such, at once.
func startEmbedded(cfg *Config, auth *embeddedAccount, tlsConf, routeTLS *tls.Config) (*embeddedServer, error) {
	opts, err := embeddedOptions(cfg, auth, tlsConf, routeTLS)
	if err != nil {
		return nil, err
	}
	// The server would only log that it cannot listen, and never become
	// ready: try the addresses first.
	if cfg.NATSListen != "" && opts.Port != server.RANDOM_PORT {
		ln, err := listen(net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), "the embedded NATS server", "another fleet-gateway or NATS server", "--nats_listen")
		if err != nil {
			return nil, err
		}
		ln.Close()
	}
	if cfg.clustered() && opts.Cluster.Port != server.RANDOM_PORT {
		ln, err := listen(net.JoinHostPort(opts.Cluster.Host, strconv.Itoa(opts.Cluster.Port)), "the embedded NATS server's routes", "another fleet-gateway or NATS server", "--nats_cluster_listen")
		if err != nil {
			return nil, err
		}
		ln.Close()
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	failed := &fatalLogger{msgs: make(chan string, 1)}
	ns.SetLogger(failed, false, false)
	ns.Start()
	if err := awaitReady(ns, failed.msgs, readyTimeout); err != nil {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS server (listen %s): %w", cfg.NATSListen, err)
	}
	return &embeddedServer{Server: ns, fatal: failed.msgs}, nil
}

// embeddedServer is the embedded NATS server, with the fatal errors its
// logger kept.
type embeddedServer struct {
	*server.Server
	fatal <-chan string
}

// listenForAgents opens the embedded server's client listener. Until
// then only in-process clients (the gateway) reach it: a fleet that
// reconnects at once after a restart finds the gateway ready, with the
// revocations in place.
func (ns *embeddedServer) listenForAgents(listen string) error {
	ready := make(chan struct{})
	go ns.AcceptLoop(ready)
	<-ready
	if ns.Addr() == nil {
		msg := "it did not listen"
		select {
		case msg = <-ns.fatal:
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

// listen listens on addr (host:port) for what, and says plainly when
// another process (likely one of who) holds the address and which flag
// chooses another.
func listen(addr, what, who, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case err == nil:
		return ln, nil
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("address %s for %s is already in use (%s?); stop that process or choose another address with %s: %w",
			addr, what, who, flag, err)
	default:
		return nil, fmt.Errorf("%s cannot listen on %s: %w; choose another address with %s", what, addr, err, flag)
	}
}
