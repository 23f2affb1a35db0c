package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// This file is the MCP server middleware that applies the access rules
// and keeps the audit trail: tools/list shows each caller only the tools
// it may use, and every tools/call is decided here, before its handler
// runs, and recorded once it has finished.

// callContext is what the guard hands a tool handler.
type callContext struct {
	id     *access.Identity
	grants *access.Grants
	callID string
	// outcome is set by forward for failures a result does not show
	// (timed out, cancelled); empty: judged from the result.
	outcome string
	// hostDenied is set by forward when the host's own policy refused
	// the call: the decision was made on the host, not by a rule here.
	hostDenied string
	// fanout is set by a fan-out tool: its hosts per outcome bucket.
	fanout map[string]int
	// background is set for a bash call that starts a background task:
	// its result has no exit code.
	background bool
	// rawData is set for a read with binary_base64: its text is the
	// file's data, bounded by the result limit alone.
	rawData bool
	// args are a per-host tool's arguments: the handler sees them
	// shrunk, forward sends them as the client did.
	args *callArgs
	// hold keeps what the call's result holds of the transfer budget
	// until the response carrying it is written (nil: until the call
	// returns).
	hold *transferHold
	// receipt is the host's receipt of a per-host tool's result, as
	// checked (nil: no result came).
	receipt *audit.Receipt
	// records are the tickets of the records a fan-out wrote for its
	// hosts: the call is answered once they are stored too.
	recordsMu sync.Mutex
	records   []*audit.Ticket
}

// recorded adds the ticket of a record the call wrote besides its own.
func (cc *callContext) recorded(t *audit.Ticket) {
	cc.recordsMu.Lock()
	cc.records = append(cc.records, t)
	cc.recordsMu.Unlock()
}

type callContextKey struct{}

// identityOf returns the caller of an MCP request: the authenticated
// identity, or the local caller when authentication is off. With
// authentication on and no identity (which the HTTP middleware prevents)
// it returns nil, and the caller gets nothing.
func (g *Gateway) identityOf(extra *mcp.RequestExtra) *access.Identity {
	if g.cfg.AuthDisabled {
		return access.LocalIdentity()
	}
	if extra == nil {
		return nil
	}
	return access.FromTokenInfo(extra.TokenInfo)
}

// perHostTool reports whether tool acts on one host (and takes "host").
func perHostTool(tool string) bool {
	_, ok := protocol.HostTool(tool)
	return ok
}

func withCall(ctx context.Context, cc *callContext) context.Context {
	return context.WithValue(ctx, callContextKey{}, cc)
}

// callFrom returns the guard's context of a call; a handler reached
// without the guard sees a caller with no grants.
func callFrom(ctx context.Context) *callContext {
	if cc, ok := ctx.Value(callContextKey{}).(*callContext); ok {
		return cc
	}
	return &callContext{grants: (*access.Rules)(nil).For(nil), callID: newCallID()}
}

// guard is the receiving middleware of the MCP server. Resource reads
// check access in their own handlers.
func (g *Gateway) guard(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch r := req.(type) {
		case *mcp.ListToolsRequest:
			return g.listTools(ctx, method, r, next)
		case *mcp.CallToolRequest:
			return g.callTool(ctx, method, r, next)
		case *mcp.ReadResourceRequest:
			// A host URI the templates do not match (a host ID with
			// characters they refuse) still gets an error naming the
			// problem, not a bare "not found".
			if r.Params != nil && strings.HasPrefix(r.Params.URI, hostsPrefix) {
				if _, _, err := parseHostURI(r.Params.URI); err != nil {
					return nil, err
				}
			}
		}
		return next(ctx, method, req)
	}
}

// listTools filters tools/list by the caller's grants. The answer depends
// on the caller, so clients may cache it only privately.
func (g *Gateway) listTools(ctx context.Context, method string, req *mcp.ListToolsRequest, next mcp.MethodHandler) (mcp.Result, error) {
	res, err := next(ctx, method, req)
	list, ok := res.(*mcp.ListToolsResult)
	if err != nil || !ok {
		return res, err
	}
	grants := g.subsys.access.Load().For(g.identityOf(req.Extra))
	list.Tools = slices.DeleteFunc(slices.Clone(list.Tools), func(t *mcp.Tool) bool { return !grants.ToolVisible(t.Name) })
	list.CacheScope = "private"
	return list, nil
}

