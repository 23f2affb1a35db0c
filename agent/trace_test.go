package agent

import (
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestTracingOffCostsNothing: with no tracer provider, what a call does
// for tracing allocates nothing.
func TestTracingOffCostsNothing(t *testing.T) {
	tr := newTracing(nil)
	if tr != nil {
		t.Fatal("newTracing(nil) must be nil: tracing off")
	}
	h := protocol.Header{protocol.HeaderTraceParent: {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	call := &protocol.Call{ID: "c1", Tool: "read"}
	res := &protocol.Result{}
	allocs := testing.AllocsPerRun(200, func() {
		span := tr.startServe(tr.remote(h), call, "a")
		ps := tr.child(span, "fleet.policy", "")
		endPolicy(ps, "allowed", "")
		ts := tr.child(span, "fleet.tool ", call.Tool)
		endSpan(ts, res, "")
		endSpan(span, res, "")
	})
	if allocs != 0 {
		t.Errorf("tracing off: %v allocations per call, want 0", allocs)
	}
}

// A traceparent that is malformed or too long gives no parent: the call
// gets no span rather than a trace of its own.
func TestRemoteTraceContext(t *testing.T) {
	tr := &tracing{}
	for name, h := range map[string]protocol.Header{
		"none":      {},
		"malformed": {protocol.HeaderTraceParent: {"00-zz-00f067aa0ba902b7-01"}},
		"zero":      {protocol.HeaderTraceParent: {"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}},
		"too long":  {protocol.HeaderTraceParent: {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" + string(make([]byte, 100))}},
	} {
		if ctx := tr.remote(h); ctx != nil {
			t.Errorf("%s: remote gave a parent", name)
		}
	}
	if tr.remote(protocol.Header{protocol.HeaderTraceParent: {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}) == nil {
		t.Error("a valid traceparent gave no parent")
	}
}
