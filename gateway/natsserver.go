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

// LoadCredentials reads the embedded server's credentials from dataDir,
// generating them on first use.
func LoadCredentials(dataDir string) (Credentials, error) {
	path := filepath.Join(dataDir, "credentials.json")
	var c Credentials
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &c); err != nil || c.GatewayPassword == "" || c.AgentKey == "" {
			return c, fmt.Errorf("%s is damaged (%v): delete it to generate new credentials (agents must then rejoin)", path, err)
		}
		return c, nil
	case !errors.Is(err, os.ErrNotExist):
		return c, fmt.Errorf("read credentials: %w", err)
	}
	c = Credentials{GatewayPassword: randomSecret(), AgentKey: randomSecret()}
	data, _ = json.MarshalIndent(c, "", "  ")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return c, fmt.Errorf("create data dir: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return c, fmt.Errorf("write credentials: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return c, fmt.Errorf("write credentials: %w", err)
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
// connections.
func startEmbedded(cfg *Config, creds Credentials) (*server.Server, error) {
	opts, err := embeddedOptions(cfg, creds)
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS did not become ready within 10s (listen %s)", cfg.NATSListen)
	}
	return ns, nil
}
