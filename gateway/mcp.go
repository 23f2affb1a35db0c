package gateway

import (
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Version is the gateway's release version.
const Version = "0.1.0"

const instructions = "fleetmcp controls a fleet of machines. Call hosts first to see the machines; " +
	"every other tool takes a host name. Files: read, write, edit. Commands: bash."

// newMCPServer builds the one MCP server shared by every session; the SDK
// calls getServer on every request, so it must stay cheap.
func (g *Gateway) newMCPServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "fleetmcp", Title: "fleetmcp gateway", Version: Version},
		&mcp.ServerOptions{Instructions: instructions, Logger: g.log.With("component", "mcp")})
	g.addTools(s)
	return s
}

// mcpHandler serves both MCP eras from one URL. A request that carries a
// session ID, or no protocol version at all (an initialize), belongs to the
// 2025 session-based protocol; a request that names 2026-07-28 or later and
// no session is served statelessly, and there a client disconnect cancels
// the call.
func (g *Gateway) mcpHandler(s *mcp.Server) http.Handler {
	getServer := func(*http.Request) *mcp.Server { return s }
	stateful := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		SessionTimeout:      g.cfg.SessionTimeout,
		MaxRequestBodyBytes: g.cfg.MaxRequestBytes,
		Logger:              g.log.With("component", "mcp-http"),
	})
	stateless := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		PropagateRequestCancellation: true,
		MaxRequestBodyBytes:          g.cfg.MaxRequestBytes,
		Logger:                       g.log.With("component", "mcp-http"),
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Session-Id") == "" && r.Header.Get("Mcp-Protocol-Version") >= statelessProtocol {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}

// statelessProtocol is the first MCP version without sessions.
const statelessProtocol = "2026-07-28"
