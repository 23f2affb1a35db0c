package integration

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/integration/oidctest"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// accessRules are the rules of the authenticated fleet: ops may do
// everything; anyone at example.com may read and run commands on staging
// hosts, except that dev@example.com may not run commands on beta.
const accessRules = `
rules:
  - name: ops
    match: {groups: ops}
    hosts: ["*"]
    tools: ["*"]
    admin: true
  - name: staging-devs
    match: {email: "*@example.com"}
    hosts: [env=staging]
    tools: [read, bash]
  - name: no-bash-on-beta
    deny: true
    match: {email: dev@example.com}
    hosts: [beta]
    tools: [bash]
`

// hostEnvs labels the fleet: alpha and beta are staging, gamma is prod.
var hostEnvs = map[string]string{"alpha": "staging", "beta": "staging", "gamma": "prod"}

// keyRefresh is how often the gateway under test may fetch the issuer's
// keys (30 s in production).
const keyRefresh = 300 * time.Millisecond

type authFleet struct {
	*Env
	is       *oidctest.Issuer
	ciToken  string // API token granting read on alpha
	auditLog string // the audit file
}

// newAuthFleet starts three hosts behind a gateway that requires bearer
// tokens: JWTs from a test issuer, and one API token.
func newAuthFleet(t *testing.T) *authFleet { return newAuthFleetWith(t, Options{}) }

