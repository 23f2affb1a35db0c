package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// gatewayUser is the gateway's own NATS user on the embedded server. Agents
// log in with their host name as user name.
const gatewayUser = "_gateway"

// Credentials are the secrets of the embedded NATS server. They are
// generated on first start and kept in DataDir/credentials.json (0600), so
// agents that joined keep working across gateway restarts.
type Credentials struct {
	GatewayPassword string `json:"gateway_password"`
	// AgentKey derives each agent's password from its host name (see
	// AgentPassword); it is never given to an agent.
	AgentKey string `json:"agent_key"`
}

// AgentPassword is the NATS password of host on the embedded server: an
// HMAC of the host name under the agent key, so each agent has its own
// credential and the gateway stores none of them.
func (c Credentials) AgentPassword(host string) string {
	m := hmac.New(sha256.New, []byte(c.AgentKey))
	m.Write([]byte("fleetmcp agent password\x00" + host))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// credentialsFile is where the embedded server's credentials are kept in
// the data directory.
const credentialsFile = "credentials.json"

// ErrNoCredentials reports a data directory that holds no credentials:
// no gateway has started on it (or it is the wrong directory).
var ErrNoCredentials = errors.New("no credentials")

// LoadCredentials reads the embedded server's credentials from dataDir.
// It never creates them: a directory without any gives an error wrapping
// ErrNoCredentials (see CreateCredentials).
func LoadCredentials(dataDir string) (Credentials, error) {
	path := filepath.Join(dataDir, credentialsFile)
	var c Credentials
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return c, fmt.Errorf("%w in %s (%s does not exist)", ErrNoCredentials, dataDir, credentialsFile)
	case err != nil:
		return c, fmt.Errorf("read credentials: %w", err)
	}
	if err := json.Unmarshal(data, &c); err != nil || c.GatewayPassword == "" || c.AgentKey == "" {
		return c, fmt.Errorf("%s is damaged (%v): delete it to generate new credentials (agents must then rejoin)", path, err)
	}
	return c, nil
}

// CreateCredentials returns the embedded server's credentials in dataDir,
// generating them first if it has none. The file appears whole or not at
// all, and two processes creating it at once end up with the same
// credentials.
func CreateCredentials(dataDir string) (Credentials, error) {
	c, err := LoadCredentials(dataDir)
	if !errors.Is(err, ErrNoCredentials) {
		return c, err
	}
	c = Credentials{GatewayPassword: randomSecret(), AgentKey: randomSecret()}
	data, _ := json.MarshalIndent(c, "", "  ")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return c, fmt.Errorf("create data dir: %w", err)
	}
	tmp, err := os.CreateTemp(dataDir, "."+credentialsFile+".new-*") // mode 0600
	if err != nil {
		return c, fmt.Errorf("write credentials: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return c, fmt.Errorf("write credentials: %w", err)
	}
	// A hard link never replaces a file another process created
	// meanwhile; where links are not supported, a rename is the next
	// best thing.
	path := filepath.Join(dataDir, credentialsFile)
	switch err := os.Link(tmp.Name(), path); {
	case errors.Is(err, os.ErrExist):
		return LoadCredentials(dataDir)
	case err != nil:
		if err := os.Rename(tmp.Name(), path); err != nil {
			return c, fmt.Errorf("write credentials: %w", err)
		}
	}
	if d, err := os.Open(dataDir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return c, nil
}

func randomSecret() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// HostPermissions are what the agent of one host may do on NATS: hear the
// calls, cancels and fetches addressed to its host, the gateway's discover
// request and replies to its own inbox; publish its own presence; and
// answer the messages it received (any number of frames per call, for as
// long as the longest call may run). It can neither hear other hosts'
// calls, nor announce another host, nor publish calls.
func HostPermissions(host string, maxCall time.Duration) *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{protocol.PresenceSubject(host)}},
		Subscribe: &server.SubjectPermission{Allow: []string{
			protocol.HostSubjects(host), protocol.DiscoverSubject(), protocol.AgentInboxPrefix(host) + ".>",
		}},
		Response: &server.ResponsePermission{MaxMsgs: -1, Expires: maxCall},
	}
}

// AgentPermissions are the permissions of a user shared by all agents, as
// an external cluster configured from deploy/nats may have: like
// HostPermissions, but for every host at once.
func AgentPermissions(maxCall time.Duration) *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{protocol.AllPresence()}},
		Subscribe: &server.SubjectPermission{Allow: []string{
			protocol.AllHosts(), protocol.DiscoverSubject(),
		}},
		Response: &server.ResponsePermission{MaxMsgs: -1, Expires: maxCall},
	}
}

// embeddedAuth admits the gateway and, under its host name, each agent
// whose password matches; nobody else. An admitted agent gets permissions
// for its own host only.
type embeddedAuth struct {
	creds   Credentials
	maxCall time.Duration
}

func (a *embeddedAuth) Check(c server.ClientAuthentication) bool {
	if c.Kind() != server.CLIENT {
		return false
	}
	o := c.GetOpts()
	if o == nil || o.Username == "" {
		return false // never anonymous
	}
	if o.Username == gatewayUser {
		if !equal(o.Password, a.creds.GatewayPassword) {
			return false
		}
		c.RegisterUser(&server.User{Username: gatewayUser})
		return true
	}
	if protocol.ValidateHost(o.Username) != nil || !equal(o.Password, a.creds.AgentPassword(o.Username)) {
		return false
	}
	c.RegisterUser(&server.User{Username: o.Username, Permissions: HostPermissions(o.Username, a.maxCall)})
	return true
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// embeddedOptions builds the embedded server's options. It never allows an
// anonymous client: the gateway and each agent have their own user.
func embeddedOptions(cfg *Config, creds Credentials) (*server.Options, error) {
	opts := &server.Options{
		ServerName:                 "fleet-gateway",
		NoSigs:                     true,
		NoLog:                      true,
		JetStream:                  true,
		StoreDir:                   filepath.Join(cfg.DataDir, "jetstream"),
		MaxPayload:                 cfg.NATSMaxPayload,
		CustomClientAuthentication: &embeddedAuth{creds: creds, maxCall: cfg.MaxCallDuration},
	}
	if cfg.NATSListen == "" {
		opts.DontListen = true
		return opts, nil
	}
	host, port, err := net.SplitHostPort(cfg.NATSListen)
	if err != nil {
		return nil, fmt.Errorf("--nats_listen %q: want host:port (%v)", cfg.NATSListen, err)
	}
	opts.Host = host
	if opts.Port, err = strconv.Atoi(port); err != nil {
		return nil, fmt.Errorf("--nats_listen %q: bad port", cfg.NATSListen)
	}
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	return opts, nil
}

// startEmbedded starts the embedded NATS server and waits until it takes
// connections. A listen address another process holds is reported as
// such, at once.
func startEmbedded(cfg *Config, creds Credentials) (*server.Server, error) {
	opts, err := embeddedOptions(cfg, creds)
	if err != nil {
		return nil, err
	}
	if !opts.DontListen && opts.Port != server.RANDOM_PORT {
		// The server would only log that it cannot listen, and never
		// become ready: try the address first.
		ln, err := listen(net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), "the embedded NATS server", "another fleet-gateway or NATS server", "--nats_listen")
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
	return ns, nil
}

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
