package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// The gateway's own tools: hosts here, audit (audittrail.go), fan-out
// (fanout.go) and the skill rollout tools (skilltools.go). The per-host
// tools are in hosttools.go.

type hostsIn struct {
	Filter string `json:"filter,omitempty" jsonschema:"optional host selector: a name glob (web-*), a label match (role=web, env!=prod, region in (eu,us)), or several joined by commas, all of which must hold"`
}

const (
	descHosts = "List the fleet's hosts you may use: name, online/offline, last seen, OS/arch, agent version, working directory, shell (the language bash commands are written in: bash, sh, pwsh 7.x, powershell 5.1), labels, the tools the host serves and its policy digest. " +
		"Every other tool takes one of these names as host. Optional filter, a host selector: a name glob (web-*), a label match (role=web, env!=prod, region in (eu,us)), or several joined by commas, all of which must hold (role=web,env=prod)."
)

func (g *Gateway) addTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: protocol.ToolHosts, Description: descHosts, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, g.hostsTool)
	mcp.AddTool(s, &mcp.Tool{Name: protocol.ToolAudit, Description: descAudit, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, g.auditTool)
	g.addHostTools(s)
	g.addFanoutTools(s)
	g.addSkillTools(s)
}

// forward sends a per-host tool call to its agent and converts the answer.
func (g *Gateway) forward(ctx context.Context, req *mcp.CallToolRequest, host, tool string, timeout time.Duration) *mcp.CallToolResult {
	cc := callFrom(ctx)
	if cc.id == nil {
		return errorResult(tool + " not permitted for an unauthenticated caller")
	}
	ctx, stop := g.calling.requests.bind(ctx, req)
	defer stop()
	p := newProgress(ctx, req, g.cfg.ProgressIdle)
	args := req.Params.Arguments
	if cc.args != nil {
		args = cc.args.raw // req carries them shrunk (guard)
		// The access rules were applied to the host the guard read; the
		// call goes there or nowhere (arguments that name a host twice
		// may be read either way).
		if hostArg(cc.args.small) != host {
			return errorResult(fmt.Sprintf("%s: the arguments name the host more than once; give host once", tool))
		}
	}
	receipt := &audit.Receipt{}
	res, err := g.calling.router.call(ctx, callRequest{
		ID: cc.callID, Host: host, Tool: tool, Caller: cc.id.Caller(), Args: args, Timeout: timeout, Hold: cc.hold, Receipt: receipt,
	}, p.onFrame)
	if receipt.Verified || receipt.Problem != "" {
		cc.receipt = receipt
	}
	if err != nil {
		cc.outcome = failureOutcome(err)
		return callError(tool, host, err)
	}
	if capResult(host, tool, res, protocol.ResultTextLimit(tool, cc.rawData)) {
		g.calling.agentLogs.Log(g.log, slog.LevelWarn, host, "cut a result larger than its tool's limits", "host", host, "tool", tool, "call", cc.callID)
	}
	if res.Error != nil && res.Error.Code == protocol.CodeDenied {
		cc.hostDenied = res.Error.Message
	}
	return toolResult(host, res)
}

// failureOutcome classifies a routing failure for the audit trail.
func failureOutcome(err error) string {
	var he *HostError
	switch {
	case errors.Is(err, context.Canceled):
		return audit.OutcomeCancelled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &he) && he.Kind == HostTimeout:
		return audit.OutcomeTimedOut
	}
	return audit.OutcomeError
}

func (g *Gateway) hostsTool(ctx context.Context, req *mcp.CallToolRequest, in hostsIn) (*mcp.CallToolResult, any, error) {
	if in.Filter != "" {
		if _, err := policy.ParseSelector(in.Filter); err != nil {
			return errorResult("filter: " + err.Error()), nil, nil
		}
	}
	grants := callFrom(ctx).grants
	hosts := slices.DeleteFunc(g.calling.reg.list(in.Filter), func(h HostInfo) bool { return !grants.HostVisible(h.Host, h.Labels) })
	var b strings.Builder
	online := 0
	for _, h := range hosts {
		if h.Online {
			online++
		}
	}
	fmt.Fprintf(&b, "%d hosts, %d online", len(hosts), online)
	if in.Filter != "" {
		fmt.Fprintf(&b, " (filter %q)", in.Filter)
	}
	b.WriteString("\n")
	now := time.Now()
	for _, h := range hosts {
		state := "online"
		switch {
		case h.Revoked:
			state = "revoked"
		case h.Conflict != "":
			state = "conflict"
		case !h.Online:
			state = "offline"
		}
		fmt.Fprintf(&b, "%s\t%s\t%s/%s\tagent %s\tlast seen %s ago\tcwd %s\tshell %s", h.Host, state, h.OS, h.Arch, h.AgentVersion,
			now.Sub(h.LastSeen).Round(time.Second), h.Cwd, cmp.Or(h.Shell, "unknown"))
		if labels := textutil.FormatLabels(h.Labels); labels != "" {
			b.WriteString("\tlabels " + labels)
		}
		b.WriteString("\ttools " + strings.Join(h.Tools, ","))
		b.WriteString("\tpolicy " + policyLabel(h.PolicyDigest))
		b.WriteString("\tcommands " + confinementLabel(h.Confinement))
		if h.Conflict != "" {
			b.WriteString("\tconflict: " + h.Conflict)
		}
		b.WriteString("\n")
	}
	res := textResult(strings.TrimRight(b.String(), "\n"))
	for i := range hosts {
		hosts[i].PolicyDigest = policyName(hosts[i].PolicyDigest)
	}
	res.StructuredContent = map[string]any{"hosts": hosts}
	return res, nil, nil
}

