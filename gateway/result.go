package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is the one place where outcomes become MCP results. The rule:
// anything the model can act on (unknown or offline host, a busy agent, a
// failed command, a file that does not exist) is a tool result with IsError,
// so the model reads it; only a broken request that never reached a tool is
// a JSON-RPC error, and the SDK produces those itself.

// toolResult converts an agent's result.
func toolResult(host string, res *protocol.Result) *mcp.CallToolResult {
	if res.Error != nil {
		return errorResult(agentErrorText(host, res.Error))
	}
	out := &mcp.CallToolResult{IsError: res.IsError}
	for _, c := range res.Content {
		switch c.Type {
		case "image":
			out.Content = append(out.Content, &mcp.ImageContent{Data: c.Data, MIMEType: c.MIMEType})
		default:
			out.Content = append(out.Content, &mcp.TextContent{Text: c.Text})
		}
	}
	if len(out.Content) == 0 {
		out.Content = []mcp.Content{&mcp.TextContent{Text: "(no output)"}}
	}
	if len(res.Structured) > 0 {
		out.StructuredContent = res.Structured
	}
	return out
}

// capResult keeps res, the result of tool on host, within what such a
// result may carry (protocol.ResultTextLimit gives limit): text beyond
// limit is cut, structured content over it dropped, an error message cut
// to protocol.MaxErrorMessage, each with a note saying so. A correct
// agent never needs this; a faulty or compromised one cannot make the
// gateway forward more. It reports whether it changed res.
func capResult(host, tool string, res *protocol.Result, limit int) bool {
	cut := false
	if e := res.Error; e != nil && len(e.Message) > protocol.MaxErrorMessage {
		e.Message = protocol.Clip(e.Message, protocol.MaxErrorMessage) + fmt.Sprintf(" [... the gateway cut this message of %d bytes]", len(e.Message))
		cut = true
	}
	var notes []string
	total, room := 0, limit
	for i := range res.Content {
		c := &res.Content[i]
		if c.Type != "text" {
			continue
		}
		total += len(c.Text)
		c.Text = protocol.Clip(c.Text, room)
		room -= len(c.Text)
	}
	if total > limit {
		res.Content = slices.DeleteFunc(res.Content, func(c protocol.Content) bool { return c.Type == "text" && c.Text == "" })
		notes = append(notes, fmt.Sprintf("%d bytes of text, more than the %d a %s result may carry; the rest was cut", total, limit, tool))
	}
	if len(res.Structured) > limit {
		notes = append(notes, fmt.Sprintf("%d bytes of structured content, more than the %d a %s result may carry; it was dropped", len(res.Structured), limit, tool))
		res.Structured = nil
	}
	if len(notes) > 0 {
		res.Content = append(res.Content, protocol.Text(fmt.Sprintf("\n\n[The fleet gateway received from host %s %s. The host's agent may be faulty.]", host, strings.Join(notes, ", and "))))
		cut = true
	}
	return cut
}

func agentErrorText(host string, e *protocol.Error) string {
	switch e.Code {
	case protocol.CodeUnknownCall:
		return fmt.Sprintf("host %s lost track of this call (its agent probably restarted): %s. Check the host's state before retrying a command that changes things.", host, e.Message)
	case protocol.CodeResultDropped:
		return fmt.Sprintf("%s. The call ran there and is not run again; check the host's state before retrying a command that changes things.", e.Message)
	default:
		return fmt.Sprintf("host %s: %s", host, e.Message)
	}
}

// callError converts a routing failure. A context error means the client
// went away or cancelled; the result is then never read, but the SDK still
// needs one.
func callError(tool, host string, err error) *mcp.CallToolResult {
	var he *HostError
	switch {
	case errors.As(err, &he):
		return errorResult(he.Msg)
	case errors.Is(err, context.Canceled):
		return errorResult(fmt.Sprintf("%s on %s was cancelled", tool, host))
	case errors.Is(err, context.DeadlineExceeded):
		return errorResult(fmt.Sprintf("%s on %s ran out of time", tool, host))
	default:
		return errorResult(fmt.Sprintf("%s on %s failed: %v", tool, host, err))
	}
}

func errorResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}
