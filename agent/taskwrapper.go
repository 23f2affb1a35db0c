package agent

import "github.com/fleetmcp/fleetmcp/agent/tasks"

// TaskWrapperFlag, as its first argument, makes the agent's executable the
// wrapper of a background task: see RunTaskWrapper.
const TaskWrapperFlag = tasks.WrapperFlag

// RunTaskWrapper runs a background task's wrapper when args, a program's
// arguments with its name first (os.Args), ask for it, and reports
// whether they did (tasks.RunWrapper). fleet-agent calls it first thing
// in main:
//
//	if code, ok := agent.RunTaskWrapper(os.Args); ok {
//		os.Exit(code)
//	}
func RunTaskWrapper(args []string) (int, bool) { return tasks.RunWrapper(args) }
