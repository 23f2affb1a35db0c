package integration

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/integration/oidctest"
)

// tokenOnlyPolicy grants the API token deploy reads and nobody anything
// else, written as host policies named API tokens before entries said
// their issuer.
const tokenOnlyPolicy = `
callers:
  - name: deploy
    match: {sub: ["token:deploy"]}
    tools: {allow: [read]}
`

// qualifiedPolicy says each entry's issuer: the API token deploy may
// read, the identity provider's user deploy may only list.
const qualifiedPolicy = `
callers:
  - name: token-deploy
    match: {iss: [fleetmcp:api-token], sub: ["token:deploy"]}
    tools: {allow: [read]}
  - name: user-deploy
    match: {iss: ["ISSUER"], sub: [deploy]}
    tools: {allow: [list]}
`

// TestCallerIdentityCollision: a host's policy grants the API token
// deploy what it grants nobody else. A caller who can get tokens from
// the gateway's identity provider with a subject of their choosing
// (a self-service IdP, a federated one) asks for "token:deploy", the
// subject hosts see for the API token, and for spellings near it; the
// gateway's access rules let every provider caller use every tool, so
// only the host's policy stands between them and the token's grant.
// None of them gets it; the API token still does.
func TestCallerIdentityCollision(t *testing.T) {
	is := oidctest.New(t, audience, "key-1")
	rules, err := access.ParseRules("access.yaml", []byte("rules:\n  - name: everyone\n    match: {sub: \"*\"}\n    hosts: [\"*\"]\n    tools: [\"*\"]\n    admin: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	deployToken, line, err := access.NewAPIToken("deploy")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := access.ParseAPITokens("tokens.yaml", []byte("tokens:\n  "+line+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	env := NewEnv(t, Options{Agents: []string{},
		Gateway: func(c *gateway.Config) {
			c.AuthDisabled = false
			c.Auth = access.AuthConfig{Issuer: is.URL(), Audience: audience, KeyRefreshInterval: keyRefresh, APITokens: tokens}
			c.Access = rules
		}})
	// alpha is a fleet-agent process, beta an agent in the test.
	alphaDir, alphaPolicy := t.TempDir(), filepath.Join(t.TempDir(), "alpha-policy.yaml")
	writeFile(t, alphaPolicy, tokenOnlyPolicy)
	writeFile(t, filepath.Join(alphaDir, "deploy-key.txt"), "the deploy key\n")
	env.startAgentProcess("alpha", procSpec{dir: alphaDir, extra: []string{"--policy", alphaPolicy}})
	env.StartAgent("beta", func(c *agent.Config) {
		c.PolicyFile = filepath.Join(c.Cwd, "..", "beta-policy.yaml")
		writeFile(t, c.PolicyFile, strings.ReplaceAll(qualifiedPolicy, "ISSUER", is.URL()))
		writeFile(t, filepath.Join(c.Cwd, "deploy-key.txt"), "the deploy key\n")
	})
	env.WaitHost("alpha", true)
	env.WaitHost("beta", true)
	read := func(host string) map[string]any { return map[string]any{"host": host, "path": "deploy-key.txt"} }

	// The API token deploy reads on both hosts.
	tok := env.ClientAs("", deployToken)
	for _, host := range []string{"alpha", "beta"} {
		if res := call(t, tok, "read", read(host)); res.IsError || !strings.Contains(text(res), "the deploy key") {
			t.Fatalf("the API token deploy reads on %s: %s", host, text(res))
		}
	}

	// The very subject hosts see for the API token: the gateway takes no
	// such token from the identity provider, so no host (whatever its
	// agent's version and however its policy was written) is asked.
	for _, sub := range []string{"token:deploy", "token:deploy ", "token:deploy\u200b", "token:DEPLOY"} {
		forged := is.Token("key-1", is.Claims(sub, nil))
		if code := initializeStatus(t, env.Gateway.MCPURL(), forged); code != http.StatusUnauthorized {
			t.Errorf("a provider token with sub %q: HTTP %d, want 401", sub, code)
		}
		cs, err := env.ClientWith("2025-11-25", BearerClient(forged))
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read", Arguments: read("alpha")})
		cancel()
		if err == nil && !res.IsError {
			t.Fatalf("a provider token with sub %q read the deploy key: %s", sub, text(res))
		}
		t.Errorf("a provider token with sub %q was given a session", sub)
	}

	// Spellings near it reach the hosts as the provider's callers: alpha
	// gives them nothing, beta only what it gives the provider's
	// "deploy".
	for _, sub := range []string{"deploy", "Token:deploy", "TOKEN:DEPLOY", "t\u043eken:deploy", "token\uff1adeploy", " token:deploy", "\u200btoken:deploy"} {
		cs := env.ClientAs("", is.Token("key-1", is.Claims(sub, nil)))
		res := call(t, cs, "read", read("alpha"))
		if !res.IsError || !strings.Contains(text(res), "matches no entry") {
			t.Errorf("sub %q reads on alpha: %s", sub, text(res))
		}
		res = call(t, cs, "read", read("beta"))
		want := "matches no entry"
		if sub == "deploy" {
			want = "callers.user-deploy: tools.allow lists only list"
		}
		if !res.IsError || !strings.Contains(text(res), want) {
			t.Errorf("sub %q reads on beta: %s, want a refusal mentioning %q", sub, text(res), want)
		}
	}
	user := env.ClientAs("", is.Token("key-1", is.Claims("deploy", nil)))
	if res := call(t, user, "list", map[string]any{"host": "beta", "path": "."}); res.IsError {
		t.Errorf("the provider's user deploy lists on beta: %s", text(res))
	}

	// The audit trail tells them apart: "token deploy" is the API
	// token's calls only.
	recs := auditRecords(t, user, map[string]any{"caller": "token deploy", "tool": "read"})
	if len(recs) != 2 {
		t.Errorf("the API token's reads in the audit trail: %d records, want 2", len(recs))
	}
	for _, r := range recs {
		if r.Caller.Kind != string(access.KindAPIToken) || r.Decision != "allowed" {
			t.Errorf("record under \"token deploy\": %+v", r)
		}
	}
}

// initializeStatus posts an MCP initialize with token and returns the
// HTTP status.
func initializeStatus(t *testing.T, url, token string) int {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
