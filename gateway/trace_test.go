package gateway

import (
	"context"
	"errors"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// TestTracingOffCostsNothing: with no tracer provider, what a call does
// for tracing allocates nothing and sends no trace header.
func TestTracingOffCostsNothing(t *testing.T) {
	tr := newTracing(nil)
	if tr != nil {
		t.Fatal("newTracing(nil) must be nil: tracing off")
	}
	req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: "read", Meta: mcp.Meta{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}
	rec := &audit.Record{Tool: "read", CallID: "c1", Outcome: audit.OutcomeOK, Hosts: []string{"a"}}
	creq := &callRequest{ID: "c1", Tool: "read", Host: "a"}
	h, _ := protocol.Frame{Kind: protocol.KindCall, CallID: "c1", Part: 1, Parts: 1}.Encode()
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		c, span := tr.startCall(ctx, req)
		_, hs, tc := tr.startHostCall(c, creq)
		p, s := traceHeaders(tc)
		protocol.SetTrace(h, p, s)
		endHostCall(hs, nil, nil)
		endCall(span, rec)
	})
	if allocs != 0 {
		t.Errorf("tracing off: %v allocations per call, want 0", allocs)
	}
	if _, ok := h[protocol.HeaderTraceParent]; ok {
		t.Errorf("tracing off sent a trace header: %v", h)
	}
}

func TestHostCallOutcome(t *testing.T) {
	for _, tc := range []struct {
		res  *protocol.Result
		err  error
		want string
	}{
		{res: &protocol.Result{}, want: "ok"},
		{res: &protocol.Result{IsError: true}, want: "tool_error"},
		{res: protocol.ErrorResult("c", protocol.CodeDenied, "no"), want: "denied"},
		{err: &HostError{Kind: HostOffline}, want: "offline"},
		{err: &HostError{Kind: HostTimeout}, want: "timed_out"},
		{err: &HostError{Kind: HostGone}, want: "not_connected"},
		{err: context.Canceled, want: "cancelled"},
		{err: errors.New("x"), want: "error"},
	} {
		if got := hostCallOutcome(tc.res, tc.err); got != tc.want {
			t.Errorf("hostCallOutcome(%+v, %v) = %q, want %q", tc.res, tc.err, got, tc.want)
		}
	}
}
