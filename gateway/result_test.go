package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// contentSummary renders MCP content as "text:..." and "image:MIME:bytes"
// lines, so tables can compare whole results.
func contentSummary(t *testing.T, cs []mcp.Content) []string {
	t.Helper()
	var out []string
	for _, c := range cs {
		switch c := c.(type) {
		case *mcp.TextContent:
			out = append(out, "text:"+c.Text)
		case *mcp.ImageContent:
			out = append(out, fmt.Sprintf("image:%s:%x", c.MIMEType, c.Data))
		default:
			t.Errorf("unexpected content type %T", c)
		}
	}
	return out
}

func TestToolResult(t *testing.T) {
	png := []byte{0x89, 'P', 'N', 'G', 0, '\n'}
	tests := []struct {
		name       string
		res        protocol.Result
		want       []string
		isError    bool
		structured string // "" means none
	}{
		{
			name: "text",
			res:  protocol.Result{CallID: "c1", Content: []protocol.Content{protocol.Text("hi\n")}},
			want: []string{"text:hi\n"},
		},
		{
			name: "text and image in order",
			res: protocol.Result{CallID: "c1", Content: []protocol.Content{
				protocol.Text("before"), {Type: "image", MIMEType: "image/png", Data: png}, protocol.Text("after"),
			}},
			want: []string{"text:before", fmt.Sprintf("image:image/png:%x", png), "text:after"},
		},
		{
			name:       "structured",
			res:        protocol.Result{CallID: "c1", Content: []protocol.Content{protocol.Text(`{"a":1}`)}, Structured: json.RawMessage(`{"a":1}`)},
			want:       []string{`text:{"a":1}`},
			structured: `{"a":1}`,
		},
		{
			name:    "tool error keeps its content",
			res:     protocol.Result{CallID: "c1", Content: []protocol.Content{protocol.Text("out\n\nCommand exited with code 2")}, IsError: true},
			want:    []string{"text:out\n\nCommand exited with code 2"},
			isError: true,
		},
		{
			name: "empty content",
			res:  protocol.Result{CallID: "c1"},
			want: []string{"text:(no output)"},
		},
		{
			name:    "empty content of a tool error",
			res:     protocol.Result{CallID: "c1", IsError: true},
			want:    []string{"text:(no output)"},
			isError: true,
		},
		{
			name: "empty text is kept as it is",
			res:  protocol.Result{CallID: "c1", Content: []protocol.Content{protocol.Text("")}},
			want: []string{"text:"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := toolResult("web-1", &tc.res)
			if got.IsError != tc.isError {
				t.Errorf("IsError = %v, want %v", got.IsError, tc.isError)
			}
			if s := contentSummary(t, got.Content); strings.Join(s, "\x00") != strings.Join(tc.want, "\x00") {
				t.Errorf("content = %q, want %q", s, tc.want)
			}
			if tc.structured == "" {
				// A typed nil in the interface would be sent as null.
				if got.StructuredContent != nil {
					t.Errorf("StructuredContent = %#v, want none", got.StructuredContent)
				}
				return
			}
			raw, err := json.Marshal(got.StructuredContent)
			if err != nil || string(raw) != tc.structured {
				t.Errorf("StructuredContent marshals to %s (%v), want %s", raw, err, tc.structured)
			}
		})
	}
}

func TestToolResultProtocolError(t *testing.T) {
	tests := []struct {
		name string
		err  protocol.Error
		want []string // substrings of the one text content
	}{
		{"busy", protocol.Error{Code: protocol.CodeBusy, Message: "16 calls running"}, []string{"host web-1", "16 calls running"}},
		{"unknown tool", protocol.Error{Code: protocol.CodeUnknownTool, Message: "no tool frob"}, []string{"web-1", "no tool frob"}},
		{"denied", protocol.Error{Code: protocol.CodeDenied, Message: "path /etc is not allowed"}, []string{"web-1", "path /etc is not allowed"}},
		{"unknown call", protocol.Error{Code: protocol.CodeUnknownCall, Message: "no record of call c1"}, []string{
			"host web-1", "lost track of this call", "restarted", "no record of call c1", "before retrying",
		}},
		{"result dropped", protocol.Error{Code: protocol.CodeResultDropped, Message: "host web-1 ran call c1, but no longer keeps its result"}, []string{
			"host web-1 ran call c1", "no longer keeps its result", "not run again", "before retrying",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Content and Structured sent along with an error are not shown:
			// the call was not carried out.
			res := &protocol.Result{CallID: "c1", Error: &tc.err, Content: []protocol.Content{protocol.Text("partial")}}
			got := toolResult("web-1", res)
			if !got.IsError {
				t.Error("a protocol error is not a tool error")
			}
			s := contentSummary(t, got.Content)
			if len(s) != 1 {
				t.Fatalf("content = %q, want one text", s)
			}
			for _, w := range tc.want {
				if !strings.Contains(s[0], w) {
					t.Errorf("text %q does not contain %q", s[0], w)
				}
			}
			if strings.Contains(s[0], "partial") {
				t.Errorf("text %q shows the content of a failed call", s[0])
			}
			if got.StructuredContent != nil {
				t.Errorf("StructuredContent = %#v on a protocol error", got.StructuredContent)
			}
		})
	}
	other := toolResult("db-2", &protocol.Result{Error: &protocol.Error{Code: protocol.CodeUnknownCall, Message: "x"}})
	if s := contentSummary(t, other.Content); len(s) != 1 || !strings.Contains(s[0], "host db-2") {
		t.Errorf("unknown-call text %q does not name host db-2", s)
	}
}

func TestCallError(t *testing.T) {
	he := &HostError{Host: "web-1", Kind: HostOffline, Msg: `host "web-1" is offline (last seen 1m0s ago); call hosts to see which hosts are online`}
	tests := []struct {
		name string
		err  error
		want string // the exact text
	}{
		{"host error", he, he.Msg},
		{"wrapped host error", fmt.Errorf("dispatch bash to web-1: %w", he), he.Msg},
		{"cancelled", context.Canceled, "bash on web-1 was cancelled"},
		{"wrapped cancelled", fmt.Errorf("wait: %w", context.Canceled), "bash on web-1 was cancelled"},
		{"deadline", context.DeadlineExceeded, "bash on web-1 ran out of time"},
		{"wrapped deadline", fmt.Errorf("wait: %w", context.DeadlineExceeded), "bash on web-1 ran out of time"},
		{"other", errors.New("nats: connection closed"), "bash on web-1 failed: nats: connection closed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := callError("bash", "web-1", tc.err)
			if !got.IsError {
				t.Error("IsError = false, want a tool error")
			}
			s := contentSummary(t, got.Content)
			if len(s) != 1 || s[0] != "text:"+tc.want {
				t.Errorf("content = %q, want %q", s, "text:"+tc.want)
			}
		})
	}
}
