package integration

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// originTransport sends Origin on every request, as a browser page does,
// and keeps the last response's headers.
type originTransport struct {
	origin, token string
	mu            sync.Mutex
	last          http.Header
}

func (o *originTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Origin", o.origin)
	if o.token != "" {
		r.Header.Set("Authorization", "Bearer "+o.token)
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil {
		o.mu.Lock()
		o.last = resp.Header.Clone()
		o.mu.Unlock()
	}
	return resp, err
}

func (o *originTransport) header() http.Header {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last
}

func preflight(t *testing.T, url, origin string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodOptions, url, nil)
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "authorization, content-type, mcp-session-id, mcp-protocol-version")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// --cors_origins: a listed origin's preflight is answered and its
// responses are readable with the MCP headers exposed, through a whole
// MCP session; any other origin's preflight is refused and its responses
// carry no CORS headers; authentication is unchanged for everyone.
func TestCORSOrigins(t *testing.T) {
	const app, evil = "https://app.example.com", "https://evil.example"
	token, line, err := access.NewAPIToken("web")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := access.ParseAPITokens("tokens.yaml", []byte("tokens:\n  "+line+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) {
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{APITokens: tokens}
		c.CORSOrigins = []string{app, "http://localhost:6274"}
	}})
	url := env.Gateway.MCPURL()

	resp := preflight(t, url, app)
	h := resp.Header
	if resp.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != app ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "Mcp-Session-Id") || !strings.Contains(h.Get("Access-Control-Allow-Headers"), "MCP-Protocol-Version") ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), "Authorization") || !strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") {
		t.Fatalf("preflight of %s: %d %v", app, resp.StatusCode, h)
	}
	resp = preflight(t, url, evil)
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight of %s: %d %v", evil, resp.StatusCode, resp.Header)
	}

	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			tr := &originTransport{origin: app, token: token}
			cs, err := env.ClientWith(era.Version, &http.Client{Transport: tr})
			if err != nil {
				t.Fatal(err)
			}
			mustOK(t, call(t, cs, "hosts", nil))
			h := tr.header()
			if h.Get("Access-Control-Allow-Origin") != app || !strings.Contains(h.Get("Access-Control-Expose-Headers"), "Mcp-Session-Id") ||
				!strings.Contains(h.Get("Access-Control-Expose-Headers"), "MCP-Protocol-Version") {
				t.Errorf("response to %s: %v", app, h)
			}
			other := &originTransport{origin: evil, token: token}
			cs, err = env.ClientWith(era.Version, &http.Client{Transport: other})
			if err != nil {
				t.Fatal(err)
			}
			mustOK(t, call(t, cs, "hosts", nil))
			if got := other.header().Get("Access-Control-Allow-Origin"); got != "" {
				t.Errorf("response to %s allows origin %q", evil, got)
			}
		})
	}

	// A listed origin without a token is refused as anyone is; its page
	// may read why.
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Origin", app)
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Access-Control-Allow-Origin") != app || resp.Header.Get("WWW-Authenticate") == "" ||
		!strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "WWW-Authenticate") {
		t.Fatalf("unauthenticated request from %s: %d %v", app, resp.StatusCode, resp.Header)
	}
}

// Without --cors_origins no origin gets CORS headers, and on a loopback
// gateway without authentication a listed origin does not get past the
// DNS-rebinding check on Host.
func TestCORSDefaultAndHostCheck(t *testing.T) {
	env := NewEnv(t)
	resp := preflight(t, env.Gateway.MCPURL(), "https://app.example.com")
	if resp.StatusCode == http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight without --cors_origins: %d %v", resp.StatusCode, resp.Header)
	}
	listed := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.CORSOrigins = []string{"https://app.example.com"} }})
	req, _ := http.NewRequest(http.MethodPost, listed.Gateway.MCPURL(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Host = "rebound.example.com"
	req.Header.Set("Origin", "https://app.example.com")
	req.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusForbidden {
		t.Fatalf("request with a foreign Host from a listed origin: %d, want 403", r.StatusCode)
	}
}
