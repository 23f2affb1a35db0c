package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/confine"
	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
	"github.com/fleetmcp/fleetmcp/cmd/internal/profile"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// env returns a getenv that sees only vars, so the tests do not depend on
// the environment they run in.
// A --dev gateway saves fleetctl's profile in testProfile, never in the
// user's own configuration, unless vars names another file.
func env(vars map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := vars[k]; ok || k != profile.EnvPath {
			return v
		}
		return testProfile
	}
}

// syncBuffer is a bytes.Buffer that run may write to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runFails runs the gateway with args and returns the error it must fail
// with. A run that starts instead of failing is stopped and reported.
func runFails(t *testing.T, args []string, vars map[string]string) (stderrText string, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(vars), &stdout, &stderr) }()
	select {
	case err = <-done:
		if err == nil {
			t.Fatalf("run(%q) = nil, want an error", args)
		}
		return stderr.String(), err
	case <-time.After(15 * time.Second):
		cancel()
		<-done
		t.Fatalf("run(%q) started instead of refusing its flags; stdout:\n%s", args, stdout.String())
		return "", nil
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	base := []string{"--data_dir", dir, "--listen", "127.0.0.1:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "127.0.0.1:0"}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	tests := []struct {
		name string
		args []string
		vars map[string]string
		want []string
	}{
		{"unknown flag", with("--bogus"), nil, []string{"bogus", "not defined"}},
		{"stray argument", with("--dev", "extra"), nil, []string{`unexpected argument "extra"`}},
		{"flag after argument", []string{"serve", "--dev"}, nil, []string{`unexpected argument "serve"`}},
		{"bad duration", with("--session_timeout", "soon"), nil, []string{"session_timeout", "soon"}},
		{"request limit of nothing", with("--dev", "--max_request_mib", "0"), nil, []string{"--max_request_mib 0", "1 to 1024"}},
		{"request limit over the transfer budget", with("--dev", "--max_request_mib", "200"), nil, []string{"--max_transfer_mib", "below the request limit of 200 MiB"}},
		{"bad log level", with("--dev", "--log_level", "loud"), nil, []string{"--log_level", `"loud"`, "debug, info, warn or error"}},
		{"no auth on all interfaces", []string{"--no_auth", "--listen", "0.0.0.0:0", "--data_dir", dir}, nil, []string{"loopback", "0.0.0.0:0"}},
		{"dev on all interfaces", []string{"--dev", "--listen", "[::]:0", "--data_dir", dir}, nil, []string{"loopback"}},
		{"dev with an external NATS", with("--dev", "--nats_url", "nats://127.0.0.1:4222"), nil, []string{"--dev", "--nats_url"}},
		{"dev with an external NATS from the environment", with("--dev"), map[string]string{"FLEET_NATS_URL": "nats://127.0.0.1:4222"}, []string{"--dev", "--nats_url"}},
		{"no caller authentication configured", with(), nil, []string{"authentication is not configured", "--jwt_issuer", "--api_tokens", "--dev"}},
		{"issuer without audience or rules", with("--jwt_issuer", "https://id.example"), nil, []string{"--jwt_audience is required", "--access"}},
		{"issuer from the environment without audience", with(), map[string]string{"JWT_ISSUER": "https://id.example"}, []string{"--jwt_audience is required"}},
		{"HMAC algorithm", with("--jwt_issuer", "https://id.example", "--jwt_audience", "fleet", "--jwt_algs", "RS256,HS256"), nil, []string{"--jwt_algs", "HS256 is never accepted"}},
		{"alg none", with("--jwt_issuer", "https://id.example", "--jwt_audience", "fleet", "--jwt_algs", "none"), nil, []string{`"none" is never accepted`}},
		{"bad rate limit", with("--dev", "--rate_limit", "5/week"), nil, []string{"--rate_limit", `unknown period "week"`}},
		{"collector URL", with("--dev", "--otlp_endpoint", "grpc://127.0.0.1:4317"), nil, []string{"--otlp_endpoint", "http:// or https://"}},
		{"collector credentials", with("--dev", "--otlp_endpoint", "https://user:hunter2@otel.example"), nil, []string{"--otlp_endpoint", "OTEL_EXPORTER_OTLP_HEADERS"}},
		{"collector exporter", with("--dev"), map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "jaeger"}, []string{"OTEL_TRACES_EXPORTER", "otlp or none"}},
		{"no auth with an issuer flag", with("--no_auth", "--jwt_issuer", "https://id.example"), nil, []string{"authentication is off", "drop one"}},
		{"dev with rules", with("--dev", "--access", writeFile(t, "rules: [{match: {sub: x}, admin: true}]")), nil, []string{"access rules apply to authenticated callers", "--access"}},
		{"missing rules file", with("--api_tokens", filepath.Join(dir, "nope.yaml")), nil, []string{"API tokens", "nope.yaml", "no such file"}},
		{"bad tokens file", with("--api_tokens", writeFile(t, "tokens: [{name: a}]")), nil, []string{"token 1", "64 hex digits"}},
		{"bad audit replicas", with("--dev", "--audit_replicas", "9"), nil, []string{"replicas 9"}},
		{"bad hosts replicas", with("--dev", "--hosts_replicas", "6"), nil, []string{"hosts bucket replicas 6"}},
		{"short hosts retention", with("--dev", "--hosts_retention", "5m"), nil, []string{"hosts retention 5m0s", "minimum 1h"}},
		{"bad API token name", with("--new_api_token", "a b"), nil, []string{"--new_api_token", `"a b"`}},
		{"admin without a new token", with("--admin"), nil, []string{"--admin goes with --new_api_token"}},
		{"dev join token without dev", with("--dev_join_token"), nil, []string{"--dev_join_token is for --dev"}},
		{"bad NATS listen address", []string{"--dev", "--listen", "127.0.0.1:0", "--nats_listen", "4222", "--data_dir", dir}, nil, []string{"--nats_listen", `"4222"`}},
		{"external cluster without its setup", []string{"--no_auth", "--listen", "127.0.0.1:0", "--nats_url", "nats://127.0.0.1:4222"}, nil,
			[]string{"operator mode", "--nats_creds", "--nats_system_creds", "--nats_agent_signing_key", "nats-setup"}},
		{"external setup files for the embedded server", with("--dev", "--nats_creds", "gw.creds"), nil, []string{"--nats_creds is for an external NATS cluster"}},
		{"password flags are gone", with("--dev", "--nats_user", "gateway"), nil, []string{"-nats_user", "not defined"}},
		{"credential printing is gone", with("--agent_credential", "web-1"), nil, []string{"-agent_credential", "not defined"}},
		{"HTTP URL for agents", with("--dev", "--nats_advertise", "https://gw.example"), nil, []string{"--nats_advertise", "HTTP URL"}},
		{"MCP certificate without its key", with("--dev", "--tls_cert", "mcp.pem"), nil, []string{"--tls_cert and --tls_key go together"}},
		{"fleet API key without its certificate", with("--dev", "--api_tls_key", "api.key"), nil, []string{"--api_tls_cert and --api_tls_key go together"}},
		{"fleet API certificate with the API off", with("--dev", "--api_listen", "off", "--api_tls_cert", "a.pem", "--api_tls_key", "a.key"), nil, []string{"--api_tls_cert is for the fleet API"}},
		{"fleet API address without a port", with("--dev", "--api_listen", "8443"), nil, []string{"--api_listen", `"8443"`}},
		{"credential TTL too long", with("--dev", "--agent_credential_ttl", "10000h"), nil, []string{"agent credential TTL"}},
		{"nats-setup without a directory", []string{"nats-setup"}, nil, []string{"--out DIR is required"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runFails(t, tc.args, tc.vars)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run(%q) = %q, want it to mention %s", tc.args, err, w)
				}
			}
		})
	}
}