// newAuthFleetWith is newAuthFleet with options (ExternalNATS).
func newAuthFleetWith(t *testing.T, opts Options) *authFleet {
	is := oidctest.New(t, audience, "key-1")
	rules, err := access.ParseRules("access.yaml", []byte(accessRules))
	if err != nil {
		t.Fatal(err)
	}
	ci, line, err := access.NewAPIToken("ci")
	if err != nil {
		t.Fatal(err)
	}
	line = strings.Replace(line, `hosts: ["*"]`, `hosts: [alpha]`, 1)
	tokens, err := access.ParseAPITokens("tokens.yaml", []byte("tokens:\n  "+line+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	f := &authFleet{is: is, ciToken: ci, auditLog: t.TempDir() + "/audit.jsonl"}
	opts.Agents = []string{"alpha", "beta", "gamma"}
	opts.Labels = func(host string) map[string]string { return map[string]string{"env": hostEnvs[host]} }
	opts.Gateway = func(c *gateway.Config) {
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{
			Issuer: is.URL(), Audience: audience, KeyRefreshInterval: keyRefresh,
			Scopes: []string{"openid", "email", "fleet"}, APITokens: tokens,
		}
		c.Access = rules
		c.Audit.File = f.auditLog
	}
	f.Env = NewEnv(t, opts)
	return f
}

// user returns a token for one of the test's callers.
func (f *authFleet) user(name string) string {
	extra := map[string]map[string]any{
		"ops":      {"email": "ops@example.com", "email_verified": true, "groups": []string{"ops"}, "project_id": "proj-ops"},
		"dev":      {"email": "dev@example.com", "email_verified": true, "client_id": "claude-code", "project_id": "proj-dev"},
		"stranger": {"email": "someone@elsewhere.org", "email_verified": true},
	}[name]
	return f.is.Token("key-1", f.is.Claims("user-"+name, extra))
}

// status posts an MCP initialize with token ("" for none) and returns
// the response status and WWW-Authenticate header.
func (f *authFleet) status(t *testing.T, token string) (int, string) {
	t.Helper()
	return f.statusVia(t, token, nil)
}

// statusVia is status with extra request headers (a proxy's).
func (f *authFleet) statusVia(t *testing.T, token string, header map[string]string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	req, err := http.NewRequest(http.MethodPost, f.Gateway.MCPURL(), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	if h := header["Host"]; h != "" {
		req.Host = h
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

// metadataURL is where the gateway's protected-resource metadata lives.
func (f *authFleet) metadataURL() string {
	u, _ := url.Parse(f.Gateway.MCPURL())
	return u.Scheme + "://" + u.Host + "/.well-known/oauth-protected-resource/mcp"
}

// Every refused or missing token gets 401 and a WWW-Authenticate header
// that points at the protected-resource metadata.
func TestAuthRefusesBadTokens(t *testing.T) {
	f := newAuthFleet(t)
	is := f.is
	now := time.Now()
	claims := func(mod map[string]any) map[string]any { return is.Claims("user-dev", mod) }
	is.AddKey("stray", jose.RS256) // never published
	valid := f.user("dev")
	cases := []struct{ name, token string }{
		{"missing token", ""},
		{"wrong audience", is.Token("key-1", claims(map[string]any{"aud": "https://other.test/mcp"}))},
		{"wrong issuer", is.Token("key-1", claims(map[string]any{"iss": "https://evil.test"}))},
		{"expired", is.Token("key-1", claims(map[string]any{"exp": now.Add(-2 * time.Minute).Unix()}))},
		{"not yet valid", is.Token("key-1", claims(map[string]any{"nbf": now.Add(5 * time.Minute).Unix()}))},
		{"no expiry", is.Token("key-1", func() map[string]any { c := claims(nil); delete(c, "exp"); return c }())},
		{"alg none", oidctest.AlgNone(claims(nil))},
		{"unknown key", is.Token("stray", claims(nil))},
		{"tampered payload", oidctest.Tampered(valid, is.Claims("user-ops", map[string]any{"groups": []string{"ops"}}))},
		{"HMAC with the public key", is.HMACConfusion("key-1", claims(nil))},
		{"garbage", "not-a-token"},
		{"unknown API token", "fmcp_" + strings.Repeat("A", 43)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, challenge := f.status(t, tc.token)
			if code != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", code)
			}
			ch, err := oauthex.ParseWWWAuthenticate([]string{challenge})
			if err != nil || len(ch) != 1 || ch[0].Scheme != "bearer" {
				t.Fatalf("WWW-Authenticate %q: want one Bearer challenge (%v)", challenge, err)
			}
			if got := ch[0].Params["resource_metadata"]; got != f.metadataURL() {
				t.Fatalf("resource_metadata = %q, want %q", got, f.metadataURL())
			}
		})
	}
	if code, _ := f.status(t, valid); code != http.StatusOK {
		t.Fatalf("a valid token got %d", code)
	}
	// The real client sees the refusal too.
	if _, err := f.ClientWith("2025-11-25", BearerClient(cases[1].token)); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Fatalf("MCP client with a token for another audience: %v, want Unauthorized", err)
	}
}

// A standard client finds where to log in: the protected-resource
// metadata names the issuer, the resource and the scopes.
func TestProtectedResourceMetadata(t *testing.T) {
	f := newAuthFleet(t)
	_, challenge := f.status(t, "")
	ch, _ := oauthex.ParseWWWAuthenticate([]string{challenge})
	u, _ := url.Parse(f.Gateway.MCPURL())
	for _, metaURL := range []string{ch[0].Params["resource_metadata"], u.Scheme + "://" + u.Host + "/.well-known/oauth-protected-resource"} {
		meta, err := oauthex.GetProtectedResourceMetadata(context.Background(), metaURL, f.Gateway.MCPURL(), http.DefaultClient)
		if err != nil {
			t.Fatalf("%s: %v", metaURL, err)
		}
		if !slices.Equal(meta.AuthorizationServers, []string{f.is.URL()}) {
			t.Errorf("%s: authorization_servers = %v, want [%s]", metaURL, meta.AuthorizationServers, f.is.URL())
		}
		if !slices.Equal(meta.ScopesSupported, []string{"openid", "email", "fleet"}) {
			t.Errorf("%s: scopes_supported = %v", metaURL, meta.ScopesSupported)
		}
	}
}

// Behind a TLS proxy on the same machine, requests arrive on loopback
// with the public Host: they are served, and the metadata names the
// public URL.
func TestBehindReverseProxy(t *testing.T) {
	f := newAuthFleet(t)
	proxy := map[string]string{"Host": "fleet.example.com", "X-Forwarded-Proto": "https"}
	code, challenge := f.statusVia(t, "", proxy)
	if want := `resource_metadata="https://fleet.example.com/.well-known/oauth-protected-resource/mcp"`; code != http.StatusUnauthorized || !strings.Contains(challenge, want) {
		t.Fatalf("no token via the proxy: %d %q, want 401 with %s", code, challenge, want)
	}
	if code, _ := f.statusVia(t, f.user("dev"), proxy); code != http.StatusOK {
		t.Fatalf("a valid token via the proxy got %d", code)
	}
}

// toolNames lists the tools a session sees.
func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

// hostNames lists the hosts the hosts tool shows.
func hostNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	var names []string
	for _, h := range structured(t, call(t, cs, "hosts", nil))["hosts"].([]any) {
		names = append(names, h.(map[string]any)["host"].(string))
	}
	return names
}

// Each caller sees exactly the hosts and tools its rules grant, in both
// protocol eras, and a call outside them is a clear tool error that
// never tells apart a host it may not see from one that does not exist.
func TestCallersSeeOnlyTheirHostsAndTools(t *testing.T) {
	f := newAuthFleet(t)
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			want := []struct {
				caller, token string
				tools, hosts  []string
			}{
				// The task tools come with bash.
				{"ops", f.user("ops"), []string{"audit", "bash", "delete", "edit", "fleet_bash", "fleet_read", "hosts", "list", "move", "patch", "read", "search", "skill",
					"skill_push", "skill_rollout", "skill_rollout_control", "skill_rollout_status", "task_cancel", "task_list", "task_status", "write"}, []string{"alpha", "beta", "gamma"}},
				{"dev", f.user("dev"), []string{"bash", "fleet_bash", "fleet_read", "hosts", "read", "task_cancel", "task_list", "task_status"}, []string{"alpha", "beta"}},
				{"ci", f.ciToken, []string{"fleet_read", "hosts", "read"}, []string{"alpha"}},
				{"stranger", f.user("stranger"), nil, nil},
			}
			for _, w := range want {
				cs := f.ClientAs(era.Version, w.token)
				if got := toolNames(t, cs); !slices.Equal(got, w.tools) {
					t.Errorf("%s: tools/list = %v, want %v", w.caller, got, w.tools)
				}
				if w.hosts == nil {
					mustErr(t, call(t, cs, "hosts", nil), "hosts not permitted for someone@elsewhere.org")
					continue
				}
				if got := hostNames(t, cs); !slices.Equal(got, w.hosts) {
					t.Errorf("%s: hosts = %v, want %v", w.caller, got, w.hosts)
				}
			}

			dev := f.ClientAs(era.Version, f.user("dev"))
			if got := mustOK(t, call(t, dev, "bash", map[string]any{"host": "alpha", "command": "echo dev-ok"})); got != "dev-ok\n" {
				t.Errorf("dev's bash on alpha = %q", got)
			}
			mustErr(t, call(t, dev, "bash", map[string]any{"host": "beta", "command": "true"}),
				"bash not permitted for dev@example.com on beta (refused by rule no-bash-on-beta)")
			mustErr(t, call(t, dev, "write", map[string]any{"host": "alpha", "path": "x", "content": "y"}), "write not permitted for dev@example.com")
			mustErr(t, call(t, dev, "audit", nil), "audit not permitted for dev@example.com")
			mustErr(t, call(t, dev, "skill_push", map[string]any{"host": "alpha", "path": "."}), "skill_push not permitted for dev@example.com")
			hidden := mustErr(t, call(t, dev, "read", map[string]any{"host": "gamma", "path": "x"}), "unknown host")
			missing := mustErr(t, call(t, dev, "read", map[string]any{"host": "delta", "path": "x"}), "unknown host")
			if strings.ReplaceAll(hidden, "gamma", "delta") != missing {
				t.Errorf("a hidden host and a missing one answer differently:\n%q\n%q", hidden, missing)
			}

			if err := os.WriteFile(filepath.Join(f.AgentDir("alpha"), "ci.txt"), []byte("for ci\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			ci := f.ClientAs(era.Version, f.ciToken)
			if got := mustOK(t, call(t, ci, "read", map[string]any{"host": "alpha", "path": "ci.txt"})); !strings.HasPrefix(got, "for ci") {
				t.Errorf("ci's read on alpha = %q", got)
			}
			mustErr(t, call(t, ci, "bash", map[string]any{"host": "alpha", "command": "true"}), "bash not permitted for token ci")
			mustErr(t, call(t, ci, "read", map[string]any{"host": "beta", "path": "ci.txt"}), `unknown host "beta"`)
		})
	}
}

