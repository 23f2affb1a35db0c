package protocol

import (
	"strings"
	"testing"
)

func TestTraceHeaders(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	h, _ := Frame{Kind: KindCall, CallID: "c1", Part: 1, Parts: 1}.Encode()
	SetTrace(h, tp, "rojo=00f067aa0ba902b7")
	if p, s := Trace(h); p != tp || s != "rojo=00f067aa0ba902b7" {
		t.Fatalf("Trace = %q, %q", p, s)
	}
	if _, err := DecodeFrame(h, nil); err != nil {
		t.Fatalf("a frame with trace headers: %v", err)
	}

	h, _ = Frame{Kind: KindCall, CallID: "c1", Part: 1, Parts: 1}.Encode()
	SetTrace(h, "", "rojo=1")
	if len(h[HeaderTraceParent])+len(h[HeaderTraceState]) != 0 {
		t.Errorf("no traceparent must set no trace header: %v", h)
	}
	SetTrace(h, tp, "")
	if _, ok := h[HeaderTraceState]; ok {
		t.Errorf("an empty tracestate must be left out: %v", h)
	}

	for name, h := range map[string]Header{
		"none":                 {},
		"state alone":          {HeaderTraceState: {"a=b"}},
		"traceparent too long": {HeaderTraceParent: {strings.Repeat("0", MaxTraceParentLen+1)}},
		"tracestate too long":  {HeaderTraceParent: {tp}, HeaderTraceState: {strings.Repeat("a", MaxTraceStateLen+1)}},
		"other case":           {"Traceparent": {tp}},
	} {
		if p, s := Trace(h); p != "" || s != "" {
			t.Errorf("%s: Trace = %q, %q; want nothing", name, p, s)
		}
	}
}