// writeFile writes content to a new file and returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "file.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunHelp(t *testing.T) {
	stderr, err := runFails(t, []string{"-h"}, nil)
	if !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run(-h) = %v, want flag.ErrHelp", err)
	}
	for _, w := range []string{"Usage:", "fleet-gateway --dev", "fleet-gateway nats-setup", "fleet-gateway signing-key", "fleet-gateway replica-seed", "--new_api_token NAME [--admin]"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("-h does not say %q:\n%s", w, stderr)
		}
	}
	// help is asked for: on stdout, and not an error.
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"help"}, env(nil), &stdout, io.Discard); err != nil || !strings.HasPrefix(stdout.String(), "fleet-gateway runs a fleetmcp gateway") || !strings.Contains(stdout.String(), "-data_dir") {
		t.Errorf("help = %v:\n%s", err, stdout.String())
	}
	for _, f := range []string{"-dev", "-no_auth", "-listen", "-api_listen", "-api_tls_cert", "-api_tls_key", "-tls_cert", "-tls_key", "-data_dir", "-nats_url", "-agent_name", "-nats_creds", "-nats_system_creds",
		"-nats_agent_signing_key", "-nats_operator_signing_key", "-nats_tls", "-nats_tls_cert", "-nats_tls_key", "-max_request_mib", "-nats_advertise", "-advertise", "-agent_credential_ttl"} {
		if !strings.Contains(stderr, f) {
			t.Errorf("usage does not list %s:\n%s", f, stderr)
		}
	}
}

