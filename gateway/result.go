package gateway

import (
	"context"
	"errors"
	"fmt"

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

func agentErrorText(host string, e *protocol.Error) string {
	switch e.Code {
	case protocol.CodeUnknownCall:
		return fmt.Sprintf("host %s lost track of this call (its agent probably restarted): %s. Check the host's state before retrying a command that changes things.", host, e.Message)
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
