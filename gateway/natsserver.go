package gateway

import (
	"crypto/rand"
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

// NATS user names on the embedded server.
const (
	gatewayUser = "gateway"
	agentUser   = "agent"
)

// Credentials are the secrets of the embedded NATS server. They are
// generated on first start and kept in DataDir/credentials.json (0600), so
// agents that joined keep working across gateway restarts.
type Credentials struct {
	GatewayPassword string `json:"gateway_password"`
	AgentPassword   string `json:"agent_password"`
}

func loadCredentials(dataDir string) (Credentials, error) {
	path := filepath.Join(dataDir, "credentials.json")
	var c Credentials
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &c); err != nil || c.GatewayPassword == "" || c.AgentPassword == "" {
			return c, fmt.Errorf("%s is damaged (%v): delete it to generate new credentials (agents must then rejoin)", path, err)
		}
		return c, nil
	case !errors.Is(err, os.ErrNotExist):
		return c, fmt.Errorf("read credentials: %w", err)
	}
	c = Credentials{GatewayPassword: randomSecret(), AgentPassword: randomSecret()}
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

// AgentPermissions are what an agent may do on NATS: hear calls, cancels and
// fetches for hosts and the gateway's discover request, publish its presence,
// and answer the messages it received (any number of frames per call, for
// as long as the longest call may run). It can neither publish calls nor
// read replies meant for the gateway.
func AgentPermissions(maxCall time.Duration) *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: []string{protocol.AllPresence()}},
		Subscribe: &server.SubjectPermission{Allow: []string{
			protocol.AllHosts(), protocol.DiscoverSubject(),
		}},
		Response: &server.ResponsePermission{MaxMsgs: -1, Expires: maxCall},
	}
}

// embeddedOptions builds the embedded server's options. It never allows an
// anonymous client: the gateway and agents each have a user.
func embeddedOptions(cfg *Config, creds Credentials) (*server.Options, error) {
	opts := &server.Options{
		ServerName: "fleet-gateway",
		NoSigs:     true,
		NoLog:      true,
		JetStream:  true,
		StoreDir:   filepath.Join(cfg.DataDir, "jetstream"),
		MaxPayload: cfg.NATSMaxPayload,
		Users: []*server.User{
			{Username: gatewayUser, Password: creds.GatewayPassword},
			{Username: agentUser, Password: creds.AgentPassword, Permissions: AgentPermissions(cfg.MaxCallDuration)},
		},
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