// waitFor polls f every 50ms until it returns true or d passes.
func waitFor(d time.Duration, f func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if f() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestDevSmoke runs `fleet-gateway --dev` as the README's first command
// does, and drives it with the MCP client as a user would.
func TestDevSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS, the gateway and an agent")
	}
	dataDir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	args := []string{"--dev", "--dev_join_token", "--listen", "127.0.0.1:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "127.0.0.1:0", "--data_dir", dataDir, "--agent_name", "devhost"}
	profilePath := filepath.Join(t.TempDir(), "config", "fleetctl.json")
	go func() { done <- run(ctx, args, env(map[string]string{profile.EnvPath: profilePath}), &stdout, &stderr) }()
	stopped := false
	defer func() {
		if !stopped {
			cancel()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
			}
		}
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
		}
	}()

	// The banner ends with the same line whether or not it could make a
	// join token (which it does after printing the rest).
	const bannerEnd = "fleetctl token create prints the command that joins a host.\n"
	endpoint := regexp.MustCompile(`MCP endpoint:\s+(\S+)`)
	var mcpURL string
	var early error
	ok := waitFor(20*time.Second, func() bool {
		select {
		case early = <-done:
			stopped = true
			return true
		default:
		}
		out := stdout.String()
		if m := endpoint.FindStringSubmatch(out); m != nil && strings.Contains(out, bannerEnd) {
			mcpURL = m[1]
			return true
		}
		return false
	})
	switch {
	case stopped:
		t.Fatalf("run returned before printing its whole banner: %v", early)
	case !ok:
		t.Fatalf("no whole banner (its \"MCP endpoint:\" line and %q) on stdout within 20s", bannerEnd)
	}
	u, err := url.Parse(mcpURL)
	if err != nil || u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Port() == "0" {
		t.Fatalf("MCP endpoint %q is not an http URL on 127.0.0.1 with a real port (%v)", mcpURL, err)
	}
	out := stdout.String()
	for _, want := range []string{"NATS URL:      nats://127.0.0.1:", `"devhost"`, dataDir, "fleetctl token create"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout does not contain %q", want)
		}
	}
	if strings.Contains(out, "nats://127.0.0.1:0\n") || strings.Contains(out, "PASSWORD") {
		t.Errorf("the join instructions name port 0 or a password:\n%s", out)
	}
	// fleetctl's settings: one export line, and the profile saved for
	// this user.
	export := regexp.MustCompile(`(?m)^  export FLEET_GATEWAY=(https://127\.0\.0\.1:\d+) FLEET_CA_PIN=(sha256:[0-9a-f]{64})$`).FindStringSubmatch(out)
	if export == nil {
		t.Fatalf("no export line for fleetctl on stdout:\n%s", out)
	}
	if p, err := profile.Load(profilePath); err != nil || p == nil || p.Gateway != export[1] || p.CAPin != export[2] || !p.Dev {
		t.Errorf("fleetctl's profile %+v, %v; want the gateway and pin of the export line", p, err)
	}
	// The printed join command works: its token (on stdin) enrols one
	// more host over the fleet API, whose CA has the printed pin; only
	// once.
	join := regexp.MustCompile(`token: +(\S+)\n  command: fleet-agent join --gateway (https://127\.0\.0\.1:\d+) --ca_pin (sha256:[0-9a-f]{64}) --token_file -\n`).FindStringSubmatch(out)
	if join == nil {
		t.Fatalf("no ready join command on stdout:\n%s", out)
	}
	join[1], join[2] = join[2], join[1]
	jc := enrolclient.New(join[1], join[3], 1)
	defer jc.Close()
	kp, _ := nkeys.CreateUser()
	if resp, err := jc.Enrol(ctx, kp, join[2], "other-1"); err != nil || resp.Labels["dev"] != "true" {
		t.Errorf("enrol with the printed join command: %v %+v", err, resp)
	}
	var aerr *protocol.APIError
	if _, err := jc.Enrol(ctx, kp, join[2], "other-2"); !errors.As(err, &aerr) || aerr.Code != protocol.APITokenSpent {
		t.Errorf("the dev token used twice: %v", err)
	}
	// The fleet's keys and the dev agent's identity are readable by their
	// owner only.
	for _, f := range []string{"nats/operator.nk", "nats/system-signer.nk", "nats/gateway-signer.nk", "nats/enrol-signer.nk", "nats/agent-signer.nk", "nats/account.jwt",
		"agent/identity/agent.nk", "agent/identity/agent.jwt", "agent/identity/enrolment.json"} {
		fi, err := os.Stat(filepath.Join(dataDir, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
		} else if mode := fi.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", f, mode)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "credentials.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a password file was made: %v", err)
	}

	cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
	defer ccancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "dev-smoke", Version: "1"}, nil)
	cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: mcpURL}, nil)
	if err != nil {
		t.Fatalf("connect to %s: %v", mcpURL, err)
	}
	defer cs.Close()

	var hosts string
	if !waitFor(20*time.Second, func() bool {
		res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{}})
		if err != nil {
			hosts = err.Error()
			return false
		}
		hosts = resultText(res)
		return !res.IsError && strings.Contains(hosts, "devhost\tonline") && strings.Contains(hosts, "labels dev=true")
	}) {
		t.Fatalf("devhost did not come online within 20s with its labels; hosts said:\n%s", hosts)
	}

	for _, host := range []string{"devhost"} {
		res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": host, "command": "echo dev-ok"}})
		if err != nil {
			t.Fatalf("bash on %s: %v", host, err)
		}
		if got := resultText(res); res.IsError || got != "dev-ok\n" {
			t.Errorf("bash echo dev-ok on %s = %q (error %v), want %q", host, got, res.IsError, "dev-ok\n")
		}
	}
	cs.Close()

	cancel()
	stopped = true
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run after cancel = %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return within 15s of its context ending")
	}
}

