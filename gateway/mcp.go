package gateway

import (
	"context"
	"crypto/rand"
	"net/http"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Version is the gateway's release version, as MCP clients see it. The
// binary sets it from its build; a development build keeps this one.
var Version = "0.1.0"

const instructions = "fleetmcp controls a fleet of machines. Call hosts first to see the machines; " +
	"the per-host tools take a host name. Files: read, list, search, write, edit, patch, delete, move. Commands: bash; long ones with background: true, " +
	"then task_status (waits for the end), task_cancel, task_list. Skills: skill. " +
	"Many hosts at once, picked by a selector: fleet_bash, fleet_read. " +
	"Resources: resource://hosts, resource://skills and resource://system-prompt (a full system prompt for this fleet)."

// newMCPServer builds the one MCP server shared by every session; the SDK
// calls getServer on every request, so it must stay cheap.
func (g *Gateway) newMCPServer() *mcp.Server {
	opts := &mcp.ServerOptions{Instructions: instructions, Logger: sdkLogger(g.log, "mcp")}
	if name := g.cfg.Name; name != "" {
		// A load balancer in front of several gateways sends a session's
		// requests to the one that made it by this prefix (deploy/proxy).
		opts.GetSessionID = func() string { return name + "." + rand.Text() }
	}
	if g.serving.skills != nil {
		opts.Capabilities = skillsCapabilities()
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "fleetmcp", Title: "fleetmcp gateway", Version: Version}, opts)
	g.addTools(s)
	g.addResources(s)
	if g.serving.skills != nil {
		g.addSkills(s)
	}
	s.AddReceivingMiddleware(g.guard)
	return s
}

// mcpHandler serves both MCP eras from one URL. A request that carries a
// session ID, or no protocol version at all (an initialize), belongs to the
// 2025 session-based protocol; a request that names 2026-07-28 or later and
// no session is served statelessly, and there a client disconnect cancels
// the call.
//
// The SDK refuses requests that reach a loopback address with a foreign
// Host header, against DNS rebinding. That guards an endpoint without
// authentication; with bearer tokens a rebinding page has no token, and
// the guard would refuse a TLS proxy on the same machine, so it is off.
func (g *Gateway) mcpHandler(s *mcp.Server) http.Handler {
	getServer := func(*http.Request) *mcp.Server { return s }
	authOn := !g.cfg.AuthDisabled
	stateful := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		SessionTimeout:             g.cfg.SessionTimeout,
		MaxRequestBodyBytes:        g.cfg.MaxRequestBytes,
		Logger:                     sdkLogger(g.log, "mcp-http"),
		DisableLocalhostProtection: authOn,
	})
	stateless := mcp.NewStreamableHTTPHandler(getServer, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		PropagateRequestCancellation: true,
		MaxRequestBodyBytes:          g.cfg.MaxRequestBytes,
		Logger:                       sdkLogger(g.log, "mcp-http"),
		DisableLocalhostProtection:   authOn,
	})
	dispatch := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Session-Id") == "" && r.Header.Get("Mcp-Protocol-Version") >= statelessProtocol {
			stateless.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodPost {
			id := g.calling.requests.add(r.Context())
			defer g.calling.requests.remove(id)
			r.Header.Set(requestHeader, id)
		}
		stateful.ServeHTTP(w, r)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only the gateway sets this header: a client must not name
		// another request's context.
		r.Header.Del(requestHeader)
		// Large requests wait for room in the transfer budget (transfer.go).
		g.admit(w, r, dispatch, g.cfg.MaxRequestBytes)
	})
}

// requestHeader carries, inside the gateway only, the ID under which a
// session-based POST's HTTP context is registered.
const requestHeader = "X-Fleet-Request"

// requestContexts lets a tool handler of a session-based (2025) request see
// the HTTP request that carried it. The SDK detaches handlers from that
// request so that streams can be resumed; the gateway keeps no event store,
// so a client that disconnects can never collect the result, and its call is
// cancelled instead of left running.
type requestContexts struct {
	mu   sync.Mutex
	next uint64
	ctxs map[string]context.Context
}

func (rc *requestContexts) add(ctx context.Context) string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.next++
	id := strconv.FormatUint(rc.next, 36)
	if rc.ctxs == nil {
		rc.ctxs = make(map[string]context.Context)
	}
	rc.ctxs[id] = ctx
	return id
}

func (rc *requestContexts) remove(id string) {
	rc.mu.Lock()
	delete(rc.ctxs, id)
	rc.mu.Unlock()
}

// bind returns ctx, additionally cancelled when the HTTP request that
// carried req ends. The returned stop function must be called.
func (rc *requestContexts) bind(ctx context.Context, req *mcp.CallToolRequest) (context.Context, func()) {
	if req.Extra == nil || req.Extra.Header == nil {
		return ctx, func() {}
	}
	rc.mu.Lock()
	httpCtx := rc.ctxs[req.Extra.Header.Get(requestHeader)]
	rc.mu.Unlock()
	if httpCtx == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(httpCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// statelessProtocol is the first MCP version without sessions.
const statelessProtocol = "2026-07-28"