// policyName is a host's policy digest in full, or "unrestricted" for a
// host without one, as structured results and resources show it.
func policyName(digest string) string { return cmp.Or(digest, "unrestricted") }

// policyLabel shortens a host policy digest for the hosts table (the
// structured output carries it whole); "unrestricted" when there is none.
func policyLabel(digest string) string {
	if digest == "" {
		return "unrestricted"
	}
	if len(digest) > len("sha256:")+16 {
		return digest[:len("sha256:")+16]
	}
	return digest
}

// confinementLabel says whether a host's commands can reach its
// identity: "confined (landlock abi 7)", or "NOT confined (WHY)".
func confinementLabel(c string) string {
	switch {
	case c == "":
		return "NOT confined (the agent does not say: it predates confinement)"
	case strings.HasPrefix(c, "none"):
		return "NOT confined (" + strings.TrimPrefix(strings.TrimPrefix(c, "none"), ": ") + ")"
	}
	return "confined (" + c + ")"
}

// progress relays a call's live output, progress notes and keepalives to
// the client as progress notifications, when the client asked for them
// with a progress token. Whatever the agent sends, a call's notifications
// come at most one per protocol.ProgressInterval (ten a second), each with
// a message of at most protocol.MaxProgressBytes: output is coalesced
// into the latest MaxProgressBytes of it, a progress note replaces what
// is pending, and what arrives between two notifications waits for the
// next (the final result has the output in full). A silent call still
// yields one at least every Config.ProgressIdle, so clients with request
// timeouts keep waiting.
type progress struct {
	ctx     context.Context
	session *mcp.ServerSession
	token   any

	idle    time.Duration
	n       float64
	last    time.Time
	pending []byte // message not sent yet; dirty says whether there is one
	dirty   bool
	started time.Time
}

const progressEvery = protocol.ProgressInterval

func newProgress(ctx context.Context, req *mcp.CallToolRequest, idle time.Duration) *progress {
	p := &progress{ctx: ctx, session: req.Session, started: time.Now(), idle: idle}
	if req.Params != nil {
		p.token = req.Params.GetProgressToken()
	}
	return p
}

// onFrame is called only from the call's own goroutine.
func (p *progress) onFrame(f protocol.Frame) {
	if p.token == nil || p.session == nil {
		return
	}
	now := time.Now()
	switch f.Kind {
	case protocol.KindOutput:
		p.pending = append(p.pending, lastBytes(f.Data, protocol.MaxProgressBytes)...)
		if len(p.pending) > protocol.MaxProgressBytes {
			p.pending = append(p.pending[:0], lastBytes(p.pending, protocol.MaxProgressBytes)...)
		}
		p.dirty = true
	case protocol.KindProgress:
		p.pending = append(p.pending[:0], protocol.Clip(string(f.Data), protocol.MaxProgressBytes)...)
		p.dirty = true
	case protocol.KindKeepalive:
		if !p.dirty && now.Sub(p.last) >= p.idle {
			p.send(now, fmt.Sprintf("still running after %s", now.Sub(p.started).Round(time.Second)))
			return
		}
	default:
		return
	}
	if p.dirty && now.Sub(p.last) >= progressEvery {
		p.send(now, string(p.pending))
	}
}

func (p *progress) send(now time.Time, msg string) {
	p.pending, p.dirty = p.pending[:0], false
	p.last = now
	p.n++
	_ = p.session.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: p.n, Message: msg})
}

// lastBytes returns the end of b, at most n bytes of it starting on a
// UTF-8 character boundary.
func lastBytes(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	cut := len(b) - n
	for cut < len(b) && !utf8.RuneStart(b[cut]) {
		cut++
	}
	return b[cut:]
}