// startRun starts the gateway with args and returns its MCP URL (with a
// loopback host) once it prints it; the gateway is stopped at cleanup.
func startRun(t *testing.T, args []string, vars map[string]string) (mcpURL string, stdout *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stdout = &syncBuffer{}
	var stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(vars), stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("run did not stop within 15s")
		}
	})
	endpoint := regexp.MustCompile(`MCP endpoint:\s+http://(\S+)/mcp`)
	var early error
	if !waitFor(20*time.Second, func() bool {
		select {
		case early = <-done:
			return true
		default:
		}
		return endpoint.MatchString(stdout.String())
	}) || early != nil {
		t.Fatalf("run(%q) did not start: %v\nstderr:\n%s", args, early, stderr.String())
	}
	_, port, _ := net.SplitHostPort(endpoint.FindStringSubmatch(stdout.String())[1])
	return "http://127.0.0.1:" + port + "/mcp", stdout
}

func bearer(token string) *http.Client {
	return &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+token)
		return http.DefaultTransport.RoundTrip(r)
	})}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// With authentication configured (here API tokens made with
// --new_api_token) the gateway starts on any address, answers 401
// without a token, and serves the token's caller.
func TestRunWithAPITokens(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--new_api_token", "ci-bot"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+(fmcp_\S+)$[\s\S]*^\s+(- \{name: "ci-bot".*\})$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("--new_api_token printed no token and entry:\n%s", out.String())
	}
	tokens := writeFile(t, "tokens:\n  "+m[2]+"\n")
	args := []string{"--api_tokens", tokens, "--listen", "0.0.0.0:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "127.0.0.1:0", "--data_dir", t.TempDir()}
	mcpURL, stdout := startRun(t, args, nil)
	if !strings.Contains(stdout.String(), "API tokens:   "+tokens) {
		t.Errorf("startup output does not name the tokens file:\n%s", stdout.String())
	}
	resp, err := http.Post(mcpURL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "resource_metadata=") {
		t.Fatalf("no token: %s, WWW-Authenticate %q; want 401 with resource_metadata", resp.Status, resp.Header.Get("WWW-Authenticate"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: mcpURL, HTTPClient: bearer(m[1])}, nil)
	if err != nil {
		t.Fatalf("connect with the new token: %v", err)
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{}})
	if err != nil || res.IsError || !strings.HasPrefix(resultText(res), "0 hosts") {
		t.Fatalf("hosts as ci-bot: %v %q", err, resultText(res))
	}
}

