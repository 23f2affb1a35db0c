package gateway

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// This file makes the gateway's spans (Config.TracerProvider): one per
// tools/call, a child of the trace context the MCP client sent, and one
// per call routed to a host, whose context goes to the agent in the
// call's headers (protocol.SetTrace). A fan-out's span is the parent of
// one host-call span per host it called.

// tracing makes spans; nil when tracing is off, and then every use costs
// a nil check and nothing else.
type tracing struct {
	tracer trace.Tracer
	// w3c reads and writes W3C trace context; baggage is not carried:
	// what a client puts there is not passed on to the hosts.
	w3c propagation.TraceContext
}

func newTracing(tp trace.TracerProvider) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer("github.com/fleetmcp/fleetmcp/gateway", trace.WithInstrumentationVersion(Version))}
}

// Span attributes. The caller is its subject, as the audit trail names
// it; arguments are never recorded.
const (
	attrTool     = attribute.Key("fleet.tool")
	attrHost     = attribute.Key("fleet.host")
	attrCaller   = attribute.Key("fleet.caller")
	attrCallID   = attribute.Key("fleet.call_id")
	attrDecision = attribute.Key("fleet.decision")
	attrRule     = attribute.Key("fleet.rule")
	attrOutcome  = attribute.Key("fleet.outcome")
	attrHosts    = attribute.Key("fleet.fanout.hosts")
	attrFanout   = "fleet.fanout." // + bucket: hosts per outcome
)

// startCall starts the span of a tools/call. Its parent is the trace
// context in the request's _meta (traceparent, tracestate: where the MCP
// conventions put it), else in the HTTP request's traceparent header.
func (t *tracing) startCall(ctx context.Context, req *mcp.CallToolRequest) (context.Context, trace.Span) {
	if t == nil {
		return ctx, noop.Span{}
	}
	parent := ctx
	if req.Extra != nil && req.Extra.Header != nil {
		parent = t.w3c.Extract(parent, propagation.HeaderCarrier(req.Extra.Header))
	}
	if meta := req.Params.GetMeta(); meta != nil {
		mc := propagation.MapCarrier{}
		for _, k := range []string{protocol.HeaderTraceParent, protocol.HeaderTraceState} {
			if s, ok := meta[k].(string); ok {
				mc[k] = s
			}
		}
		parent = t.w3c.Extract(parent, mc)
	}
	return t.tracer.Start(parent, "tools/call "+req.Params.Name, trace.WithSpanKind(trace.SpanKindServer))
}

// endCall records a tools/call's decision and outcome on its span, and
// ends it.
func endCall(span trace.Span, rec *audit.Record) {
	if span.IsRecording() {
		span.SetAttributes(attrTool.String(rec.Tool), attrCaller.String(rec.Caller.Subject), attrCallID.String(rec.CallID),
			attrDecision.String(rec.Decision), attrOutcome.String(rec.Outcome))
		if len(rec.Hosts) == 1 {
			span.SetAttributes(attrHost.String(rec.Hosts[0]))
		}
		if rec.Rule != "" {
			span.SetAttributes(attrRule.String(rec.Rule))
		}
		if rec.Fanout != nil {
			n := 0
			for bucket, c := range rec.Fanout {
				span.SetAttributes(attribute.Int(attrFanout+bucket, c))
				n += c
			}
			span.SetAttributes(attrHosts.Int(n))
		}
		if rec.Outcome != audit.OutcomeOK {
			span.SetStatus(codes.Error, rec.Outcome)
		}
	}
	span.End()
}

// startHostCall starts the span of one call routed to a host, and
// returns the trace headers that carry it to the agent (empty when
// tracing is off or the span is not sampled: the agent then makes none).
func (t *tracing) startHostCall(ctx context.Context, req *callRequest) (context.Context, trace.Span, propagation.MapCarrier) {
	if t == nil {
		return ctx, noop.Span{}, nil
	}
	ctx, span := t.tracer.Start(ctx, "fleet.call "+req.Tool, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrTool.String(req.Tool), attrHost.String(req.Host), attrCaller.String(req.Caller.Subject), attrCallID.String(req.ID)))
	mc := propagation.MapCarrier{}
	t.w3c.Inject(ctx, mc)
	return ctx, span, mc
}

// endHostCall records how a routed call ended, and ends its span.
func endHostCall(span trace.Span, res *protocol.Result, err error) {
	if span.IsRecording() {
		outcome := hostCallOutcome(res, err)
		span.SetAttributes(attrOutcome.String(outcome))
		if outcome != audit.OutcomeOK {
			span.SetStatus(codes.Error, outcome)
		}
	}
	span.End()
}

// hostCallOutcome names how a routed call ended: ok, tool_error (the
// tool ran and failed), the agent's error code (denied, busy, ...), or
// the routing failure (offline, timed_out, silent, cancelled, ...).
func hostCallOutcome(res *protocol.Result, err error) string {
	var he *HostError
	switch {
	case errors.As(err, &he):
		return hostErrorName(he.Kind)
	case errors.Is(err, context.Canceled):
		return audit.OutcomeCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return audit.OutcomeTimedOut
	case err != nil:
		return audit.OutcomeError
	case res.Error != nil:
		return string(res.Error.Code)
	case res.IsError:
		return "tool_error"
	}
	return audit.OutcomeOK
}

func hostErrorName(k HostErrorKind) string {
	switch k {
	case HostUnknown:
		return "unknown_host"
	case HostOffline:
		return "offline"
	case HostSilent:
		return "silent"
	case HostTimeout:
		return audit.OutcomeTimedOut
	case HostConflict:
		return "conflict"
	case HostGone:
		return "not_connected"
	case HostBusy:
		return "busy"
	case HostRevoked:
		return "revoked"
	}
	return "unreachable"
}

// traceHeaders returns the headers that carry mc to the agent.
func traceHeaders(mc propagation.MapCarrier) (traceparent, tracestate string) {
	return mc[protocol.HeaderTraceParent], mc[protocol.HeaderTraceState]
}
