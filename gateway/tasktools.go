package gateway

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The task tools follow the background tasks that bash with background:
// true starts. The tasks live on the agents' disks, so a gateway restart
// loses nothing; the gateway only forwards. Access: whoever may use bash
// on a host may use these there (see grantedAs).

type taskStatusIn struct {
	Host   string   `json:"host" jsonschema:"the host the task runs on"`
	TaskID string   `json:"task_id" jsonschema:"the task's ID, as bash with background: true or task_list returned it"`
	Wait   *float64 `json:"wait,omitempty" jsonschema:"seconds to wait for the task to end: default 30, at most 60; 0 answers at once"`
}

type taskCancelIn struct {
	Host   string `json:"host" jsonschema:"the host the task runs on"`
	TaskID string `json:"task_id" jsonschema:"the task's ID"`
}

type taskListIn struct {
	Host  string `json:"host" jsonschema:"the host whose tasks to list"`
	State string `json:"state,omitempty" jsonschema:"only tasks in this state: queued, running, succeeded, failed, timed_out, cancelled or lost"`
	Limit int    `json:"limit,omitempty" jsonschema:"at most this many tasks, newest first: default 20, at most 200"`
}

const (
	descTaskStatus = "State of a background task on a host (started by bash with background: true): queued, running, succeeded, failed, timed_out, cancelled, " +
		"or lost (the agent restarted and the task's process was gone). Waits on the host up to wait seconds (default 30, at most 60; 0 answers at once) " +
		"and returns as soon as the task ends; progress notifications keep the call alive meanwhile. " +
		"The answer has the exit code, start and end times, a note on how it ended, and the path of the task's full output file on the host (readable with read); " +
		"once the task has ended, also the end of its output (last 50 lines, at most 8 KB). The command is shown up to 2000 characters. " +
		"Finished tasks are kept 30 days, at most 1000 and 1 GiB of output per host (host defaults); older ones are removed."
	descTaskCancel = "Cancel a background task on a host: a queued task never starts; a running task's whole process group is killed (SIGKILL) " +
		"and it is recorded as cancelled. Returns the task's final state and the end of its output. A task that has ended already is an error naming its state."
	descTaskList = "List a host's background tasks, newest first: task_id, state (with the exit code), start time, runtime and command (first 80 characters; 200 in the structured content). " +
		"Optional state filter and limit (default 20, at most 200)."
)

// taskWaitMargin is what a task_status call may take beyond its wait
// before the gateway gives up on the host.
const taskWaitMargin = 30 * time.Second

func (g *Gateway) addTaskTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: toolTaskStatus, Description: descTaskStatus, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in taskStatusIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, toolTaskStatus, taskStatusTimeout(in.Wait)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: toolTaskCancel, Description: descTaskCancel},
		func(ctx context.Context, req *mcp.CallToolRequest, in taskCancelIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, toolTaskCancel, g.cfg.FileCallTimeout), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: toolTaskList, Description: descTaskList, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in taskListIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, toolTaskList, g.cfg.FileCallTimeout), nil, nil
		})
}

// taskStatusTimeout bounds a task_status call: its wait (default 30 s, at
// most 60 s; the agent applies the same bounds) plus a margin.
func taskStatusTimeout(wait *float64) time.Duration {
	w := 30 * time.Second
	if wait != nil && *wait >= 0 {
		w = min(time.Duration(*wait*float64(time.Second)), 60*time.Second)
	}
	return w + taskWaitMargin
}