// callTool decides a tool call, runs it when allowed, and records it.
func (g *Gateway) callTool(ctx context.Context, method string, req *mcp.CallToolRequest, next mcp.MethodHandler) (mcp.Result, error) {
	if !g.calling.calls.begin() {
		return errorResult(fmt.Sprintf("%s was not run: this gateway is shutting down; retry through another gateway, or once it is back", req.Params.Name)), nil
	}
	defer g.calling.calls.end()
	start := time.Now()
	ctx, span := g.calling.tracing.startCall(ctx, req)
	id := g.identityOf(req.Extra)
	cc := &callContext{id: id, grants: g.subsys.access.Load().For(id), callID: newCallID()}
	tool := req.Params.Name
	host := ""
	if perHostTool(tool) {
		// The handler decodes and validates the shrunk arguments; only
		// forward needs them in full. Those of a large request were
		// shrunk before the SDK saw them (transfer.go).
		rs := g.calling.transfers.stateOf(req)
		if rs != nil {
			cc.args, cc.hold = rs.args, &rs.hold
		}
		if cc.args == nil {
			cc.args = shrinkArgs(req.Params.Arguments)
		}
		host = hostArg(cc.args.small)
	}
	rec := g.newRecord(start, cc, req, host)
	dec, refusal := g.decide(cc, tool, host)
	if dec.Allowed {
		dec, refusal = g.rateCheck(cc, start, dec)
	}
	rec.Rule, rec.Reason = dec.Rule, dec.Reason
	var res mcp.Result
	var err error
	// Nothing runs that the audit trail cannot record (gateway/audit).
	var aerr error
	if dec.Allowed {
		aerr = g.subsys.audit.Ready(ctx)
	}
	switch {
	case aerr != nil:
		rec.Decision, rec.Outcome, rec.Reason = audit.DecisionAllowed, audit.OutcomeRefused, "audit trail unavailable"
		res = errorResult(fmt.Sprintf("%s was not run: the gateway cannot record it in the audit trail now (%v); retry in a few seconds, or through another gateway", tool, aerr))
	case dec.Allowed:
		rec.Decision = audit.DecisionAllowed
		res, err = next(withCall(ctx, cc), method, withArgs(req, cc.args))
	default:
		rec.Decision, rec.Outcome = audit.DecisionDenied, audit.OutcomeRefused
		res = errorResult(refusal)
	}
	g.finishRecord(rec, cc, res, err)
	if cc.hostDenied != "" {
		rec.Decision, rec.Outcome = audit.DecisionDenied, audit.OutcomeRefused
		rec.Rule, rec.Reason = "host policy", cc.hostDenied
	}
	if rec.Decision == audit.DecisionDenied {
		g.log.Info("tool call refused", "caller", rec.Caller.Subject, "tool", tool, "host", host, "rule", rec.Rule, "reason", rec.Reason, "call", rec.CallID)
	}
	rec.Fanout = cc.fanout
	rec.Receipt = cc.receipt
	endCall(span, rec)
	g.serving.metrics.observeCall(rec, time.Since(start), cc.fanout)
	ticket := g.subsys.audit.Write(rec)
	if aerr != nil {
		return res, err // stored once the stream is back
	}
	// The answer goes out once the call's records are stored.
	cc.recordsMu.Lock()
	tickets := append(cc.records, ticket)
	cc.recordsMu.Unlock()
	if serr := g.subsys.audit.WaitStored(ctx, tickets...); serr != nil {
		g.log.Error("tool call answered with an error: its audit record is not stored yet", "call", rec.CallID, "tool", tool, "host", host,
			"caller", rec.Caller.Subject, "outcome", rec.Outcome, "err", serr)
		return errorResult(withheldMessage(rec, host, serr)), nil
	}
	return res, err
}

// withheldMessage tells the client of a call whose record is not stored
// that the call ran, and that its result is withheld.
func withheldMessage(rec *audit.Record, host string, err error) string {
	where := ""
	if host != "" {
		where = " on " + host
	}
	return fmt.Sprintf("%s ran%s (outcome: %s) but the gateway could not store its audit record (%v), so its result is withheld. "+
		"The record is stored once the audit trail is back. The call's effects stand: check them before running it again. Call ID %s.",
		rec.Tool, where, rec.Outcome, err, rec.CallID)
}

// withArgs returns req with its arguments replaced by args' shrunk form
// (req itself when args is nil).
func withArgs(req *mcp.CallToolRequest, args *callArgs) *mcp.CallToolRequest {
	if args == nil || req.Params == nil {
		return req
	}
	r, p := *req, *req.Params
	p.Arguments = args.small
	r.Params = &p
	return &r
}