// Users of other servers have JWT_ISSUER and friends set; --dev (auth
// off) ignores them instead of refusing to start.
func TestDevIgnoresJWTEnvironment(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS, the gateway and an agent")
	}
	vars := map[string]string{"JWT_ISSUER": "https://id.example", "JWT_AUDIENCE": "fleet", "JWKS_URI": "https://id.example/jwks"}
	args := []string{"--dev", "--listen", "127.0.0.1:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "127.0.0.1:0", "--data_dir", t.TempDir(), "--agent_name", "devhost"}
	startRun(t, args, vars)
}

// nats-setup writes an external cluster's setup with private seeds and
// creds, says which flags the gateways take, and refuses to overwrite a
// setup (that would be another fleet).
func TestNATSSetupCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "fleet-nats")
	var out bytes.Buffer
	if err := run(context.Background(), []string{"nats-setup", "--out", dir}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--nats_creds " + filepath.Join(dir, "gateway.creds"), "--nats_system_creds " + filepath.Join(dir, "system.creds"),
		"--nats_agent_signing_key " + filepath.Join(dir, "agent-signer.nk"), "--nats_operator_signing_key " + filepath.Join(dir, "operator-signer.nk"),
		"include fleet-auth.conf", "offline"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("nats-setup output lacks %q:\n%s", want, out.String())
		}
	}
	for name, mode := range map[string]os.FileMode{"operator.nk": 0o600, "operator-signer.nk": 0o600, "account.nk": 0o600, "agent-signer.nk": 0o600,
		"system-account.nk": 0o600, "gateway.creds": 0o600, "system.creds": 0o600, "fleet-auth.conf": 0o644, "account.jwt": 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if fi.Mode().Perm() != mode {
			t.Errorf("%s has mode %04o, want %04o", name, fi.Mode().Perm(), mode)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, "account.nk"))
	err := run(context.Background(), []string{"nats-setup", "--out", dir}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "already holds a setup") {
		t.Fatalf("a second nats-setup into %s: %v; want a refusal", dir, err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "account.nk")); !bytes.Equal(before, after) {
		t.Error("the refused second setup changed the account key")
	}
}

