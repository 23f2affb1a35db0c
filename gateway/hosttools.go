package gateway

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file publishes the per-host tools as protocol declares them —
// name, description, arguments — and forwards their calls. The gateway
// reads only what routing and its budgets need (the host, bash's
// background and cwd, task_status's wait, read's binary_base64); the
// agent decodes the arguments into the same types and checks them
// against the host policy.

// hostCall is how the gateway forwards one call of a per-host tool.
type hostCall struct {
	// timeout bounds the call as a whole.
	timeout time.Duration
	// refused, when set, is the answer: the call does not travel.
	refused *mcp.CallToolResult
}

// hostArgs are the arguments of a per-host tool: a protocol argument
// struct, which embeds protocol.OnHost.
type hostArgs interface{ TargetHost() string }

// addHostTools registers every tool of protocol.HostTools. A declared
// tool this gateway has no way to forward is a programming error: it
// panics, and every test that builds an MCP server says so.
func (g *Gateway) addHostTools(s *mcp.Server) {
	file := g.cfg.FileCallTimeout
	for _, spec := range protocol.HostTools() {
		switch spec.Name {
		case protocol.ToolRead:
			addHostTool(g, s, spec, func(ctx context.Context, in protocol.ReadArgs) hostCall {
				callFrom(ctx).rawData = in.BinaryBase64
				return hostCall{timeout: file}
			})
		case protocol.ToolBash:
			addHostTool(g, s, spec, g.bashCall)
		case protocol.ToolTaskStatus:
			addHostTool(g, s, spec, func(_ context.Context, in protocol.TaskStatusArgs) hostCall {
				return hostCall{timeout: taskStatusTimeout(in.Wait)}
			})
		case protocol.ToolWrite:
			addHostTool(g, s, spec, within[protocol.WriteArgs](file))
		case protocol.ToolEdit:
			addHostTool(g, s, spec, within[protocol.EditArgs](file))
		case protocol.ToolPatch:
			addHostTool(g, s, spec, within[protocol.PatchArgs](file))
		case protocol.ToolSkill:
			addHostTool(g, s, spec, within[protocol.SkillArgs](file))
		case protocol.ToolList:
			addHostTool(g, s, spec, within[protocol.ListArgs](file))
		case protocol.ToolSearch:
			addHostTool(g, s, spec, within[protocol.SearchArgs](file))
		case protocol.ToolDelete:
			addHostTool(g, s, spec, within[protocol.DeleteArgs](file))
		case protocol.ToolMove:
			addHostTool(g, s, spec, within[protocol.MoveArgs](file))
		case protocol.ToolTaskCancel:
			addHostTool(g, s, spec, within[protocol.TaskCancelArgs](file))
		case protocol.ToolTaskList:
			addHostTool(g, s, spec, within[protocol.TaskListArgs](file))
		default:
			panic(fmt.Sprintf("gateway: protocol declares the per-host tool %s, which the gateway does not forward", spec.Name))
		}
	}
}

// addHostTool registers the tool spec declares, whose arguments are In;
// plan decides how each call is forwarded.
func addHostTool[In hostArgs](g *Gateway, s *mcp.Server, spec protocol.ToolSpec, plan func(context.Context, In) hostCall) {
	if got := reflect.TypeFor[In](); got != spec.Args {
		panic(fmt.Sprintf("gateway: tool %s takes %s, registered with %s", spec.Name, spec.Args, got))
	}
	tool := &mcp.Tool{Name: spec.Name, Description: spec.Description, InputSchema: mustInputSchema[In](), Annotations: annotations(spec)}
	mcp.AddTool(s, tool, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		c := plan(ctx, in)
		if c.refused != nil {
			return c.refused, nil, nil
		}
		return g.forward(ctx, req, in.TargetHost(), spec.Name, c.timeout), nil, nil
	})
}

// within forwards every call of a tool with the same budget.
func within[In hostArgs](d time.Duration) func(context.Context, In) hostCall {
	return func(context.Context, In) hostCall { return hostCall{timeout: d} }
}

// annotations are the hints a tool list gives about a tool.
func annotations(spec protocol.ToolSpec) *mcp.ToolAnnotations {
	switch {
	case spec.ReadOnly:
		return &mcp.ToolAnnotations{ReadOnlyHint: true}
	case spec.Destructive:
		destructive := true
		return &mcp.ToolAnnotations{DestructiveHint: &destructive}
	}
	return nil
}

// bashCall refuses bash arguments every agent would refuse, before they
// travel (the agent checks them again), and gives the call its budget: a
// background start is as quick as a file call; otherwise the agent
// enforces the command's own timeout, and the call's budget only bounds a
// host that never answers at all.
func (g *Gateway) bashCall(ctx context.Context, in protocol.BashArgs) hostCall {
	if len(in.Cwd) > protocol.MaxCwdBytes {
		return hostCall{refused: errorResult(fmt.Sprintf("bash: cwd is longer than %d bytes", protocol.MaxCwdBytes))}
	}
	if err := protocol.ValidateScriptParameters(in.Parameters); err != nil {
		return hostCall{refused: errorResult("bash: " + err.Error())}
	}
	if in.Background {
		callFrom(ctx).background = true
		return hostCall{timeout: g.cfg.FileCallTimeout}
	}
	return hostCall{timeout: g.cfg.MaxCallDuration}
}

// taskWaitMargin is what a task_status call may take beyond its wait
// before the gateway gives up on the host.
const taskWaitMargin = 30 * time.Second

// taskStatusTimeout bounds a task_status call: its wait (default
// protocol.TaskWait, at most protocol.TaskMaxWait; the agent applies the
// same bounds) plus a margin.
func taskStatusTimeout(wait *float64) time.Duration {
	w := protocol.TaskWait
	if wait != nil && *wait >= 0 {
		w = min(time.Duration(*wait*float64(time.Second)), protocol.TaskMaxWait)
	}
	return w + taskWaitMargin
}
