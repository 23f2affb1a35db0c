package protocol

// A call's trace context (W3C Trace Context) travels in two headers of
// every part of the call, named as HTTP names them, so that one trace
// covers the MCP client, the gateway and the agent. They are optional:
// a gateway with tracing off sends neither, and an agent that finds none
// (or malformed ones) starts no trace of its own for the call.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Bounds of the trace headers an agent reads: a traceparent of version
// 00 is 55 bytes; W3C allows a tracestate of 32 members, and receivers
// may drop one longer than 512 bytes.
const (
	MaxTraceParentLen = 128
	MaxTraceStateLen  = 512
)

// SetTrace puts a trace context on the headers of a call part. An empty
// traceparent sets nothing; an empty tracestate is left out.
func SetTrace(h Header, traceparent, tracestate string) {
	if traceparent == "" {
		return
	}
	h[HeaderTraceParent] = []string{traceparent}
	if tracestate != "" {
		h[HeaderTraceState] = []string{tracestate}
	}
}

// Trace returns the trace context of a call part's headers: empty when
// it carries none, or when either header is longer than its bound (the
// context is then ignored, not cut). Parsing the values is the tracer's
// business; they are only bounded here.
func Trace(h Header) (traceparent, tracestate string) {
	traceparent, tracestate = first(h, HeaderTraceParent), first(h, HeaderTraceState)
	if traceparent == "" || len(traceparent) > MaxTraceParentLen || len(tracestate) > MaxTraceStateLen {
		return "", ""
	}
	return traceparent, tracestate
}
