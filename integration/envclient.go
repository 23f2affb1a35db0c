package integration

import (
	"context"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// The MCP clients of an Env: to its gateway or another, with or without
// a bearer token.

// Client connects an MCP client speaking protocol version (empty: the
// SDK's latest, the stateless 2026 era).
func (e *Env) Client(version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	e.t.Helper()
	return e.ClientTo(e.Gateway, version, opts)
}

// ClientTo is Client for another gateway replica.
func (e *Env) ClientTo(gw *gateway.Gateway, version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	e.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: gw.MCPURL(), DisableStandaloneSSE: true},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		e.t.Fatalf("connect MCP client (%q): %v", version, err)
	}
	e.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// ClientWith connects an MCP client whose HTTP requests go through hc
// (for example one that adds an Authorization header). It returns the
// connection error, so that tests can expect a refusal.
func (e *Env) ClientWith(version string, hc *http.Client) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: e.Gateway.MCPURL(), HTTPClient: hc, DisableStandaloneSSE: true},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, err
	}
	e.t.Cleanup(func() { _ = cs.Close() })
	return cs, nil
}

// ClientAs connects an MCP client that sends token as its bearer token.
func (e *Env) ClientAs(version, token string) *mcp.ClientSession {
	e.t.Helper()
	cs, err := e.ClientWith(version, BearerClient(token))
	if err != nil {
		e.t.Fatalf("connect MCP client with a bearer token (%q): %v", version, err)
	}
	return cs
}

// BearerClient returns an HTTP client that sends token in the
// Authorization header of every request.
func BearerClient(token string) *http.Client {
	return &http.Client{Transport: BearerTransport(token, http.DefaultTransport)}
}

// BearerTransport sends token in the Authorization header of every
// request it passes to base.
func BearerTransport(token string, base http.RoundTripper) http.RoundTripper {
	return bearerTransport{token: token, base: base}
}

type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