// Two gateways on one --data_dir would share one JetStream store: the
// second is refused, naming the first.
func TestRunDataDirInUse(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--dev", "--listen", "127.0.0.1:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "127.0.0.1:0", "--data_dir", dir, "--agent_name", "devhost"}
	startRun(t, args, nil)
	_, err := runFails(t, args, nil)
	want := "data directory " + dir + " is in use by another fleet-gateway (pid " + strconv.Itoa(os.Getpid()) + ")"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("second gateway: %v; want %q", err, want)
	}
}

// TestDevAgentKeepsOffGatewayData: the agent --dev runs in the gateway's
// process cannot reach the gateway's data directory — the NATS keys (the
// agent signing key issues any agent's credential) and the fleet CA's key
// among them — with any file tool, by name, through links or "..", or
// under another name; its own bash full outputs, kept in that directory,
// stay readable.
func TestDevAgentKeepsOffGatewayData(t *testing.T) {
	if testing.Short() {
		t.Skip("starts NATS, the gateway and an agent")
	}
	dataDir := t.TempDir()
	mcpURL, _ := startRun(t, []string{"--dev", "--listen", "127.0.0.1:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "127.0.0.1:0", "--nats_tls", "--data_dir", dataDir, "--agent_name", "devhost"}, nil)
	creds := filepath.Join(dataDir, "nats", "agent-signer.nk")
	caKey := filepath.Join(dataDir, "tls", "ca.key")
	secret, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	caSecret, err := os.ReadFile(caKey)
	if err != nil {
		t.Fatal(err)
	}
	seed := strings.TrimSpace(string(secret))
	caLine := strings.Split(strings.TrimSpace(string(caSecret)), "\n")[1]
	links := t.TempDir()
	for name, target := range map[string]string{"creds-link": creds, "data-link": dataDir} {
		if err := os.Symlink(target, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(creds, filepath.Join(links, "hard.nk")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: mcpURL}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	callTool := func(tool string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		args["host"] = "devhost"
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s %v: %v", tool, args, err)
		}
		if out := resultText(res); strings.Contains(out, seed) || strings.Contains(out, caLine) {
			t.Fatalf("%s %v revealed a key:\n%s", tool, args, out)
		}
		return res
	}
	if !waitFor(20*time.Second, func() bool {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{}})
		return err == nil && strings.Contains(resultText(res), "devhost\tonline")
	}) {
		t.Fatal("devhost did not come online")
	}

	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"read", map[string]any{"path": creds}},
		{"read", map[string]any{"path": caKey}},
		{"read", map[string]any{"path": filepath.Join(dataDir, "nats", "operator.nk")}},
		{"read", map[string]any{"path": filepath.Join(dataDir, "agent", "..", "nats", "agent-signer.nk")}},
		{"read", map[string]any{"path": filepath.Join(dataDir, "agent", "identity", "agent.nk")}},
		{"read", map[string]any{"path": filepath.Join(links, "creds-link")}},
		{"read", map[string]any{"path": filepath.Join(links, "data-link", "nats", "agent-signer.nk")}},
		{"read", map[string]any{"path": filepath.Join(links, "hard.nk")}},
		{"read", map[string]any{"path": filepath.Join(dataDir, "gateway.lock")}},
		{"list", map[string]any{"path": dataDir}},
		{"list", map[string]any{"path": filepath.Join(dataDir, "nats")}},
		{"list", map[string]any{"path": filepath.Join(links, "data-link")}},
		{"search", map[string]any{"path": dataDir, "query": "SA"}},
		{"search", map[string]any{"path": filepath.Join(links, "hard.nk"), "query": "SA"}},
		{"write", map[string]any{"path": filepath.Join(dataDir, "x.txt"), "content": "x"}},
		{"write", map[string]any{"path": filepath.Join(dataDir, "nats", "account.jwt"), "content": "x"}},
		{"write", map[string]any{"path": filepath.Join(links, "creds-link"), "content": "{}"}},
		{"edit", map[string]any{"path": creds, "edits": []map[string]any{{"old_string": "SA", "new_string": "k"}}}},
		{"delete", map[string]any{"path": creds}},
		{"delete", map[string]any{"path": caKey}},
		{"move", map[string]any{"path": creds, "destination": filepath.Join(links, "stolen.nk")}},
		{"delete", map[string]any{"path": filepath.Join(dataDir, "jetstream"), "recursive": true}},
	} {
		res := callTool(tc.tool, tc.args)
		if !res.IsError || !strings.Contains(resultText(res), "denied") {
			t.Errorf("%s %v: %q; want it denied", tc.tool, tc.args, resultText(res))
		}
	}
	// Where the kernel can confine them, the agent's commands cannot
	// read the gateway's keys either, by any path.
	if abi, _ := confine.ABI(); abi > 0 {
		for _, cmd := range []string{"cat " + creds, "cat " + caKey, "cat " + filepath.Join(links, "creds-link"), "cat " + filepath.Join(links, "data-link", "tls", "ca.key")} {
			if out := resultText(callTool("bash", map[string]any{"command": cmd})); strings.Contains(out, seed) || strings.Contains(out, caLine) || !strings.Contains(out, "Permission denied") {
				t.Errorf("bash %s: %q", cmd, out)
			}
		}
	}
	// A search of a tree holding the links finds nothing through them.
	callTool("search", map[string]any{"path": links, "query": "SA"})
	if after, err := os.ReadFile(creds); err != nil || !bytes.Equal(after, secret) {
		t.Fatalf("the agent signing key changed: %v", err)
	}

	// The agent's own full outputs, kept under the data directory, are
	// still handed out.
	res := callTool("bash", map[string]any{"command": "seq 1 30000"})
	full := regexp.MustCompile(`Full output: ([^\s\]]+)`).FindStringSubmatch(resultText(res))
	if full == nil || !strings.HasPrefix(full[1], dataDir) {
		t.Fatalf("bash of a long output gave no full-output file under the data directory:\n%s", resultText(res))
	}
	if res := callTool("read", map[string]any{"path": full[1], "offset": 29999}); res.IsError || !strings.HasPrefix(resultText(res), "29999\n") {
		t.Fatalf("read of the full output file: %q", resultText(res))
	}
}