// hostArg reads the host argument of a per-host tool ("" when absent or
// not a string; the tool's own validation then reports it).
func hostArg(raw json.RawMessage) string {
	var args struct {
		Host any `json:"host"`
	}
	if json.Unmarshal(raw, &args) != nil {
		return ""
	}
	h, _ := args.Host.(string)
	return h
}

// decide applies the access rules to a call. A refused call gets a tool
// error that names the caller and, for a host the caller may see, the
// host; a host it may not see gets the unknown-host answer.
func (g *Gateway) decide(cc *callContext, tool, host string) (access.Decision, string) {
	who := "an unauthenticated caller"
	if cc.id != nil {
		who = cc.id.Name()
	}
	gr := cc.grants
	switch {
	case cc.id == nil:
		return access.DeniedBy("", "no authenticated caller"), tool + " not permitted for " + who
	case protocol.IsAdminTool(tool):
		d := gr.Admin()
		return d, fmt.Sprintf("%s not permitted for %s: admin tools need an access rule with admin: true", tool, who)
	case tool == protocol.ToolHosts:
		if gr.ToolVisible(tool) {
			return access.AllowedBy(""), ""
		}
		return access.DeniedBy("", "no access rule grants any host"), fmt.Sprintf("hosts not permitted for %s: no access rule grants you any host", who)
	case protocol.FanoutBase(tool) != "":
		// Each host is decided by the fan-out itself (fanout.go).
		if gr.ToolVisible(tool) {
			return access.AllowedBy(""), ""
		}
		return access.DeniedBy("", "no access rule grants "+protocol.FanoutBase(tool)), fmt.Sprintf("%s not permitted for %s: no access rule grants %s on any host", tool, who, protocol.FanoutBase(tool))
	case !perHostTool(tool):
		// Not a tool of this gateway: the SDK answers that.
		return access.AllowedBy(""), ""
	case !gr.ToolVisible(tool):
		return access.DeniedBy("", "no access rule grants "+tool), fmt.Sprintf("%s not permitted for %s", tool, who)
	case protocol.ValidateHost(host) != nil:
		// Reaches no host: the tool reports the bad argument.
		return access.AllowedBy(""), ""
	}
	h, ok := g.calling.reg.get(host)
	switch {
	case !ok:
		// Refused here, not left to the router: a host that announces
		// itself while the call is on its way must not escape the rules.
		return access.DeniedBy("", "unknown host"), unknownHost(host).Msg
	case !gr.HostVisible(host, h.Labels):
		return access.DeniedBy("", "host not visible to the caller: no rule grants any tool on it"), unknownHost(host).Msg
	}
	d := gr.Tool(tool, host, h.Labels)
	if d.Allowed {
		return d, ""
	}
	msg := fmt.Sprintf("%s not permitted for %s on %s", tool, who, host)
	if d.Rule != "" {
		msg += " (refused by rule " + d.Rule + ")"
	}
	return d, msg
}

// rateCheck takes the call from the caller's rate-limit bucket. Over the
// limit, the call is refused with a message that says when to retry.
func (g *Gateway) rateCheck(cc *callContext, now time.Time, dec access.Decision) (access.Decision, string) {
	rd := cc.grants.RateLimit(g.cfg.RateLimit)
	// One bucket per caller as hosts know it, issuer and subject: the
	// API token deploy and a provider's user "deploy" are two callers.
	ok, wait := g.calling.rates.Allow(cc.id.Qualified(), rd.Limit, now)
	if ok {
		return dec, ""
	}
	from := "the gateway's default"
	if rd.Rule != "" {
		from = rd.Rule
	}
	g.serving.metrics.rateLimited.Inc()
	secs := math.Ceil(wait.Seconds()*10) / 10
	return access.DeniedBy(rd.Rule, "rate limit"), fmt.Sprintf("rate limit reached: %s may make %s (%s); retry in %.1f s", cc.id.Name(), rd.Limit, from, secs)
}