// The issuer rotates its keys while the gateway runs: tokens signed by a
// newly published key are accepted without a restart, tokens signed by a
// retired key are refused once the gateway has fetched the new key set,
// and tokens naming unknown keys cannot make it fetch the key set more
// than once per interval.
func TestKeyRotation(t *testing.T) {
	f := newAuthFleet(t)
	is := f.is
	dev := func(kid string) string {
		return is.Token(kid, is.Claims("user-dev", map[string]any{"email": "dev@example.com", "email_verified": true}))
	}
	accepted := func(token string) bool {
		t.Helper()
		code, _ := f.status(t, token)
		return code == http.StatusOK
	}
	old := dev("key-1")
	cs := f.ClientAs("2025-11-25", old)
	mustOK(t, call(t, cs, "hosts", nil))

	// A flood of tokens from a key the issuer never published.
	is.AddKey("rogue", jose.RS256)
	time.Sleep(keyRefresh) // a fresh refresh interval: the gateway may fetch the key set once
	flood := make([]string, 30)
	for i := range flood {
		flood[i] = dev("rogue")
	}
	before, start := is.KeyFetches(), time.Now()
	for _, token := range flood {
		if accepted(token) {
			t.Fatal("a token signed by an unpublished key was accepted")
		}
	}
	// One fetch per interval at most (the flood may outlast one interval
	// on a slow machine).
	if n, limit := is.KeyFetches()-before, 1+int(time.Since(start)/keyRefresh); n > limit {
		t.Fatalf("30 tokens signed by an unknown key within %s made the gateway fetch the key set %d times, want at most %d",
			time.Since(start).Round(time.Millisecond), n, limit)
	}

	// Overlapping rotation: the new key is published next to the old one.
	is.AddKey("key-2", jose.ES256)
	is.Publish("key-1", "key-2")
	time.Sleep(keyRefresh) // the interval of the last fetch is over: the new key makes the gateway fetch
	if !accepted(dev("key-2")) {
		t.Fatal("a token signed by the newly published key was refused")
	}
	if !accepted(old) {
		t.Fatal("a token signed by the still-published old key was refused")
	}
	mustOK(t, call(t, f.ClientAs("", dev("key-2")), "hosts", nil))

	// The old key is retired: once the gateway has fetched the key set
	// again (a token signed by another new key makes it), old tokens fail.
	is.AddKey("key-3", jose.RS256)
	is.Publish("key-2", "key-3")
	time.Sleep(keyRefresh) // as above
	if !accepted(dev("key-3")) {
		t.Fatal("a token signed by the key published last was refused")
	}
	// go-oidc answers the call that fetched the set before it keeps the
	// new set: the old key goes a moment later.
	waitFor(t, 10*time.Second, "a token signed by the retired key refused once the key set was fetched again", func() bool { return !accepted(old) })
	time.Sleep(keyRefresh) // a refresh interval on, the retired key has not come back
	if accepted(old) {
		t.Fatal("a token signed by the retired key was accepted")
	}
	if !accepted(dev("key-2")) {
		t.Fatal("a token signed by a published key was refused after the rotation")
	}
}

// The caller's token stays at the gateway: the call an agent receives
// names the caller, nothing more.
func TestTokenNeverReachesAgents(t *testing.T) {
	f := newAuthFleetWith(t, Options{ExternalNATS: true})
	nc := f.GatewayConn()
	sub, err := nc.SubscribeSync(protocol.CallSubject("alpha"))
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	token := f.user("dev")
	mustOK(t, call(t, f.ClientAs("", token), "bash", map[string]any{"host": "alpha", "command": "true"}))
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("the call to alpha was not seen: %v", err)
	}
	payload := string(msg.Data)
	for k, v := range msg.Header {
		payload += k + strings.Join(v, "")
	}
	if !strings.Contains(payload, `"subject":"user-dev"`) || !strings.Contains(payload, "dev@example.com") {
		t.Errorf("the call does not name its caller: %s", payload)
	}
	sig := token[strings.LastIndexByte(token, '.')+1:]
	if strings.Contains(payload, token) || strings.Contains(payload, sig) || strings.Contains(payload, "Bearer") {
		t.Errorf("the caller's token reached the agent: %s", payload)
	}
}