// --nats_tls_cert/--nats_tls_key: the embedded server serves the given
// chain, and the start prints the pin of its CA (the chain's last
// certificate), the one hosts give fleet-agent join.
func TestRunNATSCertificate(t *testing.T) {
	ca := identitytest.NewCA(t, "operator's NATS CA")
	leaf := ca.Leaf(t, []string{"127.0.0.1", "localhost"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), ca.Cert)
	var chain []byte
	for _, der := range leaf.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile := writeFile(t, string(chain))
	keyFile := writeFile(t, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})))
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--new_api_token", "ci-bot"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+(- \{name: "ci-bot".*\})$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("--new_api_token printed no entry:\n%s", out.String())
	}
	tokens := writeFile(t, "tokens:\n  "+m[1]+"\n")
	args := []string{"--api_tokens", tokens, "--listen", "127.0.0.1:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "off", "--data_dir", t.TempDir(),
		"--nats_tls_cert", certFile, "--nats_tls_key", keyFile}
	_, stdout := startRun(t, args, nil)
	if !regexp.MustCompile(`NATS:\s+tls://127\.0\.0\.1:\d+`).MatchString(stdout.String()) {
		t.Errorf("the embedded server does not serve TLS:\n%s", stdout.String())
	}
	if !strings.Contains(stdout.String(), "CA pin:       "+ca.Pin()) {
		t.Errorf("the start does not print the given chain's CA pin %s:\n%s", ca.Pin(), stdout.String())
	}
}