// newRecord starts the audit record of a call.
func (g *Gateway) newRecord(start time.Time, cc *callContext, req *mcp.CallToolRequest, host string) *audit.Record {
	raw := req.Params.Arguments
	if cc.args != nil {
		raw = cc.args.raw
	}
	rec := &audit.Record{
		Time:    start.UTC(),
		CallID:  cc.callID,
		Tool:    req.Params.Name,
		BytesIn: len(raw),
	}
	// Small arguments are summarised by the audit writer, off the call's
	// path; large ones (file contents) here, so the queue never holds them.
	switch {
	case len(raw) <= maxQueuedArgs:
		rec.RawArgs = raw
	case cc.args != nil:
		rec.Args = audit.ShrunkArgsSummary(cc.args.small, cc.args.sizes)
	default:
		rec.Args = audit.ArgsSummary(raw)
	}
	if host != "" {
		rec.Hosts = []string{host}
	}
	if id := cc.id; id != nil {
		rec.Caller = audit.Caller{Kind: string(id.Kind), Subject: id.Subject, Email: id.Email, ClientID: id.ClientID}
		rec.ProjectID = id.ProjectID
	}
	meta := req.Params.GetMeta()
	rec.ExecutionID = metaString(meta, "execution_id")
	rec.WorkspaceID = metaString(meta, "workspace_id")
	return rec
}

// maxQueuedArgs bounds the raw arguments a queued audit record may hold, so
// the queue holds at most auditQueueLen (gateway/audit) × 8 KiB of them.
const maxQueuedArgs = 8 << 10

func metaString(meta map[string]any, key string) string {
	s, _ := meta[key].(string)
	return textutil.Truncate(s, 200)
}

// finishRecord fills in the outcome of a call.
func (g *Gateway) finishRecord(rec *audit.Record, cc *callContext, res mcp.Result, err error) {
	rec.DurationMS = time.Since(rec.Time).Milliseconds()
	if err != nil {
		rec.Outcome, rec.Error = audit.OutcomeError, audit.LastLine(err.Error())
		return
	}
	cr, ok := res.(*mcp.CallToolResult)
	if !ok || cr == nil {
		return
	}
	// The error line and a command's status line are at the end: a
	// large result's text is not copied for them.
	text := resultTail(cr, 64<<10)
	rec.BytesOut = resultBytes(cr)
	if rec.Outcome == audit.OutcomeRefused {
		return
	}
	rec.Outcome = audit.OutcomeOK
	if cr.IsError {
		rec.Outcome = audit.OutcomeError
		rec.Error = audit.LastLine(text)
	}
	if rec.Tool == protocol.ToolBash && !cc.background {
		g.bashStatus(rec, cr.IsError, text)
	}
	if cc.outcome != "" {
		rec.Outcome = cc.outcome
	}
}

// bashStatus reads a bash result's exit code from its status line (the
// result contract ends a failed command's text with it).
func (g *Gateway) bashStatus(rec *audit.Record, isError bool, text string) {
	if !isError {
		zero := 0
		rec.ExitCode = &zero
		return
	}
	last := text[strings.LastIndexByte(strings.TrimRight(text, "\n"), '\n')+1:]
	if code, ok := strings.CutPrefix(strings.TrimSpace(last), "Command exited with code "); ok {
		if n, err := strconv.Atoi(code); err == nil {
			rec.ExitCode = &n
		}
	} else if strings.HasPrefix(last, "Command timed out after ") {
		rec.Outcome = audit.OutcomeTimedOut
	}
}

// resultTail returns the last n bytes (at most) of res's text contents
// joined.
func resultTail(res *mcp.CallToolResult, n int) string {
	var parts []string
	for i := len(res.Content) - 1; i >= 0 && n > 0; i-- {
		t, ok := res.Content[i].(*mcp.TextContent)
		if !ok {
			continue
		}
		s := t.Text
		if len(s) > n {
			s = s[len(s)-n:]
		}
		parts = append(parts, s)
		n -= len(s)
	}
	slices.Reverse(parts)
	return strings.Join(parts, "")
}

func resultBytes(res *mcp.CallToolResult) int {
	n := 0
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.TextContent:
			n += len(c.Text)
		case *mcp.ImageContent:
			n += len(c.Data)
		}
	}
	if res.StructuredContent != nil {
		if data, err := json.Marshal(res.StructuredContent); err == nil {
			n += len(data)
		}
	}
	return n
}

// callCount counts the tool calls in progress. Once drain was called it
// takes no new ones: a call that would start while the gateway shuts
// down is refused, not left running past the audit trail's last write.
type callCount struct {
	mu       sync.Mutex
	n        int
	draining bool
	idle     chan struct{} // closed once draining and no call is left
}

// begin counts a call in; false once draining.
func (c *callCount) begin() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.draining {
		return false
	}
	c.n++
	return true
}

// end counts a call out.
func (c *callCount) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n == 0 && c.draining {
		close(c.idle)
	}
}

// drain stops new calls and returns a channel closed once no call is left.
func (c *callCount) drain() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.draining {
		c.draining, c.idle = true, make(chan struct{})
		if c.n == 0 {
			close(c.idle)
		}
	}
	return c.idle
}
