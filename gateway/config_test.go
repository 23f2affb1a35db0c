package gateway

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// external sets the files an external cluster needs.
func external(c Config) Config {
	c.NATSCredsFile, c.NATSSystemCredsFile = "gw.creds", "sys.creds"
	c.NATSAgentSigningKeyFile, c.NATSOperatorSigningKeyFile = "agent.nk", "op.nk"
	c.SigningKeyFile = "gateway.key"
	return c
}

func TestConfigValidate(t *testing.T) {
	dev := func(c Config) Config { // a valid loopback, auth-off setup
		if c.DataDir == "" && c.NATSURLs == nil {
			c.DataDir = "/var/lib/fleet"
		}
		c.AuthDisabled = true
		return c
	}
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the error; none: valid
	}{
		{"defaults with auth off", dev(Config{}), nil},
		{"loopback IPv4", dev(Config{Listen: "127.0.0.1:8080"}), nil},
		{"loopback IPv4 other address", dev(Config{Listen: "127.0.0.2:9000"}), nil},
		{"loopback IPv6", dev(Config{Listen: "[::1]:8080"}), nil},
		{"localhost", dev(Config{Listen: "localhost:8080"}), nil},
		{"random port", dev(Config{Listen: "127.0.0.1:0"}), nil},
		{"external NATS needs no data dir", dev(external(Config{NATSURLs: []string{"nats://10.0.0.1:4222"}})), nil},
		{"external NATS needs a signing key", func() Config {
			c := dev(external(Config{NATSURLs: []string{"nats://10.0.0.1:4222"}}))
			c.SigningKeyFile = ""
			return c
		}(), []string{"signs every call", "--signing_key FILE", "nats-setup"}},
		{"external NATS without its files", dev(Config{NATSURLs: []string{"nats://10.0.0.1:4222"}, NATSCredsFile: "gw.creds"}),
			[]string{"operator mode", "--nats_system_creds, --nats_agent_signing_key:", "nats-setup"}},
		{"external files for the embedded server", dev(Config{DataDir: "/d", NATSAgentSigningKeyFile: "k.nk"}), []string{"--nats_agent_signing_key is for an external NATS cluster"}},
		{"TLS flag for an external cluster", dev(external(Config{NATSURLs: []string{"nats://10.0.0.1:4222"}, NATSTLS: true})), []string{"--nats_tls is for the embedded server"}},
		{"HTTP URL advertised to agents", dev(Config{DataDir: "/d", NATSAdvertise: []string{"http://gw:8080"}}), []string{"--nats_advertise", "HTTP URL"}},
		{"agent credential TTL too short", dev(Config{DataDir: "/d", AgentCredentialTTL: time.Millisecond}), []string{"agent credential TTL 1ms"}},
		{"auth off on all interfaces", dev(Config{Listen: "0.0.0.0:8080"}), []string{"loopback", `"0.0.0.0:8080"`, "--listen 127.0.0.1"}},
		{"auth off on empty host", dev(Config{Listen: ":8080"}), []string{"loopback", `":8080"`}},
		{"auth off on IPv6 any", dev(Config{Listen: "[::]:8080"}), []string{"loopback"}},
		{"auth off on a LAN address", dev(Config{Listen: "192.168.1.10:8080"}), []string{"loopback"}},
		{"auth off on a host name", dev(Config{Listen: "gateway.example.com:8080"}), []string{"loopback"}},
		{"auth off on a name that starts with localhost", dev(Config{Listen: "localhost.example.com:8080"}), []string{"loopback"}},
		{"auth off without a port", dev(Config{Listen: "127.0.0.1"}), []string{"loopback"}},
		{"embedded NATS without data dir", Config{AuthDisabled: true}, []string{"data directory", "--data_dir"}},
		// An empty (not nil) URL list still means the embedded server,
		// which then has nowhere to keep its state.
		{"empty NATS URL list without data dir", Config{AuthDisabled: true, NATSURLs: []string{}}, []string{"data directory", "--data_dir"}},
		{"fleet API certificate without its key", dev(Config{APIListen: "127.0.0.1:8443", APITLSCert: "api.pem"}), []string{"--api_tls_cert and --api_tls_key go together"}},
		{"MCP key without its certificate", dev(Config{TLSKey: "mcp.key"}), []string{"--tls_cert and --tls_key go together"}},
		{"NATS certificate without its key", dev(Config{NATSListen: "127.0.0.1:4222", NATSTLSCert: "n.pem"}), []string{"--nats_tls_cert and --nats_tls_key go together"}},
		{"NATS certificate with the listener off", dev(Config{NATSTLSCert: "n.pem", NATSTLSKey: "n.key"}), []string{"--nats_tls_cert is for the embedded NATS server's listener", "--nats_listen"}},
		{"NATS certificate with an external cluster", dev(external(Config{NATSURLs: []string{"tls://10.0.0.1:4222"}, NATSTLSCert: "n.pem", NATSTLSKey: "n.key"})),
			[]string{"--nats_tls_cert is for the embedded server", "--nats_ca"}},
		{"fleet API certificate with the API off", dev(Config{APITLSCert: "a.pem", APITLSKey: "a.key"}), []string{"--api_tls_cert is for the fleet API", "--api_listen"}},
		{"fleet API without a port", dev(Config{APIListen: "127.0.0.1"}), []string{"--api_listen", "host:port", `"off"`}},
		{"fleet API on an external cluster without a CA", dev(external(Config{NATSURLs: []string{"nats://10.0.0.1:4222"}, APIListen: "127.0.0.1:8443"})),
			[]string{"fleet CA in --data_dir", "--api_tls_cert"}},
		{"fleet API on an external cluster with its own certificate", dev(external(Config{NATSURLs: []string{"nats://10.0.0.1:4222"}, APIListen: "0.0.0.0:8443",
			APITLSCert: "a.pem", APITLSKey: "a.key"})), nil},
		{"silence too short", dev(Config{Silence: 50 * time.Millisecond}), []string{"silence", "50ms", "minimum 100ms"}},
		{"silence at the minimum", dev(Config{Silence: 100 * time.Millisecond}), nil},
		{"auth enabled", Config{DataDir: "/var/lib/fleet"}, []string{"authentication is not configured", "--dev", "--no_auth", "loopback", "--jwt_issuer", "--api_tokens"}},
		{"API tokens on all interfaces", Config{DataDir: "/var/lib/fleet", Listen: "0.0.0.0:8080", Auth: access.AuthConfig{APITokens: &access.APITokens{}}}, nil},
		{"metrics on a loopback MCP listener", dev(Config{Metrics: true}), nil},
		{"metrics on an MCP listener beyond loopback", Config{DataDir: "/var/lib/fleet", Listen: "0.0.0.0:8080", Auth: access.AuthConfig{APITokens: &access.APITokens{}}, Metrics: true},
			[]string{"--metrics", "without authentication", "0.0.0.0:8080", "--metrics_listen"}},
		{"metrics on a listener of their own", Config{DataDir: "/var/lib/fleet", Listen: "0.0.0.0:8080", Auth: access.AuthConfig{APITokens: &access.APITokens{}}, MetricsListen: "127.0.0.1:9464"}, nil},
		{"a CORS wildcard", dev(Config{CORSOrigins: []string{"*"}}), []string{"--cors_origins", "would admit any page"}},
		{"JWT with rules on all interfaces", Config{DataDir: "/var/lib/fleet", Listen: "0.0.0.0:8080",
			Auth: access.AuthConfig{Issuer: "https://id.example", Audience: "fleet"}, Access: &access.Rules{}}, nil},
		{"JWT without rules", Config{DataDir: "/var/lib/fleet", Auth: access.AuthConfig{Issuer: "https://id.example", Audience: "fleet"}}, []string{"--access"}},
		{"JWT without audience", Config{DataDir: "/var/lib/fleet", Auth: access.AuthConfig{Issuer: "https://id.example"}, Access: &access.Rules{}}, []string{"--jwt_audience is required"}},
		{"auth off with an issuer", dev(Config{Auth: access.AuthConfig{Issuer: "https://id.example", Audience: "fleet"}}), []string{"authentication is off", "drop one"}},
		{"auth off with rules", dev(Config{Access: &access.Rules{}}), []string{"access rules apply to authenticated callers", "--access"}},
		{"audit replicas", dev(Config{Audit: audit.Config{Replicas: 7}}), []string{"replicas 7"}},
		{"audit retention", dev(Config{Audit: audit.Config{Retention: time.Minute}}), []string{"retention 1m0s"}},
		{"hosts replicas", dev(Config{Hosts: HostsConfig{Replicas: 6}}), []string{"hosts bucket replicas 6"}},
		{"hosts retention", dev(Config{Hosts: HostsConfig{Retention: time.Minute}}), []string{"hosts retention 1m0s", "minimum 1h"}},
		{"hosts kept forever", dev(Config{Hosts: HostsConfig{Retention: -1}}), nil},
		{"offline-after too short", dev(Config{OfflineAfter: time.Millisecond}), []string{"offline-after 1ms", "1s to 10m"}},
		{"offline-after too long", dev(Config{OfflineAfter: time.Hour}), []string{"offline-after 1h0m0s"}},
		{"everything wrong at once", Config{Listen: "0.0.0.0:1", Silence: time.Millisecond},
			[]string{"data directory", "authentication is not configured", "silence"}},
		{"auth off and everything wrong", Config{AuthDisabled: true, Listen: "0.0.0.0:1", Silence: time.Millisecond},
			[]string{"data directory", "loopback, not", "silence"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cfg
			c.setDefaults()
			err := c.validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("validate(%+v) = %v, want it accepted", tc.cfg, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validate(%+v) accepted the config, want an error mentioning %q", tc.cfg, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	var c Config
	c.setDefaults()
	if c.Listen != "127.0.0.1:8080" || c.MaxRequestBytes != 64<<20 || c.SessionTimeout != 30*time.Minute ||
		c.FileCallTimeout != time.Minute || c.MaxCallDuration != time.Hour || c.Silence != 5*time.Second ||
		c.OfflineAfter != 15*time.Second || c.ProgressIdle != 5*time.Second || c.Logger == nil ||
		c.Hosts.Retention != 30*24*time.Hour || c.Hosts.Replicas != 0 {
		t.Errorf("defaults = %+v", c)
	}
	set := Config{
		Listen: "127.0.0.1:1", MaxRequestBytes: 1, SessionTimeout: 1, FileCallTimeout: 2, MaxCallDuration: 3,
		Silence: 4, OfflineAfter: 5, ProgressIdle: 6, Logger: discardLogger(),
	}
	c = set
	c.setDefaults()
	if c.Listen != set.Listen || c.MaxRequestBytes != 1 || c.SessionTimeout != 1 || c.FileCallTimeout != 2 ||
		c.MaxCallDuration != 3 || c.Silence != 4 || c.OfflineAfter != 5 || c.ProgressIdle != 6 || c.Logger != set.Logger {
		t.Errorf("setDefaults changed values that were set: %+v", c)
	}
}

func TestIsLoopback(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:8080", true},
		{"127.0.0.1:0", true},
		{"127.9.9.9:80", true},
		{"[::1]:8080", true},
		{"localhost:8080", true},
		{"[::ffff:127.0.0.1]:80", true},
		{"0.0.0.0:8080", false},
		{":8080", false},
		{"[::]:8080", false},
		{"10.0.0.1:8080", false},
		{"[fe80::1]:8080", false},
		{"example.com:8080", false},
		{"localhost.example.com:8080", false},
		{"127.0.0.1", false},
		{"localhost", false},
		{"::1", false},
		{"", false},
	}
	for _, tc := range tests {
		if got := isLoopback(tc.addr); got != tc.want {
			t.Errorf("isLoopback(%q) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// The hops that leave the machine without TLS are named at start: the
// MCP endpoint beyond loopback without a certificate, and plain nats://
// URLs to another machine; loopback and TLS are not.
func TestTransportWarnings(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"loopback MCP", Config{Listen: "127.0.0.1:8080"}, nil},
		{"localhost MCP", Config{Listen: "localhost:8080"}, nil},
		{"MCP on every interface", Config{Listen: "0.0.0.0:8080"}, []string{"MCP endpoint listens beyond loopback (0.0.0.0:8080) without TLS", "--tls_cert", "deploy/proxy"}},
		{"MCP on a LAN address", Config{Listen: "10.1.2.3:8080"}, []string{"(10.1.2.3:8080) without TLS"}},
		{"MCP with TLS", Config{Listen: "0.0.0.0:8443", TLSCert: "c.pem", TLSKey: "k.pem"}, nil},
		{"external cluster over TLS", Config{Listen: "127.0.0.1:8080", NATSURLs: []string{"tls://nats-1.example:4222"}}, nil},
		{"external cluster on loopback", Config{Listen: "127.0.0.1:8080", NATSURLs: []string{"nats://127.0.0.1:4222", "localhost:4222", "nats://[::1]:4222"}}, nil},
		{"external cluster in the clear", Config{Listen: "127.0.0.1:8080", NATSURLs: []string{"tls://a:4222", "nats://10.0.0.5:4222"}},
			[]string{"--nats_url nats://10.0.0.5:4222 is plain nats:// to another machine", "tls://"}},
		{"a bare host:port", Config{Listen: "127.0.0.1:8080", NATSURLs: []string{"nats-2.example:4222"}}, []string{"--nats_url nats-2.example:4222 is plain"}},
		{"advertised in the clear", Config{Listen: "127.0.0.1:8080", NATSAdvertise: []string{"nats://gw.example:4222"}}, []string{"--nats_advertise nats://gw.example:4222"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := strings.Join(tc.cfg.transportWarnings(), "\n")
			if tc.want == nil && got != "" {
				t.Errorf("warnings %q, want none", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("warnings %q do not say %q", got, w)
				}
			}
		})
	}
}

// Start logs the warnings: an MCP endpoint on every interface, without
// TLS, with API tokens (authentication on).
func TestStartWarnsOfClearTransport(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := Config{Listen: "0.0.0.0:0", DataDir: t.TempDir(), Auth: access.AuthConfig{APITokens: &access.APITokens{}},
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	gw, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Shutdown(t.Context())
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "MCP endpoint listens beyond loopback (0.0.0.0:0) without TLS") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
