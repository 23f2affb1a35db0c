package agent

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file makes the agent's spans (Config.TracerProvider). A call whose
// headers carry a trace context (protocol.Trace) gets a span as the
// gateway's child, covering the call from its arrival to its result,
// with two children: the host policy's decision on the tool, and the
// tool's work (path and command rules are checked there, as the tool
// meets them). A call without one gets no span: the gateway had tracing
// off, or did not sample it.

// tracing makes spans; nil when tracing is off, and then every use costs
// a nil check and nothing else.
type tracing struct {
	tracer trace.Tracer
	w3c    propagation.TraceContext
}

func newTracing(tp trace.TracerProvider) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{tracer: tp.Tracer("github.com/fleetmcp/fleetmcp/agent", trace.WithInstrumentationVersion(Version))}
}

// Span attributes, named as the gateway names them.
const (
	attrTool     = attribute.Key("fleet.tool")
	attrHost     = attribute.Key("fleet.host")
	attrCaller   = attribute.Key("fleet.caller")
	attrCallID   = attribute.Key("fleet.call_id")
	attrDecision = attribute.Key("fleet.decision")
	attrOutcome  = attribute.Key("fleet.outcome")
	attrPolicy   = attribute.Key("fleet.policy_digest")
)

// remote returns a context whose parent is the trace context of a call's
// headers; nil when tracing is off or they carry none (or a malformed
// one).
func (t *tracing) remote(h protocol.Header) context.Context {
	if t == nil {
		return nil
	}
	traceparent, tracestate := protocol.Trace(h)
	if traceparent == "" {
		return nil
	}
	ctx := t.w3c.Extract(context.Background(), propagation.MapCarrier{
		protocol.HeaderTraceParent: traceparent, protocol.HeaderTraceState: tracestate,
	})
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	return ctx
}

// startServe starts the span of a call, the child of parent (from
// remote); without a parent it is a span that records nothing.
func (t *tracing) startServe(parent context.Context, call *protocol.Call, host string) trace.Span {
	if t == nil || parent == nil {
		return noop.Span{}
	}
	_, span := t.tracer.Start(parent, "fleet.serve "+call.Tool, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrTool.String(call.Tool), attrHost.String(host), attrCaller.String(call.Caller.Subject), attrCallID.String(call.ID)))
	return span
}

// child starts a span named name+suffix under parent's; it records
// nothing when parent's does not (nor is the name put together).
func (t *tracing) child(parent trace.Span, name, suffix string) trace.Span {
	if t == nil || parent == nil || !parent.IsRecording() {
		return noop.Span{}
	}
	_, span := t.tracer.Start(trace.ContextWithSpan(context.Background(), parent), name+suffix)
	return span
}

// endPolicy records the host policy's decision on a call's tool.
func endPolicy(span trace.Span, decision, digest string) {
	if span.IsRecording() {
		span.SetAttributes(attrDecision.String(decision), attrPolicy.String(digest))
		if decision != "allowed" {
			span.SetStatus(codes.Error, decision)
		}
	}
	span.End()
}

// endSpan records how a call (or its tool's work) ended: ok, tool_error
// (the tool ran and failed) or the error code of a call that could not
// be carried out; outcome, when set, says it instead.
func endSpan(span trace.Span, res *protocol.Result, outcome string) {
	if span == nil {
		return
	}
	if span.IsRecording() {
		if outcome == "" {
			outcome = resultOutcome(res)
		}
		span.SetAttributes(attrOutcome.String(outcome))
		if outcome != "ok" {
			span.SetStatus(codes.Error, outcome)
		}
	}
	span.End()
}

func resultOutcome(res *protocol.Result) string {
	switch {
	case res == nil:
		return "no_result"
	case res.Error != nil:
		return string(res.Error.Code)
	case res.IsError:
		return "tool_error"
	}
	return "ok"
}
